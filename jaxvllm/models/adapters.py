"""A causal LM family as a sequence classifier (vLLM's `as_seq_cls_model`): the same decoder,
whose head is the checkpoint's `score` projection [hidden -> num_labels] instead of the LM
head (`*ForSequenceClassification` checkpoints have no lm_head). The pooling runner applies
it to the pooled hidden state through `compute_logits`, as the generate runner applies the
LM head."""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxvllm.models.weight_spec import linear


@functools.cache
def as_seq_cls_model(model_cls: type, args_cls: type) -> tuple[type, type]:
    """(model class, args class) of model_cls with a score head; cached so that each family
    has one classifier class (compiled programs and weight specs are keyed by it)."""

    @dataclasses.dataclass(frozen=True)
    class SeqClsArgs(args_cls):
        num_labels: int = 1

        @classmethod
        def from_hf_config(cls, cfg):
            base = args_cls.from_hf_config(cfg)
            return cls(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                       num_labels=int(getattr(cfg, "num_labels", 1)))

    def weight_spec(a) -> list:
        spec = [w for w in model_cls.weight_spec(a) if w.path != "lm_head"]
        return spec + [linear("score", a.hidden_size, (a.num_labels,), (None, None), ["score.weight"],
                              stage="last")]

    class SeqClsModel(model_cls):
        def compute_logits(self, hidden: jax.Array, num_rows: jax.Array | None = None) -> jax.Array:
            """The labels' logits of hidden's rows (pooled hidden states)."""
            return self.bind("score", self.score.get_value())(hidden, num_rows).astype(jnp.float32)

    SeqClsModel.weight_spec = staticmethod(weight_spec)
    name = model_cls.__name__.replace("ForCausalLM", "ForSequenceClassification")
    SeqClsModel.__name__ = SeqClsModel.__qualname__ = name
    SeqClsArgs.__name__ = SeqClsArgs.__qualname__ = args_cls.__name__.replace("Args", "SeqClsArgs")
    return SeqClsModel, SeqClsArgs
