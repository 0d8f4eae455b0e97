"""WeightScheme: how a quantized checkpoint stores its linears' weights, read from its config
(checkpoint.py), so that the stored form of every weight is known from shapes alone
(compiling ahead of time, the memory plan) and the methods know what they multiply.

Every format the engine keeps is one form: integer (or fp8) values in the weight's [in, *out]
layout, a float scale per group of `group_size` input features and output channel (0: one
group, per channel), and where the format is asymmetric a zero point beside each scale:
w = (q - zero) * scale. A 128x128 fp8 block scale is that with groups of 128, each block's
scale repeated for its 128 output channels; a per-tensor scale is repeated for every channel.
"""
from __future__ import annotations

from dataclasses import dataclass

# The values' types as stored on device: AWQ's and GPTQ's unsigned nibbles, compressed-tensors'
# signed ones; GGUF's 5- and 6-bit values widen to a byte.
QTYPES = ("int4", "uint4", "int8", "uint8", "float8_e4m3fn")
BITS = {"int4": 4, "uint4": 4, "int8": 8, "uint8": 8, "float8_e4m3fn": 8}


@dataclass(frozen=True)
class WeightScheme:
    qtype: str = "int8"
    """The stored values' type (QTYPES)."""
    group_size: int = 0
    """Input features per scale; 0: one scale per output channel."""
    zero_point: bool = False
    """Asymmetric: a zero point beside each scale."""
    act_order: bool = False
    """GPTQ's desc_act (compressed-tensors' actorder): the input rows' groups follow a g_idx;
    kept sorted by group, the activations gathered into the same order."""
    input_dtype: str | None = None
    """"int8": activations quantized per token on the fly, int8 x int8 dots (W8A8)."""

    def __post_init__(self):
        if self.qtype not in QTYPES:
            raise ValueError(f"WeightScheme.qtype must be one of {QTYPES}, got {self.qtype!r}.")
        if self.group_size < 0:
            raise ValueError(f"WeightScheme.group_size must be >= 0 (0: per channel), got {self.group_size}.")

    @property
    def bits(self) -> int:
        return BITS[self.qtype]

    def groups(self, in_features: int, key: str = "weight") -> int:
        """Scales along the input axis of a weight of in_features."""
        if not self.group_size:
            return 1
        if in_features % self.group_size:
            raise ValueError(f"{key}: {in_features} input features are not a whole number of groups of "
                             f"group_size={self.group_size}.")
        return in_features // self.group_size
