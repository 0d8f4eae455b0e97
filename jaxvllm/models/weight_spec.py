"""A model family's weights, declared: each parameter's path in the tree, its shape as loaded,
the logical axis of each dimension (distributed/logical_axes.py: how the mesh splits it),
and the checkpoint tensors it is made of with the transform
that makes it (fuse, split, transpose). Construction, loading, sharding, pipeline stages,
the memory plan and update_weights all read this one table (vLLM spreads the same facts over
packed_modules_mapping, weight loaders and parallel layer classes).

A family declares templates: "{i}" in a path or a source stands for the layer. `expand`
makes one Weight per parameter; a pipeline stage's model numbers its layers from 0 while its
sources keep the checkpoint's numbers.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping

from jaxvllm.distributed.logical_axes import TENSOR_PARALLEL, logical_to_mesh

# The weight kinds, re-exported: a family declares its weights' kinds from here.
from jaxvllm.layers.quantization.config import EXPERTS as EXPERTS
from jaxvllm.layers.quantization.config import LINEAR as LINEAR
from jaxvllm.layers.quantization.config import OTHER as OTHER
from jaxvllm.models.hf_weights import fit


@dataclasses.dataclass(frozen=True)
class Weight:
    path: str                        # 'layers.{i}.qkv_proj', 'embed_tokens'
    shape: tuple[int, ...]           # as loaded: [in, *out] for a linear
    axes: tuple                      # logical axis (or None: never split) per dimension
    sources: tuple[str, ...] = ()    # the checkpoint tensors it is made of (Hugging Face names)
    transform: Callable | None = None  # (key, *source arrays) -> the loaded layout; None: the one source
    kind: str = OTHER                # LINEAR: stored and run by its quantization method; EXPERTS: by the MoE method
    init: float = 0.0                # the value before loading (1 for a plain norm's scale)
    stage: str | None = None         # outside the layers: "first" or "last", the pipeline stage that runs it
    tied_to: str | None = None       # a tied head: made from this weight (transposed), not read
    name: str | None = None          # what errors call it (a fused one's checkpoint-style name)
    source_shape: tuple | None = None  # each source's shape, where it is fixed (checked before the transform)
    dtype: str | None = None         # its own dtype (an index map's int32); None: the model's

    @property
    def key(self) -> str:
        return self.name or (self.sources[0] if len(self.sources) == 1 else self.path)

    @property
    def partition(self) -> tuple:
        """The mesh axis (or None) of each dimension under tensor parallelism."""
        return tuple(logical_to_mesh(self.axes, TENSOR_PARALLEL))

    @property
    def parallel_style(self) -> str:
        """A linear's Megatron style: column (out features split), row (in features split)."""
        if self.partition[0] is not None:
            return "row"
        return "column" if any(self.partition[1:]) else "replicated"

    @property
    def num_elements(self) -> int:
        return math.prod(self.shape)


def linear(path: str, in_features: int, out_shape: tuple[int, ...], axes: tuple, sources=(),
           transform=None, **kw) -> Weight:
    """A projection [in, *out]; a single [out, in] source is transposed unless told otherwise."""
    if transform is None and len(sources) == 1:
        transform = transpose
    return Weight(path, (in_features, *out_shape), axes, tuple(sources), transform, LINEAR, **kw)


def vector(path: str, size: int, source: str, *, init: float = 0.0, axes=(None,), **kw) -> Weight:
    """A norm's scale or a bias, stored as in the checkpoint."""
    return Weight(path, (size,), axes, (source,), init=init, **kw)


def transpose(key: str, w):
    return w.T


def expand(templates: list[Weight], layers: range) -> dict[str, Weight]:
    """One Weight per parameter for the given checkpoint layers, numbered from 0 in the tree."""
    out = {}
    for w in templates:
        if "{i}" not in w.path:
            out[w.path] = w
            continue
        for j, i in enumerate(layers):
            out[w.path.format(i=j)] = dataclasses.replace(
                w, path=w.path.format(i=j), sources=tuple(s.format(i=i) for s in w.sources),
                name=w.name and w.name.format(i=i))
    return out


def canonical(weights: Mapping, aliases: tuple[tuple[str, str], ...]) -> dict:
    """weights named as the family's sources are: (ours, theirs) prefix pairs rename the
    checkpoints another writer names differently (facebook/opt-*: no "model.")."""
    out = {}
    for name, value in weights.items():
        for ours, theirs in aliases:
            if name.startswith(theirs) and not name.startswith(ours):
                name = ours + name[len(theirs):]
                break
        out[name] = value
    return out


def convert(spec: Mapping[str, Weight], weights: Mapping, dtype, only: set[str] | None = None):
    """(path, host array in the loaded layout) for each weight of spec made from the checkpoint
    `weights` (canonical names); with `only`, the weights of those paths alone. Heads padded
    for tensor parallelism get zeros past the checkpoint's (hf_weights.fit)."""
    for w in spec.values():
        if w.tied_to is not None or only is not None and w.path not in only:
            continue
        arrays = [_get(weights, key) for key in w.sources]
        for key, array in zip(w.sources, arrays):
            if w.source_shape is not None and tuple(array.shape) != w.source_shape:
                raise ValueError(f"Tensor {key!r} has shape {tuple(array.shape)}; the model config "
                                 f"needs {w.source_shape}.")
        value = w.transform(w.key, *arrays) if w.transform is not None else arrays[0]
        yield w.path, fit(w.key, value, w.shape, w.dtype or dtype)


def _get(weights: Mapping, key: str):
    if key not in weights:
        raise ValueError(f"Checkpoint is missing tensor {key!r}.")
    return weights[key]
