"""Tiny quantized checkpoints written here in each published layout, from a float checkpoint
(its decoder layers' linears quantized, the rest kept float), with numpy and safetensors:
fp8 blocks (`weight_scale_inv`), AWQ GEMM, GPTQ (v1 zeros, act order), compressed-tensors
pack-quantized and W8A8 int8. Each writer returns the checkpoint dequantized: the float
reference the quantized model must reproduce. The packings follow the formats' own writers
(AutoAWQ, AutoGPTQ, compressed-tensors' pack_to_int32, DeepSeek's fp8 blocks)."""
from __future__ import annotations

import json
import shutil

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file, save_file

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
FP8_MAX = 448.0


def quantize(w: np.ndarray, bits: int, group: int, sym: bool, min_zero: int = 0):
    """w [out, in] -> (q [out, in] ints, scale [out, groups] float16-exact, zero [out, groups]):
    w ~ (q - zero) * scale, q in 0..2^bits-1 (zero 2^(bits-1) where symmetric, else at least
    min_zero)."""
    out, k = w.shape
    g = w.reshape(out, -1, group if group > 0 else k)
    maxq = (1 << bits) - 1
    if sym:
        scale = (np.abs(g).max(-1) * 2 / maxq).astype(np.float16).astype(np.float32)
        zero = np.full_like(scale, (maxq + 1) // 2)
    else:
        lo, hi = np.minimum(g.min(-1), 0), np.maximum(g.max(-1), 0)
        scale = ((hi - lo) / maxq).astype(np.float16).astype(np.float32)
        zero = np.clip(np.round(-lo / scale), min_zero, maxq)
    q = np.clip(np.round(g / scale[..., None]) + zero[..., None], 0, maxq).reshape(out, k).astype(np.int64)
    return q, scale, zero


def dequantized(q, scale, zero) -> np.ndarray:
    out, k = q.shape
    return ((q.reshape(out, scale.shape[1], -1) - zero[..., None]) * scale[..., None]).reshape(out, k)


def pack(values: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """32 / bits consecutive values along axis per int32 word, lowest bits first."""
    v = np.moveaxis(values.astype(np.uint32), axis, -1)
    v = v.reshape(*v.shape[:-1], -1, 32 // bits) << (np.arange(32 // bits, dtype=np.uint32) * bits)
    return np.moveaxis(np.bitwise_or.reduce(v, axis=-1).view(np.int32), -1, axis)


def _rewrite(src, dst, qc: dict, write_linear) -> dict[str, np.ndarray]:
    """Copy src to dst with each decoder linear `X.weight` replaced by write_linear(X., w)'s
    tensors; returns the dequantized checkpoint."""
    shutil.copytree(src, dst)
    stored, reference = {}, {}
    for name, w in load_file(dst / "model.safetensors").items():
        if name.startswith("model.layers.") and name.endswith("_proj.weight") and w.ndim == 2:
            tensors, reference[name] = write_linear(name.removesuffix("weight"), w.astype(np.float32))
            stored.update({k: np.ascontiguousarray(t) for k, t in tensors.items()})
        else:
            stored[name] = reference[name] = w
    save_file(stored, dst / "model.safetensors")
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = qc
    (dst / "config.json").write_text(json.dumps(config))
    return reference


def write_awq(src, dst, group: int = 32):
    def linear(base, w):
        q, scale, zero = quantize(w, 4, group, sym=False)
        order = list(AWQ_ORDER)

        def columns(a):  # [rows, out] -> [rows, out / 8], nibble i holding column AWQ_ORDER[i] of 8
            return pack(a.reshape(a.shape[0], -1, 8)[..., order].reshape(a.shape[0], -1), 4, axis=1)
        return ({base + "qweight": columns(q.T), base + "qzeros": columns(zero.T.astype(np.int64)),
                 base + "scales": scale.T.astype(np.float16)}, dequantized(q, scale, zero))
    qc = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    return _rewrite(src, dst, qc, linear)


def write_gptq(src, dst, bits: int = 4, group: int = 32, sym: bool = True, desc_act: bool = False, seed: int = 0):
    """With desc_act, each input space (q/k/v share one, gate/up one) gets a random act order:
    the rows quantized together as a group are scattered over the input."""
    rng, orders = np.random.default_rng(seed), {}

    def linear(base, w):
        k = w.shape[1]
        space = base.replace("k_proj", "q_proj").replace("v_proj", "q_proj").replace("up_proj", "gate_proj")
        perm = orders.setdefault(space, rng.permutation(k) if desc_act else np.arange(k))
        # groups in act order; v1 stores zero - 1, so its asymmetric zeros are at least 1 (as AutoGPTQ's)
        q, scale, zero = quantize(w[:, perm], bits, group, sym, min_zero=1)
        inverse = np.argsort(perm)
        q, g_idx = q[:, inverse], (inverse // group).astype(np.int32)
        tensors = {base + "qweight": pack(q.T, bits, axis=0),
                   base + "qzeros": pack((zero - 1).T.astype(np.int64), bits, axis=1),
                   base + "scales": scale.T.astype(np.float16), base + "g_idx": g_idx}
        reference = (q - zero[:, g_idx]) * scale[:, g_idx]
        return tensors, reference
    qc = {"quant_method": "gptq", "bits": bits, "group_size": group, "sym": sym, "desc_act": desc_act,
          "checkpoint_format": "gptq"}
    return _rewrite(src, dst, qc, linear)


def write_pack_quantized(src, dst, bits: int = 4, group: int = 32, sym: bool = True):
    def linear(base, w):
        q, scale, zero = quantize(w, bits, group, sym)
        mid = 1 << (bits - 1)  # signed values and zero points, stored + mid
        tensors = {base + "weight_packed": pack(q, bits, axis=1), base + "weight_scale": scale.astype(np.float16),
                   base + "weight_shape": np.array(w.shape, np.int64)}
        if not sym:
            tensors[base + "weight_zero_point"] = pack(zero.astype(np.int64), bits, axis=0)
        return tensors, dequantized(q - mid, scale, zero - mid)
    weights = {"num_bits": bits, "type": "int", "symmetric": sym, "strategy": "group", "group_size": group}
    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized",
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}, "ignore": ["lm_head"]}
    return _rewrite(src, dst, qc, linear)


def write_fp8_block(src, dst, block: tuple[int, int] = (32, 32)):
    bo, bi = block

    def linear(base, w):
        out, k = w.shape
        blocks = np.abs(w).reshape(out // bo, bo, k // bi, bi).max(axis=(1, 3))
        scale_inv = (blocks / FP8_MAX).astype(np.float32)
        per_value = np.repeat(np.repeat(scale_inv, bo, 0), bi, 1)
        q = (w / per_value).astype(ml_dtypes.float8_e4m3fn)
        return {base + "weight": q, base + "weight_scale_inv": scale_inv}, q.astype(np.float32) * per_value
    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(block)}
    return _rewrite(src, dst, qc, linear)


def write_w8a8_int8(src, dst):
    def linear(base, w):
        scale = (np.abs(w).max(axis=1, keepdims=True) / 127).astype(np.float32)
        q = np.clip(np.round(w / scale), -128, 127).astype(np.int8)
        return {base + "weight": q, base + "weight_scale": scale}, q * scale
    act = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
    weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
    qc = {"quant_method": "compressed-tensors", "format": "int-quantized",
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": act}},
          "ignore": ["lm_head"]}
    return _rewrite(src, dst, qc, linear)


WRITERS = {"fp8-block": write_fp8_block, "awq": write_awq, "gptq": write_gptq,
           "gptq-8bit-asym-act-order": lambda s, d: write_gptq(s, d, bits=8, sym=False, desc_act=True),
           "gptq-act-order": lambda s, d: write_gptq(s, d, desc_act=True),
           "w4a16": write_pack_quantized, "w4a16-asym": lambda s, d: write_pack_quantized(s, d, sym=False),
           "w8a8-int8": write_w8a8_int8}
