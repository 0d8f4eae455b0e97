"""QuantizedWeight: a pre-quantized checkpoint tensor on the host, 8-bit values and their
scales, through the model loaders' layout steps without ever being dequantized.

The loaders turn a Hugging Face `[out, in]` weight into the model's `[in, *out]` layout with
a few numpy steps (transpose, reshape the out axis into heads, concatenate q/k/v, stack
gate/up, split a fused tensor, zero-pad padded heads). A QuantizedWeight takes the same steps:
the values as stored (float8_e4m3fn or int8), and beside them one float32 scale per output
channel kept in the values' shape with size 1 on the input axis, so each step moves the scales
with their channels. A per-tensor scale is broadcast per channel first, so that fused tensors
(q/k/v with three scales) keep every stored value bit for bit. On device it becomes a Qwix
`QArray` of the same values and scales (`to_qarray`), which the weight-only linear method
multiplies as it does a weight quantized at load.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_FUNCTIONS = {}


def _implements(fn):
    def register(impl):
        _FUNCTIONS[fn] = impl
        return impl
    return register


@dataclass(frozen=True)
class QuantizedWeight:
    value: np.ndarray  # 8-bit, the stored values
    scale: np.ndarray  # float32, value's shape with 1 on in_axis
    in_axis: int  # the contraction axis

    @classmethod
    def from_checkpoint(cls, key: str, value: np.ndarray, scale: np.ndarray) -> "QuantizedWeight":
        """A Hugging Face `[out, in]` weight and its scale: `[out, 1]` / `[out]` per channel,
        `[]` / `[1]` per tensor."""
        if value.ndim != 2:
            raise ValueError(f"Quantized tensor {key!r} has shape {value.shape}; [out, in] weights load.")
        scale = np.asarray(scale, np.float32)
        if scale.size not in (1, value.shape[0]):
            raise ValueError(f"Tensor {key}_scale of shape {scale.shape} is neither per tensor nor per "
                             f"output channel of a weight of shape {value.shape}.")
        return cls(value, np.broadcast_to(scale.reshape(-1, 1), (value.shape[0], 1)).copy(), 1)

    shape = property(lambda self: self.value.shape)
    ndim = property(lambda self: self.value.ndim)
    T = property(lambda self: self.transpose())

    def transpose(self, *axes) -> "QuantizedWeight":
        axes = tuple(axes[0]) if len(axes) == 1 else axes or tuple(reversed(range(self.ndim)))
        return QuantizedWeight(self.value.transpose(axes), self.scale.transpose(axes), axes.index(self.in_axis))

    def reshape(self, *shape) -> "QuantizedWeight":
        """Out axes split or merged; the input axis stays an axis of its own."""
        value = self.value.reshape(*shape)
        before = math.prod(self.shape[:self.in_axis])
        axis = next((j for j in range(value.ndim) if math.prod(value.shape[:j]) == before
                     and value.shape[j] == self.shape[self.in_axis]), None)
        if axis is None:
            raise ValueError(f"A quantized weight of shape {self.shape} cannot be reshaped to {value.shape}: "
                             f"its input axis would be merged.")
        scale_shape = list(value.shape)
        scale_shape[axis] = 1
        return QuantizedWeight(value, self.scale.reshape(scale_shape), axis)

    def padded(self, shape: tuple[int, ...]) -> "QuantizedWeight":
        """Zero-padded to shape at the end of each axis (hf_weights.fit's padded heads): zero
        values, zero scales."""
        pad = [(0, m - n) for n, m in zip(self.shape, shape)]
        scale_pad = [(0, 0) if axis == self.in_axis else p for axis, p in enumerate(pad)]
        return QuantizedWeight(np.pad(self.value, pad), np.pad(self.scale, scale_pad), self.in_axis)

    def to_qarray(self, put):
        """The Qwix QArray of these values and scales, each host array placed by put."""
        import qwix  # here: the checkpoint readers (transformers_utils) import no JAX
        return qwix.QArray(put(self.value), put(self.scale))

    def __array_function__(self, func, types, args, kwargs):
        if func not in _FUNCTIONS:
            raise TypeError(f"numpy.{func.__name__} does not take quantized checkpoint weights.")
        return _FUNCTIONS[func](*args, **kwargs)


def _input_axis(weights) -> int:
    """The input axis the weights joined share."""
    if not all(isinstance(w, QuantizedWeight) for w in weights):
        raise ValueError("A fused weight mixes quantized and float checkpoint tensors (see the "
                         "checkpoint's quantization_config ignore list): load both or neither quantized.")
    if len({w.in_axis for w in weights}) != 1:
        raise ValueError("Quantized weights joined must share their input axis.")
    return weights[0].in_axis


def _output_axis(weight: QuantizedWeight, axis: int) -> int:
    if axis % weight.ndim == weight.in_axis:
        raise ValueError("Quantized weights are joined and split along their output axes only.")
    return axis


@_implements(np.concatenate)
def _concatenate(weights, axis=0):
    in_axis = _input_axis(weights)
    axis = _output_axis(weights[0], axis)
    return QuantizedWeight(np.concatenate([w.value for w in weights], axis),
                           np.concatenate([w.scale for w in weights], axis), in_axis)


@_implements(np.stack)
def _stack(weights, axis=0):
    in_axis = _input_axis(weights)
    axis %= weights[0].ndim + 1  # a new axis: never the input axis
    return QuantizedWeight(np.stack([w.value for w in weights], axis), np.stack([w.scale for w in weights], axis),
                           in_axis + (axis <= in_axis))


@_implements(np.split)
def _split(weight, indices_or_sections, axis=0):
    axis = _output_axis(weight, axis)
    return [QuantizedWeight(v, s, weight.in_axis) for v, s in
            zip(np.split(weight.value, indices_or_sections, axis), np.split(weight.scale, indices_or_sections, axis))]
