"""`quant_method: "fp8"` checkpoints (Qwen3-*-FP8, DeepSeek-V3/R1, Kimi K2, and vLLM's own
serialized fp8), read from config.json's `quantization_config` (no JAX here).

Each quantized linear's `weight` is F8_E4M3 [out, in]. With `weight_block_size` [128, 128]
its scale is `weight_scale_inv` [out/128, in/128] (one per 128x128 block; despite the name,
the dequantized weight is value * scale_inv); without it, `weight_scale` holds one value per
tensor. Activations (`activation_scheme` dynamic or static) stay in the model's dtype: the
weights run weight-only, and a static `input_scale` is not read. `ignored_layers` /
`modules_to_not_convert` are stored in float and load so.
"""
from __future__ import annotations

from jaxvllm.layers.quantization.scheme import WeightScheme


def parse(qc: dict) -> WeightScheme:
    if qc.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"quantization_config.fmt={qc.get('fmt')!r}; fp8 checkpoints load in 'e4m3'.")
    block = qc.get("weight_block_size")
    if block is None:
        return WeightScheme("float8_e4m3fn")
    if len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block):
        raise ValueError(f"quantization_config.weight_block_size={block}; two positive sizes [out, in] load.")
    return WeightScheme("float8_e4m3fn", group_size=block[1])
