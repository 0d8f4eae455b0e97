"""A GGUF tensor's quantized blocks (llama.cpp's ggml-common.h layouts) as a QuantizedWeight:
each block's integer values, and its scale (and minimum, as a zero point) per group of input
features, never dequantized to float.

- Q4_0: 32 values, an f16 scale d, 16 bytes of nibbles (value j low, j + 16 high): (q - 8) d.
- Q4_1: 32 values, d and a minimum m (f16), nibbles as Q4_0: q d + m.
- Q5_0: 32 values, d, 4 bytes of fifth bits (bit j for value j), nibbles as Q4_0: (q - 16) d.
- Q5_1: as Q5_0 with a minimum m after d: q d + m.
- Q8_0: 32 values, d, 32 int8: q d.
- Q4_K: 256 values in 8 groups of 32: d and dmin (f16), 12 bytes holding each group's 6-bit
  scale and minimum, 128 bytes of nibbles (groups 2i and 2i + 1 in the low and high nibbles of
  bytes 32i..32i + 31): q d sc - dmin m.
- Q5_K: as Q4_K, with a fifth bit per value from 32 bytes of high bits (bit 2i and 2i + 1 of
  byte l for value l of groups 2i and 2i + 1): q in 0..31.
- Q6_K: 256 values in 16 groups of 16: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16
  int8 group scales, d: (q - 32) d sc.
A minimum becomes a zero point, m = -zero * scale; a group whose scale is 0 (every value equal
to its minimum) is stored as values 0, scale 1, zero -m: the same weights.
"""
from __future__ import annotations

import gguf
import numpy as np

from jaxvllm.transformers_utils.quantized_weight import QuantizedWeight

Q = gguf.GGMLQuantizationType
KEPT = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)[..., 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] values: the low nibbles, then the high ones."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=-1)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes -> 8 6-bit scales and 8 6-bit minimums per block."""
    s = s.astype(np.uint8)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc.astype(np.float32), m.astype(np.float32)


def _k_low(qs: np.ndarray) -> np.ndarray:
    """[blocks, 128] bytes -> [blocks, 256] low nibbles in value order."""
    chunks = qs.reshape(-1, 4, 32)
    return np.stack([chunks & 0xF, chunks >> 4], axis=2).reshape(-1, 256)


def _blocks(tensor_type, b: np.ndarray):
    """[blocks, bytes] -> (values [blocks, n] ints, scale [blocks, groups], minimum or None)."""
    if tensor_type == Q.Q4_0:
        return _nibbles(b[:, 2:]).astype(np.int8) - 8, _f16(b[:, :2])[:, None], None
    if tensor_type == Q.Q4_1:
        return _nibbles(b[:, 4:]), _f16(b[:, :2])[:, None], _f16(b[:, 2:4])[:, None]
    if tensor_type in (Q.Q5_0, Q.Q5_1):
        at = 2 if tensor_type == Q.Q5_0 else 4  # the fifth bits follow d (and m)
        high = (b[:, at:at + 4].copy().view("<u4") >> np.arange(32, dtype=np.uint32)) & 1
        q = _nibbles(b[:, at + 4:]) | (high.astype(np.uint8) << 4)
        if tensor_type == Q.Q5_0:
            return q.astype(np.int8) - 16, _f16(b[:, :2])[:, None], None
        return q, _f16(b[:, :2])[:, None], _f16(b[:, 2:4])[:, None]
    if tensor_type == Q.Q8_0:
        return b[:, 2:].view(np.int8), _f16(b[:, :2])[:, None], None
    if tensor_type in (Q.Q4_K, Q.Q5_K):
        d, dmin = _f16(b[:, 0:2])[:, None], _f16(b[:, 2:4])[:, None]
        sc, m = _k_scales(b[:, 4:16])
        if tensor_type == Q.Q4_K:
            q = _k_low(b[:, 16:144])
        else:
            high = (b[:, 16:48, None] >> np.arange(8, dtype=np.uint8)) & 1  # [blocks, l, group]
            q = _k_low(b[:, 48:176]) | (high.transpose(0, 2, 1).reshape(-1, 256) << 4)
        return q, d * sc, -dmin * m
    if tensor_type == Q.Q6_K:
        ql, qh, sc = b[:, :128].reshape(-1, 2, 64), b[:, 128:192].reshape(-1, 2, 32), b[:, 192:208].view(np.int8)
        low = np.concatenate([ql & 0xF, ql >> 4], axis=2)  # [blocks, half, 128]: values 0..63, 64..127
        high = (qh[:, :, None, :] >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3  # [blocks, half, 4, 32]
        q = (low | (high.reshape(-1, 2, 128) << 4)).reshape(-1, 256).astype(np.int8) - 32
        return q, _f16(b[:, 208:210])[:, None] * sc.astype(np.float32), None
    raise ValueError(f"GGUF tensor type {tensor_type.name} is not kept in blocks")


def gguf_block_weight(name: str, data: np.ndarray, tensor_type, shape: tuple[int, int]) -> QuantizedWeight:
    """A quantized GGUF tensor (data: [rows, bytes per row] uint8) as a QuantizedWeight in
    Hugging Face's [out, in] layout (its rows are the output features)."""
    if tensor_type not in KEPT:
        raise ValueError(f"GGUF tensor {name!r} is {tensor_type.name}; quantization='gguf' keeps "
                         f"{[t.name for t in KEPT]} in their blocks (load it without quantization='gguf' "
                         f"to dequantize it).")
    rows, cols = shape
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[tensor_type]
    q, scale, minimum = _blocks(tensor_type, np.asarray(data, np.uint8).reshape(-1, block_bytes))
    groups = cols // block_values * scale.shape[1]
    q, scale = q.reshape(rows, cols), scale.reshape(rows, groups)
    qtype = {np.dtype(np.int8): "int8", np.dtype(np.uint8): "uint8"}[q.dtype]
    if tensor_type in (Q.Q4_0, Q.Q4_1, Q.Q4_K):
        qtype = "int4" if tensor_type == Q.Q4_0 else "uint4"
    zero = None
    if minimum is not None:
        minimum = minimum.reshape(rows, groups)
        flat = scale == 0  # a group of equal values: q 0, scale 1, zero -m
        q = np.where(np.repeat(flat, cols // groups, axis=1), 0, q).astype(q.dtype)
        scale = np.where(flat, 1.0, scale).astype(np.float32)
        zero = (-minimum / scale).astype(np.float32)
    return QuantizedWeight.from_checkpoint(name, q, scale, qtype=qtype, zero=zero)
