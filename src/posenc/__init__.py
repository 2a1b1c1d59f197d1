"""posenc: Transformer positional encodings, exact to the models that use them, and a lab."""

# Importing a family registers its encodings in posenc.registry (registered beside each family).
from . import absolute, bias, relative, rotary  # noqa: F401
from .attention import Attention, KVCache
from .model import ModelConfig, TransformerLM
from .registry import build, names

# The one place the version is set: pyproject.toml reads it ([tool.setuptools.dynamic]).
__version__ = "0.1.0"

__all__ = ["Attention", "KVCache", "ModelConfig", "TransformerLM", "__version__", "build", "names"]
