"""A checkpoint's own quantization, read from config.json's `quantization_config` (or a
.gguf file), and the engine's `quantization` resolved against it (no JAX here: the front end
resolves it). vLLM's rule: the user may name the checkpoint's method, never another one.
"""
from __future__ import annotations

from jaxvllm.layers.quantization import awq, compressed_tensors, fp8, gptq
from jaxvllm.layers.quantization.scheme import WeightScheme

# quant_method -> its parser (config dict -> WeightScheme)
_PARSERS = {"fp8": fp8.parse, "compressed-tensors": compressed_tensors.parse, "awq": awq.parse, "gptq": gptq.parse}
GGUF = "gguf"


def checkpoint_quantization(hf_config) -> tuple[str, WeightScheme] | None:
    """(method, weight scheme) of a quantized checkpoint, None for a float one; any other
    quantization_config is an error naming what is not supported."""
    qc = getattr(hf_config, "quantization_config", None)
    if qc is None:
        return None
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    method = qc.get("quant_method")
    if method not in _PARSERS:
        raise ValueError(f"quantization_config.quant_method={method!r} is not supported; quantized checkpoints "
                         f"load in {sorted(_PARSERS)} (or a .gguf file).")
    return method, _PARSERS[method](qc)


def resolve_quantization(requested: str | None, hf_config, gguf: bool = False) -> tuple[str | None,
                                                                                          WeightScheme | None]:
    """(the engine's `quantization`, the checkpoint's weight scheme or None). A quantized
    checkpoint's method is the engine's (naming it is allowed, naming another refused); a
    float one takes what was requested, quantized at load (int8, fp8). gguf: the checkpoint is
    a .gguf file, whose blocks load kept quantized with quantization='gguf' (each tensor's
    type is its own: no single scheme)."""
    stored = checkpoint_quantization(hf_config)
    if requested == GGUF and not gguf:
        raise ValueError("quantization='gguf' needs a .gguf model file.")
    if stored is None:
        if requested in _PARSERS.keys() - {"fp8"}:
            raise ValueError(f"quantization={requested!r} needs a checkpoint whose config.json has a "
                             f"quantization_config; this one is in float.")
        return requested, None
    method, scheme = stored
    if requested not in (None, method):
        raise ValueError(f"quantization={requested!r} contradicts the checkpoint, which is quantized "
                         f"({method!r} in its config.json); leave quantization unset to load it as stored.")
    return method, scheme
