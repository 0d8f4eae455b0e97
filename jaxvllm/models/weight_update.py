"""update_weights' model side: new weights from a dict or a path, validated against the model
before anything changes, converted to the parameter tree's layout and placed on the mesh.

Two namings are accepted. The checkpoint's own (Hugging Face: 'model.layers.0.self_attn.
q_proj.weight', [out, in]) goes through the model family's weight spec, as at loading (q/k/v
and gate/up fused, heads padded for tensor parallelism): the weights whose sources are all
given are updated, and a tensor fused with others must come with them.
The parameter tree's ('layers.0.qkv_proj', [in, *out], heads padded as the engine holds them;
an Orbax checkpoint's names) is placed as given, and a jax array already of the engine's dtype
and sharding is used as it is, without a copy. Either way the linear method then stores each
weight its own way (packing, quantizing) through `model.load_weights`, as at start-up.
"""
from __future__ import annotations

import os

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxvllm.distributed.partition import param_sharding, place
from jaxvllm.models.loader import load_weights
from jaxvllm.models.model_loader import restore_orbax
from jaxvllm.models.weight_spec import canonical, convert
from jaxvllm.transformers_utils.orbax_checkpoint import is_orbax_checkpoint


class WeightUpdater:
    def __init__(self, model: nnx.Module, mesh: Mesh, hf_config, checkpoint_shapes: dict[str, tuple] | None,
                 expert_parallel: bool = False):
        """checkpoint_shapes: the loaded checkpoint's tensors by name (None for an Orbax
        checkpoint, named as the parameter tree). expert_parallel: as the model was placed."""
        self.model, self.mesh, self.hf_config = model, mesh, hf_config
        self.expert_parallel = expert_parallel
        self.dtype = model.dtype
        self.spec = model.weights()
        # The tree in the layout weights are loaded in (a tied head is made, not given).
        self.param_shapes = {path: w.shape for path, w in self.spec.items() if w.tied_to is None}
        self.checkpoint_shapes = checkpoint_shapes or {}

    def prepare(self, weights) -> list[tuple[str, jax.Array]]:
        """(parameter name, array on the mesh) of each weight updated, in the loaded layout.
        weights: {name: numpy or jax array}, or a path (a directory of *.safetensors, a GGUF
        file, an Orbax checkpoint). Raises ValueError naming the first tensor that does not fit."""
        if isinstance(weights, (str, os.PathLike)):
            weights = self._read(os.fspath(weights))
            if isinstance(weights, list):
                return weights
        if not isinstance(weights, dict) or not weights:
            raise ValueError("update_weights takes a non-empty dict of arrays by name, or a path.")
        own = next(iter(weights)) in self.param_shapes or not self.checkpoint_shapes
        shapes = self.param_shapes if own else self.checkpoint_shapes
        for name, value in weights.items():
            if name not in shapes:
                like = ", ".join(repr(n) for n in list(shapes)[:2])
                raise ValueError(f"update_weights: the model has no tensor {name!r}; name every tensor "
                                 f"as {'its parameter tree' if own else 'its checkpoint'} does ({like}, ...).")
            _check(name, value, shapes[name])
        return self._place_own(weights) if own else self._convert(weights)

    def _place(self, name: str, value: np.ndarray) -> jax.Array:
        return place(self.mesh, self.spec[name], value, expert_parallel=self.expert_parallel)

    def missing(self, names) -> list[str]:
        """The parameters a full update must hold that `names` lacks."""
        return sorted(set(self.param_shapes) - set(names))

    def _read(self, path: str):
        if not os.path.exists(path):
            raise ValueError(f"update_weights: {path!r} is neither a directory of *.safetensors files, "
                             f"a GGUF file nor an Orbax checkpoint.")
        try:  # a file that does not fit is the caller's error, whatever the reader raises
            if is_orbax_checkpoint(path):
                return list(restore_orbax(self.hf_config, self.model.args, path, self.mesh, self.dtype,
                                          self.expert_parallel))
            weights = load_weights(path)
        except Exception as e:
            reason = str(e) or f"{type(e).__name__} without a message"
            raise ValueError(f"update_weights: could not read {path!r} for this model: {reason}") from e
        if not weights:
            raise ValueError(f"update_weights: {path!r} holds no *.safetensors tensors.")
        return weights

    def _place_own(self, weights: dict) -> list[tuple[str, jax.Array]]:
        out = []
        for name, value in weights.items():
            sharding = param_sharding(self.spec[name], value.shape, self.mesh, self.expert_parallel)
            if isinstance(value, jax.Array) and value.dtype == self.dtype:
                if not value.sharding.is_equivalent_to(sharding, value.ndim):
                    value = jax.device_put(value, sharding)
            else:
                value = self._place(name, np.asarray(value).astype(self.dtype, copy=False))
            out.append((name, value))
        return out

    def _convert(self, weights: dict) -> list[tuple[str, jax.Array]]:
        """The weights whose checkpoint sources (the family's weight spec) are all given,
        converted as at loading; a weight only some of whose sources are given is an error."""
        given = canonical({name: np.asarray(value) for name, value in weights.items()}, self.model.checkpoint_aliases)
        complete = set()
        for path, w in self.spec.items():
            have = set(w.sources) & given.keys()
            if w.sources and have == set(w.sources):
                complete.add(path)
            elif have:
                raise ValueError(f"update_weights: {sorted(have)} are fused with {sorted(set(w.sources) - have)} "
                                 f"into {path!r}; give them together.")
        return [(path, self._place(path, value)) for path, value in convert(self.spec, given, self.dtype, complete)]


def _check(name: str, value, shape: tuple[int, ...]) -> None:
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise ValueError(f"update_weights: tensor {name!r} is a {type(value).__name__}, not an array.")
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"update_weights: tensor {name!r} has shape {tuple(value.shape)}; "
                         f"the model's is {tuple(shape)}.")
    if not np.issubdtype(np.dtype(value.dtype), np.floating) and str(value.dtype) != "bfloat16":
        raise ValueError(f"update_weights: tensor {name!r} has dtype {value.dtype}; "
                         f"a floating-point one is needed.")
