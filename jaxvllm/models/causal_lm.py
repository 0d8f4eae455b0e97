"""CausalLM: what every family shares, driven by the family's weight spec (weight_spec.py):
the parameter tree built from it, a checkpoint converted by it, loaded weights stored by each
layer's quantization method, the head, and the forward that joins the family's parts.

A family (interfaces.ModelFamily) subclasses it with its args class, `weight_spec(args)`, and
its layer functions in `embed`, `forward_layers` and `final_norm`; the forward is those parts
in turn, which pipeline stages run one by one (worker/pipeline_runner.py).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxvllm.distributed.logical_axes import EMBED, SEQUENCE, VOCAB, constrain
from jaxvllm.layers.attention import AttentionMetadata
from jaxvllm.layers.linear import Linear
from jaxvllm.layers.quantization.config import QuantizationConfig
from jaxvllm.layers.quantization.quantized_matmul import embedding_rows
from jaxvllm.models import hf_weights
from jaxvllm.models.weight_spec import EXPERTS, LINEAR, Weight, canonical, convert, expand


class CausalLM(nnx.Module):
    checkpoint_aliases: tuple[tuple[str, str], ...] = ()  # weight_spec.canonical

    @staticmethod
    def weight_spec(args) -> list[Weight]:
        raise NotImplementedError

    def __init__(self, args, *, dtype=jnp.float32, linear_method=None, moe_method=None,
                 quant_config: QuantizationConfig | None = None, first_layer: int = 0):
        """Weights are zeros (a plain norm's ones): the model is built under nnx.eval_shape and
        its weights loaded next. linear_method / moe_method: the backend's (default XLA's),
        or quant_config, which picks a method per named layer. first_layer: a pipeline stage's
        first checkpoint layer (its own are numbered from 0)."""
        self.args, self.dtype, self.first_layer = args, jnp.dtype(dtype), first_layer
        self.quant_config = quant_config or QuantizationConfig(linear_method, moe_method)
        layers = [{} for _ in range(args.num_layers)]
        for path, w in self.weights().items():
            method = self.quant_method(path)
            if w.tied_to is not None and not method.copies_tied_head:
                setattr(self, path, None)  # the head is the embedding itself
                continue
            if w.kind == LINEAR:
                shape = method.weight_shape(w.shape[0], w.shape[1:])
            else:
                shape = method.weight_shape(w.shape, dtype) if w.kind == EXPERTS else w.shape
            param = nnx.Param(jnp.full(shape, w.init, w.dtype or dtype))
            if path.startswith("layers."):
                _, i, leaf = path.split(".", 2)
                layers[int(i)][leaf] = param
            else:
                setattr(self, path, param)
        self.layers = nnx.List([nnx.Dict(layer) for layer in layers])

    @property
    def linear_method(self):
        return self.quant_config.linear_method

    def weights(self) -> dict[str, Weight]:
        """This model's weights by path (its layers numbered from 0)."""
        return _expanded(type(self), self.args, self.first_layer)

    def quant_method(self, path: str):
        return self.quant_config.get_quant_method(self.weights()[path], path)

    # ---- the forward ------------------------------------------------------------------
    def __call__(self, input_ids: jax.Array, kv_cache: jax.Array, md: AttentionMetadata,
                 attend, layer_loop) -> tuple[jax.Array, jax.Array]:
        """One forward pass over a flat, padded token axis: final hidden states [tokens,
        hidden] and the updated cache (logits separately, for the rows that sample)."""
        h, kv_cache = self.forward_layers(self.embed(input_ids), kv_cache, md, attend, layer_loop)
        return self.final_norm(h), kv_cache

    def sliding_windows(self) -> list[int | None]:
        """Each layer's window as its attention applies it (None: full attention); the KV
        cache keeps a sliding layer's window only (core/single_type_kv_cache_manager.py)."""
        return layer_windows(self.args)

    def embed(self, input_ids: jax.Array) -> jax.Array:
        return constrain(self.embedding_rows(input_ids), SEQUENCE, EMBED)

    def embedding_rows(self, input_ids: jax.Array) -> jax.Array:
        """The embedding's rows of input_ids (kept quantized, a GGUF's are dequantized here)."""
        return embedding_rows(self.embed_tokens.get_value(), input_ids, self.dtype)

    def layer_weights(self) -> list[dict]:
        """Each layer's weights for the layer functions, its linears bound to their methods."""
        return [{leaf: self.bind(f"layers.{i}.{leaf}", p.get_value()) for leaf, p in layer.items()}
                for i, layer in enumerate(self.layers)]

    def bind(self, path: str, value: jax.Array):
        method = self.quant_method(path)
        return Linear(path, method, value) if self.weights()[path].kind == LINEAR else value

    def compute_logits(self, hidden: jax.Array, num_rows: jax.Array | None = None) -> jax.Array:
        """Logits of hidden's rows; with num_rows, those past it (padding) may be zeros."""
        head = self.embed_tokens.get_value().T if self.lm_head is None else self.lm_head.get_value()
        logits = self.bind("lm_head", head)(hidden, num_rows).astype(jnp.float32)
        return constrain(logits, SEQUENCE, VOCAB)  # vocab parallel

    # ---- loading ----------------------------------------------------------------------
    def load_hf_weights(self, weights: dict[str, np.ndarray], place=None) -> None:
        """A checkpoint's tensors (Hugging Face names, [out, in] linears) converted by the
        weight spec. place(path, host_array) -> jax.Array puts each on device (default: the
        default device); the tensor-parallel worker's places shard by shard."""
        place = place or hf_weights.default_place
        weights = canonical(weights, self.checkpoint_aliases)
        self.load_weights((path, place(path, value)) for path, value in convert(self.weights(), weights, self.dtype))

    def load_weights(self, weights) -> None:
        """(path, array) pairs in the loaded layout, on device; each stored as its layer's
        method keeps it. A tied head the method keeps its own copy of comes from the embedding
        (again whenever the embedding is loaded: updates may be partial)."""
        spec, loaded = self.weights(), set()
        for path, value in weights:
            method = self.quant_method(path)
            if method is not None:
                value = method.process_weights_after_loading(value)
            self._param(path).set_value(value)
            loaded.add(path)
        for path, w in spec.items():
            if w.tied_to in loaded and getattr(self, path) is not None:
                self._param(path).set_value(self.quant_method(path).process_weights_after_loading(
                    self._param(w.tied_to).get_value().T))

    def _param(self, path: str) -> nnx.Param:
        if path.startswith("layers."):
            _, i, leaf = path.split(".", 2)
            return self.layers[int(i)][leaf]
        return getattr(self, path)


@functools.cache
def layer_windows(args) -> list[int | None]:
    """Each layer's sliding window from a family's args (sliding_window, and sliding_layers
    where only some layers slide), None for full attention."""
    window, sliding = getattr(args, "sliding_window", None), getattr(args, "sliding_layers", ())
    return [window if s else None for s in sliding] if sliding else [window] * args.num_layers


def _expanded(cls, args, first_layer: int) -> dict[str, Weight]:
    return expand(cls.weight_spec(args), range(first_layer, first_layer + args.num_layers))
