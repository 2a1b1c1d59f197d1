"""The study stage: the grid of cells a ``posenc extend`` run measures, and its folder.

:mod:`.config` is what a study asks (:class:`~.config.StudyConfig`) and the cells it makes;
:mod:`.options` turns the command's options into one, checked; :mod:`.run` measures each cell
with its method in place and appends its row; :mod:`.folder` keeps one study per folder under
its lock; :mod:`.rows` reads the rows by one schema; :mod:`.estimate` and :mod:`.dry_run` price a
study before it runs; :mod:`.longppl_cells` are LongPPL's cells; :mod:`.command` is the whole
``posenc extend MODEL`` run (load, check, fine-tune, dry run or study, tables);
:mod:`.export` writes a study's chosen method as a model folder.

May import every stage before it (model, methods, measures) and :mod:`posenc.runs`; the
reports only to print a finished study's tables.
"""
