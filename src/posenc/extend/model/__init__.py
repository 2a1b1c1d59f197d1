"""The model stage: the user's causal LM as a study receives it.

:mod:`.load` resolves a folder, a ``.gguf`` file or a cached model id to a
:class:`~.load.ModelSource` and loads it (dtype, device, device map), and reads what the
others need of it (trained length, rotated pairs, identity); :mod:`.packaged` names the real
models that install from the package registry (``smollm2``, ``gemma3-270m``);
:mod:`.remote_code` refuses a folder whose configuration would run code of its own.

May import: :mod:`posenc.hf`, :mod:`posenc.runs`; no other stage of ``extend``. A new way to
obtain a model is a file here.
"""
