"""Building blocks of the model: norms, rotary embedding, the attention layer, the MLP."""

__lesson__ = 1

from minisgl.layers.norm import RMSNorm
from minisgl.layers.rotary import RotaryEmbedding

__all__ = ["RMSNorm", "RotaryEmbedding"]
