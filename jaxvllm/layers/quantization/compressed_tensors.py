"""llm-compressor's `compressed-tensors` checkpoints (what vLLM users serve as *-FP8-dynamic,
*-W8A8, *-W4A16): which ones load, read from config.json's `quantization_config` (no JAX
here: the front end resolves the engine's `quantization` with it).

- `float-quantized` (F8_E4M3) / `int-quantized`, `naive-quantized` (I8): each linear's
  `weight` in 8 bits beside its `weight_scale` ([out, 1] per channel, one value per tensor,
  [out/128, in/128] for the `block` strategy), symmetric. Activations quantized too (W8A8) are
  read as int8 per token on the fly where the checkpoint asks for int8 activations; fp8
  activations and a static `input_scale` are not read (the weights run weight-only).
- `pack-quantized` (W4A16, W8A16): `weight_packed` int32, eight 4-bit (four 8-bit) values per
  word along the input axis, each stored + 2^(bits-1); `weight_scale` [out, groups];
  asymmetric ones a `weight_zero_point` packed the same way along the output axis; with
  `actorder`, a `weight_g_idx`.
The `ignore` list names the linears left in float (`lm_head` always).
"""
from __future__ import annotations

from jaxvllm.layers.quantization.scheme import WeightScheme

QUANT_METHOD = "compressed-tensors"
# format -> the weights' `type` and the bits it stores
_FORMATS = {"float-quantized": ("float", (8,)), "int-quantized": ("int", (8,)), "naive-quantized": ("int", (8,)),
            "pack-quantized": ("int", (4, 8))}
_STRATEGIES = {"channel": "", "tensor": "", "group": "group_size", "block": "block_structure"}


def parse(qc: dict) -> WeightScheme:
    """The one weight scheme of the checkpoint's config groups; a field that does not load is
    an error naming it."""
    schemes = {_group_scheme(f"quantization_config.config_groups.{name}", group, qc.get("format"))
               for name, group in (qc.get("config_groups") or {}).items()}
    if len(schemes) != 1:
        raise ValueError(f"quantization_config.config_groups: {len(schemes)} different weight schemes; "
                         f"checkpoints with one scheme for every quantized linear load.")
    return schemes.pop()


def _group_scheme(where: str, group: dict, default_format: str | None) -> WeightScheme:
    fmt = group.get("format") or default_format
    w = group.get("weights") or {}
    if fmt not in _FORMATS:
        raise ValueError(f"{where}: format {fmt!r} is not supported; one of {sorted(_FORMATS)}.")
    kind, bits = _FORMATS[fmt]
    if w.get("num_bits") not in bits or w.get("type") != kind:
        raise ValueError(f"{where}.weights: num_bits={w.get('num_bits')}, type={w.get('type')!r}; format "
                         f"{fmt!r} loads num_bits in {bits}, type={kind!r}.")
    strategy = w.get("strategy")
    if strategy not in _STRATEGIES:
        raise ValueError(f"{where}.weights: strategy={strategy!r}; one of {sorted(_STRATEGIES)} loads.")
    symmetric = w.get("symmetric", True)
    if not symmetric and fmt != "pack-quantized":
        raise ValueError(f"{where}.weights: symmetric=False; format {fmt!r} loads symmetric weights "
                         f"(asymmetric ones in 'pack-quantized').")
    group_size = 0
    if strategy == "group":
        group_size = int(w.get("group_size") or 0)
        if group_size <= 0:
            raise ValueError(f"{where}.weights: strategy='group' needs group_size > 0, got {w.get('group_size')}.")
    elif strategy == "block":
        block = list(w.get("block_structure") or ())
        if kind != "float" or len(block) != 2:
            raise ValueError(f"{where}.weights: strategy='block' loads fp8 weights with a two-entry "
                             f"block_structure, got {kind!r}, {block}.")
        group_size = int(block[1])
    actorder = w.get("actorder")
    if actorder not in (None, "group", "weight", "static", False):
        raise ValueError(f"{where}.weights: actorder={actorder!r} is not supported.")
    qtype = "float8_e4m3fn" if kind == "float" else f"int{w['num_bits']}"
    return WeightScheme(qtype, group_size, zero_point=not symmetric, act_order=actorder == "group",
                        input_dtype=_input_dtype(where, group.get("input_activations")))


def _input_dtype(where: str, act: dict | None) -> str | None:
    """int8 activations quantized per token on the fly (W8A8), where the checkpoint's scheme
    quantizes them to int8; fp8 ones are left in the model's dtype (weight-only)."""
    if not act or act.get("type") != "int":
        return None
    if act.get("num_bits") != 8 or not act.get("symmetric", True):
        raise ValueError(f"{where}.input_activations: num_bits={act.get('num_bits')}, symmetric="
                         f"{act.get('symmetric', True)}; symmetric 8-bit int activations load.")
    return "int8"
