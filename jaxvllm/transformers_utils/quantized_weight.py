"""QuantizedWeight: a quantized checkpoint tensor on the host, its values, scales and zero
points, through the model loaders' layout steps without ever being dequantized.

The loaders turn a Hugging Face `[out, in]` weight into the model's `[in, *out]` layout with
a few numpy steps (transpose, reshape the out axis into heads, concatenate q/k/v, stack
gate/up and experts, split a fused tensor, zero-pad padded heads). A QuantizedWeight takes the
same steps: the values as stored (unpacked: int8 / uint8 for 4- and 8-bit integers, fp8), and
beside them a float32 scale (and zero point, for asymmetric formats) per group of input
features and output channel, kept in the values' shape with the number of groups on the input
axis, so each step moves them with their channels: w = (q - zero) * scale. A per-tensor or
block scale is repeated per channel first, so that fused tensors keep every stored value bit
for bit. Fused parts of different formats (a GGUF's q and k in Q4_K, v in Q6_K) are widened
to one (values to a byte, groups to the finer size, zero points where any has them).

With `perm` (GPTQ's act order) the input rows are kept sorted by group, row i being the
checkpoint's row perm[i]: the activations are gathered the same way before the product.
On device it becomes a Qwix `QArray` (`to_qarray`), which the linear methods multiply.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np

_FUNCTIONS = {}
# The stored values' type -> the numpy type holding them here (4-bit values in a byte each).
HOST_DTYPES = {"int4": np.int8, "uint4": np.uint8, "int8": np.int8, "uint8": np.uint8,
               "float8_e4m3fn": ml_dtypes.float8_e4m3fn}
_DEVICE_DTYPES = {"int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4}
_RANGES = {"int4": (-8, 7), "uint4": (0, 15), "int8": (-128, 127), "uint8": (0, 255)}


def _implements(fn):
    def register(impl):
        _FUNCTIONS[fn] = impl
        return impl
    return register


@dataclass(frozen=True)
class QuantizedWeight:
    value: np.ndarray  # the stored values (HOST_DTYPES[qtype])
    scale: np.ndarray  # float32, value's shape with the groups on in_axis
    in_axis: int  # the contraction axis
    qtype: str = "int8"  # scheme.QTYPES
    zero: np.ndarray | None = None  # float32 zero points, scale's shape
    perm: np.ndarray | None = None  # int32 [in]: act order (see the module's docstring)

    @classmethod
    def from_checkpoint(cls, key: str, value: np.ndarray, scale: np.ndarray, *, qtype: str | None = None,
                        zero: np.ndarray | None = None, block: tuple[int, int] | None = None,
                        g_idx: np.ndarray | None = None) -> "QuantizedWeight":
        """A Hugging Face `[out, in]` weight's values and its scale: `[out, groups]`,
        `[out, 1]` / `[out]` per channel, `[]` / `[1]` per tensor, `[out/bo, in/bi]` per
        block of `block` (bo, bi); zero points in the scale's shape; g_idx [in]: each input
        row's group (act order)."""
        if value.ndim != 2:
            raise ValueError(f"Quantized tensor {key!r} has shape {value.shape}; [out, in] weights load.")
        out, k = value.shape
        scale = np.asarray(scale, np.float32)
        if block is not None:
            bo, bi = block
            want = (-(-out // bo), -(-k // bi))
            if scale.shape != want or k % bi:
                raise ValueError(f"Tensor {key}'s block scale of shape {scale.shape} does not fit a weight of "
                                 f"shape {value.shape} in blocks of {list(block)} (needs {want}, in a multiple "
                                 f"of {bi}).")
            scale = np.repeat(scale, bo, axis=0)[:out]
        elif scale.size in (1, out):
            scale = np.broadcast_to(scale.reshape(-1, 1), (out, 1))
        elif scale.ndim != 2 or scale.shape[0] != out or k % scale.shape[1]:
            raise ValueError(f"Tensor {key}'s scale of shape {scale.shape} is neither per tensor, per output "
                             f"channel nor per group of input features of a weight of shape {value.shape}.")
        if zero is not None:
            zero = np.broadcast_to(np.asarray(zero, np.float32), scale.shape)
        qtype = qtype or {np.dtype(np.int8): "int8", np.dtype(ml_dtypes.float8_e4m3fn): "float8_e4m3fn"}[value.dtype]
        weight = cls(np.ascontiguousarray(value), np.ascontiguousarray(scale), 1, qtype,
                     None if zero is None else zero.copy())
        return weight if g_idx is None else weight._sorted_by_group(key, np.asarray(g_idx))

    def _sorted_by_group(self, key: str, g_idx: np.ndarray) -> "QuantizedWeight":
        """Input rows in group order (act order), each group whole and of one size."""
        groups, k = self.scale.shape[1], self.shape[1]
        if g_idx.shape != (k,) or np.bincount(g_idx, minlength=groups).tolist() != [k // groups] * groups:
            raise ValueError(f"Tensor {key}'s g_idx does not give each of {groups} groups {k // groups} of "
                             f"its {k} input rows.")
        perm = np.argsort(g_idx, kind="stable").astype(np.int32)
        if np.array_equal(perm, np.arange(k)):
            return self
        return replace(self, value=np.ascontiguousarray(self.value[:, perm]), perm=perm)

    shape = property(lambda self: self.value.shape)
    ndim = property(lambda self: self.value.ndim)
    T = property(lambda self: self.transpose())

    @property
    def groups(self) -> int:
        return self.scale.shape[self.in_axis]

    def _parts(self, fn) -> "QuantizedWeight":
        """fn applied to the values, scales and zero points alike."""
        return replace(self, value=fn(self.value), scale=fn(self.scale),
                       zero=None if self.zero is None else fn(self.zero))

    def transpose(self, *axes) -> "QuantizedWeight":
        axes = tuple(axes[0]) if len(axes) == 1 else axes or tuple(reversed(range(self.ndim)))
        return replace(self._parts(lambda a: a.transpose(axes)), in_axis=axes.index(self.in_axis))

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
        scale_shape[axis] = self.groups
        scale = self.scale.reshape(scale_shape)
        zero = None if self.zero is None else self.zero.reshape(scale_shape)
        return replace(self, value=value, scale=scale, zero=zero, in_axis=axis)

    def padded(self, shape: tuple[int, ...]) -> "QuantizedWeight":
        """Zero-padded to shape at the end of each axis (hf_weights.fit's padded heads): zero
        values, scales and zero points."""
        pad = [(0, m - n) for n, m in zip(self.shape, shape)]
        scale_pad = [(0, 0) if axis == self.in_axis else p for axis, p in enumerate(pad)]
        return replace(self, value=np.pad(self.value, pad), scale=np.pad(self.scale, scale_pad),
                       zero=None if self.zero is None else np.pad(self.zero, scale_pad))

    def widened(self, qtype: str, groups: int, zero: bool) -> "QuantizedWeight":
        """The same weight stored as qtype (values that fit it), with `groups` groups (a
        multiple of its own: each scale repeated) and zero points if asked (zeros)."""
        value = self.value if qtype == self.qtype else self.value.astype(HOST_DTYPES[qtype])
        repeat = groups // self.groups
        scale = np.repeat(self.scale, repeat, axis=self.in_axis)
        zero_ = self.zero if self.zero is not None else (np.zeros_like(self.scale) if zero else None)
        zero_ = None if zero_ is None else np.repeat(zero_, repeat, axis=self.in_axis)
        return replace(self, value=value, scale=scale, zero=zero_, qtype=qtype)

    def to_qarray(self, put):
        """The Qwix QArray of these values, scales and zero points, each host array placed by
        put; with act order, (QArray, perm) (layers/quantization/group_linear.py)."""
        import qwix  # here: the checkpoint readers (transformers_utils) import no JAX
        value = put(self.value)
        if self.qtype in _DEVICE_DTYPES and not _on_cpu(value):
            value = value.astype(_DEVICE_DTYPES[self.qtype])  # two values a byte on TPU and GPU
        q = qwix.QArray(value, put(self.scale), None if self.zero is None else put(self.zero))
        if self.perm is None:
            return q
        perm_shape = [1] * self.ndim
        perm_shape[self.in_axis] = -1
        return q, put(self.perm.reshape(perm_shape))

    def __array_function__(self, func, types, args, kwargs):
        if func not in _FUNCTIONS:
            raise TypeError(f"numpy.{func.__name__} does not take quantized checkpoint weights.")
        return _FUNCTIONS[func](*args, **kwargs)


def _on_cpu(array) -> bool:
    """4-bit values stay in their byte on the CPU: XLA:CPU stores a byte per 4-bit value
    anyway, and its ahead-of-time compiled steps refuse a committed 4-bit argument (compiled
    for 4 bits a value, the array holding 8: jax 0.10.2), so every warmed AWQ / GPTQ step
    failed on its first call."""
    return all(d.platform == "cpu" for d in array.devices())


def common_format(weights) -> list[QuantizedWeight]:
    """weights to be joined, in one format (the module's docstring)."""
    if not all(isinstance(w, QuantizedWeight) for w in weights):
        raise ValueError("A fused weight mixes quantized and float checkpoint tensors (see the "
                         "checkpoint's quantization_config ignore list): load both or neither quantized.")
    if len({w.in_axis for w in weights}) != 1:
        raise ValueError("Quantized weights joined must share their input axis.")
    perms = [w.perm for w in weights]
    if any(p is None for p in perms) != all(p is None for p in perms) or (
            perms[0] is not None and not all(np.array_equal(perms[0], p) for p in perms)):
        raise ValueError("Quantized weights joined must share their act order (g_idx).")
    qtypes = {w.qtype for w in weights}
    if len(qtypes) == 1 and len({w.groups for w in weights}) == 1 and len({w.zero is None for w in weights}) == 1:
        return list(weights)
    if "float8_e4m3fn" in qtypes:
        raise ValueError(f"Quantized weights of {sorted(qtypes)} cannot be joined.")
    groups = math.lcm(*(w.groups for w in weights))
    lo, hi = min(int(w.value.min()) for w in weights), max(int(w.value.max()) for w in weights)
    fits = [q for q in ("int4", "uint4", "int8", "uint8") if _RANGES[q][0] <= lo and hi <= _RANGES[q][1]]
    if not fits:
        raise ValueError(f"Quantized weights of {sorted(qtypes)} (values {lo}..{hi}) cannot be joined in a byte.")
    qtype = fits[0]
    return [w.widened(qtype, groups, any(w.zero is not None for w in weights)) for w in weights]


def _output_axis(weight: QuantizedWeight, axis: int) -> int:
    if axis % weight.ndim == weight.in_axis:
        raise ValueError("Quantized weights are joined and split along their output axes only.")
    return axis


def _joined(weights, join, in_axis: int) -> QuantizedWeight:
    zero = None if weights[0].zero is None else join([w.zero for w in weights])
    return replace(weights[0], value=join([w.value for w in weights]), scale=join([w.scale for w in weights]),
                   zero=zero, in_axis=in_axis)


@_implements(np.concatenate)
def _concatenate(weights, axis=0):
    weights = common_format(weights)
    axis = _output_axis(weights[0], axis)
    return _joined(weights, lambda parts: np.concatenate(parts, axis), weights[0].in_axis)


@_implements(np.stack)
def _stack(weights, axis=0):
    weights = common_format(weights)
    axis %= weights[0].ndim + 1  # a new axis: never the input axis
    in_axis = weights[0].in_axis
    return _joined(weights, lambda parts: np.stack(parts, axis), in_axis + (axis <= in_axis))


@_implements(np.split)
def _split(weight, indices_or_sections, axis=0):
    axis = _output_axis(weight, axis)
    zeros = (np.split(weight.zero, indices_or_sections, axis) if weight.zero is not None
             else [None] * len(np.split(weight.scale, indices_or_sections, axis)))
    return [replace(weight, value=v, scale=s, zero=z) for v, s, z in
            zip(np.split(weight.value, indices_or_sections, axis), np.split(weight.scale, indices_or_sections, axis),
                zeros)]
