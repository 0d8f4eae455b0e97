"""Pre-quantized checkpoints: which ones load, read from config.json's `quantization_config`
(no JAX here: the front end resolves the engine's `quantization` with it).

vLLM users' 8-bit checkpoints are llm-compressor's `compressed-tensors` format: each quantized
linear's `weight` stored in 8 bits (F8_E4M3 for `float-quantized`, I8 for `int-quantized` /
`naive-quantized`) beside its `weight_scale` (float32 or bfloat16; `[out, 1]` for the
`channel` strategy, one value for `tensor`), symmetric; the `ignore` list names the linears
left in float (`lm_head` always). jaxvllm runs them weight-only (vLLM's W8A16): a
`input_scale` (a static activation scale, for w8a8 kernels) is not needed and not read. The
tensors are paired in models/loader.py and kept as they are stored (transformers_utils/quantized_weight.py).
"""
from __future__ import annotations

from jaxvllm.layers.quantization import QUANTIZATION_METHODS

QUANT_METHOD = QUANTIZATION_METHODS[-1]  # "compressed-tensors"
# format -> the weights' `type`; 8 bits, symmetric.
_FORMATS = {"float-quantized": "float", "int-quantized": "int", "naive-quantized": "int"}
_STRATEGIES = ("channel", "tensor")


def checkpoint_quantization(hf_config) -> str | None:
    """"compressed-tensors" for a checkpoint in a format that loads, None for a float one; any
    other quantization_config is an error naming what is not supported."""
    qc = getattr(hf_config, "quantization_config", None)
    if qc is None:
        return None
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    method = qc.get("quant_method")
    if method != QUANT_METHOD:
        raise ValueError(f"quantization_config.quant_method={method!r} is not supported; pre-quantized "
                         f"checkpoints load in the {QUANT_METHOD!r} format (8-bit weights).")
    for name, group in qc.get("config_groups", {}).items():
        fmt = group.get("format") or qc.get("format")
        w = group.get("weights") or {}
        where = f"quantization_config.config_groups.{name}"
        if fmt not in _FORMATS:
            raise ValueError(f"{where}: format {fmt!r} is not supported; one of {sorted(_FORMATS)}.")
        if w.get("num_bits") != 8 or w.get("type") != _FORMATS[fmt]:
            raise ValueError(f"{where}.weights: num_bits={w.get('num_bits')}, type={w.get('type')!r}; "
                             f"format {fmt!r} loads num_bits=8, type={_FORMATS[fmt]!r}.")
        if w.get("strategy") not in _STRATEGIES or not w.get("symmetric", True):
            raise ValueError(f"{where}.weights: strategy={w.get('strategy')!r}, symmetric="
                             f"{w.get('symmetric', True)}; symmetric {' or '.join(_STRATEGIES)} scales load.")
    return QUANT_METHOD


def resolve_quantization(requested: str | None, hf_config) -> str | None:
    """The engine's `quantization`: the checkpoint's where it has one (the user may name it,
    as in vLLM, but not ask for another), else what was requested."""
    stored = checkpoint_quantization(hf_config)
    if stored is None:
        if requested == QUANT_METHOD:
            raise ValueError(f"quantization={QUANT_METHOD!r} needs a checkpoint whose config.json has a "
                             f"quantization_config; this one is in float.")
        return requested
    if requested not in (None, stored):
        raise ValueError(f"quantization={requested!r} contradicts the checkpoint, which is quantized "
                         f"({stored!r} in its config.json); leave quantization unset to load it as stored.")
    return stored
