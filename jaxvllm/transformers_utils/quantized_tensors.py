"""A quantized safetensors checkpoint's tensors paired into one QuantizedWeight per linear,
by the names and packings of its format (config.json's `quantization_config`; the formats are
described in jaxvllm/layers/quantization/): values unpacked from their int32 words, never
dequantized.

- `X.weight` (8-bit) with `X.weight_scale` (compressed-tensors; fp8 per tensor) or
  `X.weight_scale_inv` (fp8 blocks);
- `X.weight_packed` with `X.weight_scale`, `X.weight_shape` (+ `X.weight_zero_point`,
  `X.weight_g_idx`): compressed-tensors `pack-quantized`;
- `X.qweight` with `X.qzeros`, `X.scales` (+ `X.g_idx`): AWQ or GPTQ, by quant_method.
Each becomes `X.weight`, the name the model's weight spec reads. `X.input_scale` (static
activation scales) is dropped: activations are not read at a fixed scale.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from jaxvllm.transformers_utils.quantized_weight import QuantizedWeight

EIGHT_BIT = (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(np.int8))
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # output column of each nibble (layers/quantization/awq.py)


def unpack_int32(packed: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Each int32 word's 32/bits values, lowest bits first, laid out consecutively along axis."""
    n, words = 32 // bits, packed.astype(np.int32).view(np.uint32)
    shifts = (np.arange(n, dtype=np.uint32) * bits).reshape([-1 if a == axis + 1 else 1
                                                             for a in range(packed.ndim + 1)])
    values = (np.expand_dims(words, axis + 1) >> shifts) & np.uint32((1 << bits) - 1)
    shape = list(packed.shape)
    shape[axis] *= n
    return values.reshape(shape)


def pair_quantized(weights: dict[str, np.ndarray], qc: dict | None) -> dict:
    """weights with each quantized linear's tensors as one QuantizedWeight under `X.weight`."""
    method = (qc or {}).get("quant_method")
    for key in [k for k in weights if k.endswith(".input_scale")]:
        del weights[key]
    if method in ("awq", "gptq"):
        for key in [k for k in weights if k.endswith(".qweight")]:
            base = key.removesuffix("qweight")
            parts = {n: _pop(weights, base + n, key) for n in ("qweight", "qzeros", "scales")}
            g_idx = weights.pop(base + "g_idx", None)
            reader = _awq if method == "awq" else _gptq
            weights[base + "weight"] = reader(base + "weight", qc, g_idx=g_idx, **parts)
    for key in [k for k in weights if k.endswith(".weight_packed")]:
        base = key.removesuffix("weight_packed")
        weights[base + "weight"] = _pack_quantized(base + "weight", weights, base, _pop(weights, key, key))
    block = _block(qc or {})
    for key in [k for k in weights if k.endswith((".weight_scale", ".weight_scale_inv"))]:
        base = key.rsplit(".", 1)[0] + ".weight"
        if base not in weights or getattr(weights[base], "dtype", None) not in EIGHT_BIT:
            raise ValueError(f"Checkpoint tensor {key!r} scales no 8-bit tensor {base!r}.")
        scale = weights.pop(key)
        weights[base] = QuantizedWeight.from_checkpoint(
            base, weights[base], scale, block=block if scale.ndim == 2 and scale.size > 1 and block else None)
    for key, w in weights.items():
        if isinstance(w, np.ndarray) and w.dtype in EIGHT_BIT:
            raise ValueError(f"Checkpoint tensor {key!r} is stored in {w.dtype} without a {key}_scale.")
    return weights


def _pop(weights: dict, key: str, of: str) -> np.ndarray:
    if key not in weights:
        raise ValueError(f"Checkpoint is missing tensor {key!r} (beside {of!r}).")
    return weights.pop(key)


def _block(qc: dict) -> tuple[int, int] | None:
    """The [out, in] block of block-scaled fp8 weights (fp8's weight_block_size,
    compressed-tensors' block_structure), None for other formats."""
    if qc.get("weight_block_size"):
        return tuple(qc["weight_block_size"])
    for group in (qc.get("config_groups") or {}).values():
        if (group.get("weights") or {}).get("strategy") == "block":
            return tuple(group["weights"]["block_structure"])
    return None


def _awq(key: str, qc: dict, qweight, qzeros, scales, g_idx=None) -> QuantizedWeight:
    """qweight [in, out/8], qzeros [groups, out/8], scales [groups, out]: uint4 values."""
    order = np.argsort(AWQ_PACK_ORDER)  # nibble holding each output column of a word

    def columns(packed):
        nibbles = unpack_int32(packed, 4, axis=1).reshape(*packed.shape, 8)
        return nibbles[..., order].reshape(packed.shape[0], -1).astype(np.uint8)

    return QuantizedWeight.from_checkpoint(key, columns(qweight).T, np.asarray(scales, np.float32).T,
                                           qtype="uint4", zero=columns(qzeros).T.astype(np.float32))


def _gptq(key: str, qc: dict, qweight, qzeros, scales, g_idx=None) -> QuantizedWeight:
    """qweight [in * bits / 32, out], qzeros [groups, out * bits / 32], scales [groups, out]."""
    bits = qc["bits"]
    q = unpack_int32(qweight, bits, axis=0)
    zero = unpack_int32(qzeros, bits, axis=1).astype(np.float32) + (qc.get("checkpoint_format") != "gptq_v2")
    scale = np.asarray(scales, np.float32)
    if g_idx is not None and scale.shape[0] > 1:
        g_idx = np.asarray(g_idx)
        if np.array_equal(g_idx, np.arange(q.shape[0]) // (q.shape[0] // scale.shape[0])):
            g_idx = None  # groups in row order: no act order
    else:
        g_idx = None
    if qc.get("sym", True):
        mid = 1 << (bits - 1)
        if np.any(zero != mid):
            raise ValueError(f"{key}: quantization_config.sym=True, but its qzeros are not all {mid}.")
        signed = (q.astype(np.int16) - mid).astype(np.int8)
        return QuantizedWeight.from_checkpoint(key, signed.T, scale.T, qtype=f"int{bits}", g_idx=g_idx)
    return QuantizedWeight.from_checkpoint(key, q.astype(np.uint8).T, scale.T, qtype=f"uint{bits}", zero=zero.T,
                                           g_idx=g_idx)


def _pack_quantized(key: str, weights: dict, base: str, packed: np.ndarray) -> QuantizedWeight:
    """compressed-tensors `pack-quantized`: values + 2^(bits-1) packed along the input axis."""
    out, k = (int(n) for n in _pop(weights, base + "weight_shape", key))
    scale = _pop(weights, base + "weight_scale", key)
    bits = _packed_bits(key, packed, out, k)
    mid = 1 << (bits - 1)
    q = (unpack_int32(packed, bits, axis=1)[:, :k].astype(np.int16) - mid).astype(np.int8)
    zero = weights.pop(base + "weight_zero_point", None)
    if zero is not None and zero.dtype == np.int32 and bits < 8:  # asymmetric: packed along the output axis
        zero = unpack_int32(zero, bits, axis=0)[:out].astype(np.float32) - mid
    if zero is not None and not np.any(zero):
        zero = None  # a symmetric checkpoint's zeros
    return QuantizedWeight.from_checkpoint(key, q, scale, qtype=f"int{bits}", zero=zero,
                                           g_idx=weights.pop(base + "weight_g_idx", None))


def _packed_bits(key: str, packed: np.ndarray, out: int, k: int) -> int:
    for bits in (4, 8):
        if packed.shape == (out, -(-k // (32 // bits))):
            return bits
    raise ValueError(f"Tensor {key}_packed of shape {packed.shape} holds neither 4- nor 8-bit values of a "
                     f"[{out}, {k}] weight.")
