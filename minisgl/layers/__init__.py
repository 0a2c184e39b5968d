"""Building blocks of the model: norms, rotary embedding, the attention layer, the MLP."""

from minisgl.layers.norm import RMSNorm
from minisgl.layers.rotary import RotaryEmbedding

__all__ = ["RMSNorm", "RotaryEmbedding"]
