"""Reading one tensor of a Hugging Face state dict for the families beyond Llama: a missing
tensor or one that does not fit the config is an error naming it."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxvllm.transformers_utils.quantized_weight import QuantizedWeight


def get(weights: dict[str, np.ndarray], key: str) -> np.ndarray:
    if key not in weights:
        raise ValueError(f"Checkpoint is missing tensor {key!r}.")
    return weights[key]


def fit(key: str, w: np.ndarray | QuantizedWeight, shape: tuple[int, ...], dtype) -> np.ndarray | QuantizedWeight:
    """w in shape, zero-padded where the model's heads are padded for tensor parallelism
    (checkpoint values in the leading slots). A pre-quantized weight keeps its 8-bit values."""
    shape = tuple(shape)
    if w.ndim != len(shape) or any(n > m for n, m in zip(w.shape, shape)):
        raise ValueError(f"Tensor {key!r} of shape {w.shape} does not fit the model config ({shape}).")
    if isinstance(w, QuantizedWeight):
        return w if w.shape == shape else w.padded(shape)
    if w.shape == shape:
        return w.astype(dtype, copy=False)
    value = np.zeros(shape, dtype)
    value[tuple(slice(0, n) for n in w.shape)] = w
    return value


def load(weights: dict[str, np.ndarray], key: str, shape: tuple[int, ...], dtype) -> np.ndarray:
    """weights[key], checked against (and fitted to) shape."""
    return fit(key, get(weights, key), shape, dtype)


def default_place(name: str, value: np.ndarray | QuantizedWeight):
    """A loaded weight on the default device, where no mesh places it (a pre-quantized one
    as a Qwix QArray)."""
    if isinstance(value, QuantizedWeight):
        return value.to_qarray(jnp.asarray)
    return jnp.asarray(value)
