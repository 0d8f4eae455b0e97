"""AutoAWQ checkpoints (`quant_method: "awq"`, version "gemm"), read from config.json's
`quantization_config` (no JAX here).

Each quantized linear is `qweight` int32 [in, out/8]: eight 4-bit values of one input row
per word, the word's nibbles holding output columns 0, 2, 4, 6, 1, 3, 5, 7 of its eight;
`qzeros` int32 [in/group, out/8] packed alike; `scales` [in/group, out]. The weight is
(q - zero) * scale, with q and zero in 0..15.
"""
from __future__ import annotations

from jaxvllm.layers.quantization.scheme import WeightScheme

# Output column of each nibble of a packed word (AutoAWQ's order for its GEMM kernel).
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def parse(qc: dict) -> WeightScheme:
    bits = qc.get("bits", qc.get("w_bit"))
    group = qc.get("group_size", qc.get("q_group_size"))
    version = str(qc.get("version", "gemm")).lower()
    if bits != 4:
        raise ValueError(f"quantization_config.bits={bits}; AWQ checkpoints load at 4 bits.")
    if version != "gemm":
        raise ValueError(f"quantization_config.version={version!r}; AWQ's 'gemm' packing loads.")
    if not qc.get("zero_point", True):
        raise ValueError("quantization_config.zero_point=False; AWQ checkpoints with zero points load.")
    if not isinstance(group, int) or group == 0 or group < -1:
        raise ValueError(f"quantization_config.group_size={group}; a positive size (or -1, per channel) loads.")
    return WeightScheme("uint4", max(group, 0), zero_point=True)
