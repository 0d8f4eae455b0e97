"""QuantizationConfig: which method stores and runs each named layer (vLLM's
`QuantizationConfig.get_quant_method(layer, prefix)`). A model asks it once per linear
weight and once per expert stack, by the parameter's path ('layers.3.qkv_proj'); a layer the
config ignores stays in float, and an adapter (LoRA) will attach at the same seam."""
from __future__ import annotations

import re

from jaxvllm.layers.fused_moe import UnquantizedFusedMoEMethod
from jaxvllm.layers.linear import UnquantizedLinearMethod

# What a declared weight is (models/weight_spec.Weight.kind): a linear's, stored and run by its
# linear method; a stack of experts, by the MoE method; anything else, stored as loaded.
LINEAR, EXPERTS, OTHER = "linear", "experts", "other"


class QuantizationConfig:
    def __init__(self, linear_method=None, moe_method=None, ignore: tuple[str, ...] = ()):
        """linear_method / moe_method: the backend's for the engine's `quantization` (default
        XLA's float ones); ignore: paths ('lm_head', 'layers.0.qkv_proj') or 're:' patterns
        (as a compressed-tensors ignore list writes them) whose linears stay float."""
        self.linear_method = linear_method or UnquantizedLinearMethod()
        self.moe_method = moe_method or UnquantizedFusedMoEMethod()
        # The linears the method's checkpoint format leaves in float (its head) are ignored too.
        self.ignore = tuple(ignore) + getattr(self.linear_method, "float_layers", ())
        self.float_method = UnquantizedLinearMethod()

    def is_ignored(self, prefix: str) -> bool:
        return any(re.fullmatch(p[3:], prefix) if p.startswith("re:") else p == prefix for p in self.ignore)

    def get_quant_method(self, layer, prefix: str):
        """The method of the weight at `prefix` (layer: its models/weight_spec.Weight): the MoE
        method for experts, the linear method (or float, where ignored) for a linear, None for
        the rest (stored as loaded)."""
        if layer.kind == EXPERTS:
            return self.moe_method
        if layer.kind == LINEAR:
            return self.float_method if self.is_ignored(prefix) else self.linear_method
        return None
