"""What a model family is to the rest of jaxvllm (vLLM's model interfaces): an args class
read from the Hugging Face config, a declarative weight spec (models/weight_spec.py), and the
forward in parts. models/causal_lm.py implements everything but the family's own parts;
tests/models/test_model_contract.py holds every registered family to this Protocol."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import jax

from jaxvllm.layers.attention import AttentionMetadata
from jaxvllm.models.weight_spec import Weight


class ModelArgs(Protocol):
    """A family's hyperparameters: frozen and hashable (compiled programs are keyed by them)."""
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    tie_word_embeddings: bool

    @classmethod
    def from_hf_config(cls, cfg) -> "ModelArgs": ...

    def for_layers(self, layers: range) -> "ModelArgs":
        """The args of a model of only these decoder layers (a pipeline stage's)."""


@runtime_checkable
class ModelFamily(Protocol):
    args: ModelArgs
    checkpoint_aliases: tuple[tuple[str, str], ...]

    @staticmethod
    def weight_spec(args) -> list[Weight]:
        """Every weight: path ("{i}": the layer), shape, partition, checkpoint sources."""

    def weights(self) -> dict[str, Weight]: ...

    # The forward in the parts a pipeline stage runs: embed on the first stage,
    # forward_layers on every stage, final_norm and compute_logits on the last.
    def embed(self, input_ids: jax.Array) -> jax.Array: ...

    def forward_layers(self, h: jax.Array, kv_cache: jax.Array, md: AttentionMetadata, attend,
                       layer_loop) -> tuple[jax.Array, jax.Array]: ...

    def final_norm(self, h: jax.Array) -> jax.Array: ...

    def compute_logits(self, hidden: jax.Array, num_rows: jax.Array | None = None) -> jax.Array: ...

    def __call__(self, input_ids: jax.Array, kv_cache: jax.Array, md: AttentionMetadata, attend,
                 layer_loop) -> tuple[jax.Array, jax.Array]: ...

    def load_hf_weights(self, weights: dict, place=None) -> None:
        """A checkpoint's tensors by their Hugging Face names, converted by the weight spec."""

    def load_weights(self, weights) -> None:
        """(path, array) pairs in the loaded layout, stored as each layer's method keeps them."""
