"""posenc: Transformer positional encodings, exact to the models that use them, and a lab."""

from .attention import Attention, KVCache
from .model import ModelConfig, TransformerLM
from .registry import build, names

__version__ = "0.1.0"

__all__ = ["Attention", "KVCache", "ModelConfig", "TransformerLM", "__version__", "build", "names"]
