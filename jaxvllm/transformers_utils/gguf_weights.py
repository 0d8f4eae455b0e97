"""A GGUF file's tensors (llama.cpp's names and layout) as a Hugging Face state dict, read
with the `gguf` package (no torch), and written once as a converted copy (gguf_cache.py)."""
from __future__ import annotations

import re

import gguf
import numpy as np

from jaxvllm.transformers_utils.config import load_hf_config
from jaxvllm.transformers_utils.gguf_blocks import gguf_block_weight
from jaxvllm.transformers_utils.gguf_cache import write_cache
from jaxvllm.transformers_utils.gguf_utils import check_gguf_arch, gguf_reader
from jaxvllm.transformers_utils.quantized_weight import QuantizedWeight
from jaxvllm.transformers_utils.tokenizer import load_tokenizer

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


# What quantization='gguf' keeps in blocks: the linears and the embedding (a tied head reads it).
_BLOCK_PARTS = {"token_embd", "output", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}
_FLOAT_TYPES = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)

# Gemma's norms (gemma2, gemma3): llama.cpp stores each RMSNorm weight as 1 + w, Hugging Face as w.
_GEMMA_LAYER_NAMES = dict(_GGUF_LAYER_NAMES, ffn_norm="pre_feedforward_layernorm",
                          post_attention_norm="post_attention_layernorm",
                          post_ffw_norm="post_feedforward_layernorm")


def load_gguf_weights(model: str, keep_blocks: bool = False) -> dict[str, np.ndarray | QuantizedWeight]:
    """A GGUF's tensors, dequantized to float32, with Hugging Face names and layout; the
    first read of a whole model also writes its converted copy (gguf_cache.py). keep_blocks
    (quantization='gguf'): the linears' and the embedding's quantized blocks kept as they are
    (gguf_blocks.py), nothing cached.

    A GGUF without `output.weight` has tied embeddings, and gets no `lm_head.weight` here either.
    """
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
        if keep_blocks and part in _BLOCK_PARTS and tensor.tensor_type not in _FLOAT_TYPES:
            rows_cols = (tensor.data.shape[0], int(tensor.shape[0]))  # GGUF lists a shape innermost first
            w = gguf_block_weight(tensor.name, tensor.data, tensor.tensor_type, rows_cols)
        else:  # a copy: dequantize returns F32 tensors as views into the memory-mapped file
            w = np.array(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        if arch == "llama" and part in heads:
            w = _unpermute(w, heads[part])
        if gemma and base.endswith("norm"):
            w -= 1.0
        name = f"{base}.{kind}" if layer is None else f"model.layers.{layer}.{base}.{kind}"
        weights[name] = w
    if "tokenizer.ggml.model" in reader.fields and not keep_blocks:  # a whole model: cache it
        write_cache(model, weights, lambda: load_hf_config(model), lambda: load_tokenizer(model))
    return weights


def _unpermute(w, n_heads: int):
    """Undo llama.cpp's Q/K row order (its RoPE pairs adjacent rows; Hugging Face's pairs
    halves): an array's or kept blocks' rows (their scales move with them)."""
    rows = w.shape[0]
    pairs = w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])
    return pairs.transpose(0, 2, 1, *range(3, pairs.ndim)).reshape(w.shape)
