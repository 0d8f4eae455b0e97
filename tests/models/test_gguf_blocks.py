"""quantization='gguf': each kept GGUF block type (transformers_utils/gguf_blocks.py) holds the
weights llama.cpp's own dequantization (gguf-py's, which transformers uses) gives."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from jaxvllm.transformers_utils.gguf_blocks import KEPT, gguf_block_weight

Q = gguf.GGMLQuantizationType
# Where each type keeps its f16 fields (d, and dmin or m): random bytes elsewhere are valid.
F16_FIELDS = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.Q4_K: (0, 2),
              Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def random_blocks(tensor_type, rows: int, cols: int, rng) -> np.ndarray:
    values, size = gguf.GGML_QUANT_SIZES[tensor_type]
    data = rng.integers(0, 256, (rows * cols // values, size), dtype=np.uint8)
    for at in F16_FIELDS[tensor_type]:
        data[:, at:at + 2] = rng.uniform(-0.05, 0.05, (len(data), 1)).astype(np.float16).view(np.uint8)
    data[::7, :2] = 0  # some blocks with a zero scale (all values at their minimum)
    return data.reshape(rows, -1)


@pytest.mark.parametrize("tensor_type", KEPT, ids=lambda t: t.name)
def test_kept_blocks_hold_llama_cpps_weights(tensor_type):
    rows, cols = 6, 512
    data = random_blocks(tensor_type, rows, cols, np.random.default_rng(tensor_type.value))
    theirs = gguf.quants.dequantize(data, tensor_type)
    w = gguf_block_weight("blk.0.ffn_up.weight", data, tensor_type, (rows, cols))
    assert w.shape == (rows, cols) and w.in_axis == 1
    per_value = lambda a: np.repeat(a, cols // a.shape[1], axis=1)  # noqa: E731
    zero = 0 if w.zero is None else per_value(w.zero)
    ours = (w.value.astype(np.float32) - zero) * per_value(w.scale)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_a_type_not_kept_is_named():
    with pytest.raises(ValueError, match="IQ4_NL; quantization='gguf' keeps"):
        gguf_block_weight("blk.0.ffn_up.weight", np.zeros((1, 18), np.uint8), Q.IQ4_NL, (1, 32))
