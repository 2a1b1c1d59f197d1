"""The reports stage: a study's rows as tables, Markdown blocks and figures.

:mod:`.tables`: perplexity and passkeys; :mod:`.tasks`: task scores, effective lengths, the
needle heatmap's data; :mod:`.summary`: several studies on one screen; :mod:`.compare`: two runs'
answers to the same cells, paired; :mod:`.longppl`: key-token perplexity; :mod:`.figures`:
which figure a report draws (the renderers are :mod:`posenc.plots`); :mod:`.commands`: what
``posenc extend report``, ``compare`` and ``summary`` print or write.

Every number is read from the rows (:mod:`posenc.extend.study.rows`); nothing is computed that
they do not hold. May import the study's rows and folder checks, the measures' scoring and
effective lengths, the methods' names; never a model or a forward.
"""
