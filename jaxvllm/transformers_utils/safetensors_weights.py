"""A Hugging Face directory's safetensors, read without torch: float32 numpy arrays, a
quantized checkpoint's weights kept as stored, each paired with its scales (QuantizedWeight,
quantized_tensors.py)."""
from __future__ import annotations

import glob
import json
import os

import ml_dtypes
import numpy as np
from safetensors import safe_open

from jaxvllm.transformers_utils.quantized_tensors import EIGHT_BIT, pair_quantized
from jaxvllm.transformers_utils.quantized_weight import QuantizedWeight

_INDEX = "model.safetensors.index.json"


def load_safetensors(model: str) -> dict[str, np.ndarray | QuantizedWeight]:
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
                weights[name] = w if w.dtype in EIGHT_BIT or w.dtype.kind in "iu" else w.astype(np.float32, copy=False)
    return pair_quantized(weights, _quantization_config(model))


def _header(file: str) -> tuple[dict, int]:
    """A safetensors file's header (each tensor's dtype, shape, byte offsets) and where its
    data starts."""
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(size)), 8 + size


def _quantization_config(model: str) -> dict | None:
    path = os.path.join(model, "config.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f).get("quantization_config")
