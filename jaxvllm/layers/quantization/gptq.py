"""AutoGPTQ / GPTQModel checkpoints (`quant_method: "gptq"`), read from config.json's
`quantization_config` (no JAX here).

Each quantized linear is `qweight` int32 [in * bits / 32, out]: 32 / bits values of
consecutive input rows per word, lowest bits first; `qzeros` int32 [groups, out * bits / 32]
packed alike along the output axis, stored minus one (`checkpoint_format` "gptq"; "gptq_v2"
stores them as they are); `scales` [groups, out]; `g_idx` int32 [in], each input row's group
(with `desc_act` the rows' groups follow the activation order, not the row order). The weight
is (q - zero) * scale. A symmetric checkpoint's zero points are all 2^(bits-1): its values
load signed (q - 2^(bits-1)) with no zero points.
"""
from __future__ import annotations

from jaxvllm.layers.quantization.scheme import WeightScheme


def parse(qc: dict) -> WeightScheme:
    bits, group = qc.get("bits"), qc.get("group_size", -1)
    if bits not in (4, 8):
        raise ValueError(f"quantization_config.bits={bits}; GPTQ checkpoints load at 4 or 8 bits.")
    if not isinstance(group, int) or group == 0 or group < -1:
        raise ValueError(f"quantization_config.group_size={group}; a positive size (or -1, per channel) loads.")
    if qc.get("checkpoint_format", "gptq") not in ("gptq", "gptq_v2"):
        raise ValueError(f"quantization_config.checkpoint_format={qc.get('checkpoint_format')!r}; "
                         f"'gptq' or 'gptq_v2' packing loads.")
    if qc.get("lm_head"):
        raise ValueError("quantization_config.lm_head=True; GPTQ checkpoints with a float head load.")
    if qc.get("dynamic"):
        raise ValueError("quantization_config.dynamic: per-module overrides are not supported.")
    sym = qc.get("sym", True)
    qtype = (f"int{bits}" if sym else f"uint{bits}")
    return WeightScheme(qtype, max(group, 0), zero_point=not sym, act_order=bool(qc.get("desc_act")) and group > 0)
