"""OPT (facebook/opt-*): learned positions (offset 2), LayerNorm with biases, ReLU MLP,
biases on every projection, and project_in/project_out where the embedding is narrower than
the hidden size (opt-350m). Multi-head attention: its q/k/v are fused as Llama's are, groups
of one query head (models/llama.py). The learned positions are added where the first
pipeline stage's layers begin."""
from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np

from jaxvllm.distributed.logical_axes import EMBED, HEADS, MLP, SEQUENCE, VOCAB, constrain
from jaxvllm.layers.attention import AttentionMetadata
from jaxvllm.layers.layernorm import layer_norm
from jaxvllm.models.causal_lm import CausalLM
from jaxvllm.models.weight_spec import Weight, linear, vector

POSITION_OFFSET = 2  # OPT's position table starts two rows in (a fairseq padding convention)


@dataclasses.dataclass(frozen=True)
class OPTArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # ffn_dim
    num_layers: int
    num_heads: int
    num_kv_heads: int  # = num_heads (kept apart so that heads can be padded for tensor parallelism)
    head_dim: int
    word_embed_proj_dim: int
    max_position_embeddings: int
    do_layer_norm_before: bool
    final_layer_norm: bool
    tie_word_embeddings: bool

    @classmethod
    def from_hf_config(cls, cfg) -> "OPTArgs":
        if cfg.activation_function != "relu":
            raise ValueError(f"OPT with activation_function={cfg.activation_function!r} is not supported (relu).")
        if not cfg.enable_bias or not cfg.layer_norm_elementwise_affine:
            raise ValueError("OPT without enable_bias or layer_norm_elementwise_affine is not supported.")
        return cls(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.ffn_dim,
            num_layers=cfg.num_hidden_layers, num_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_attention_heads, head_dim=cfg.hidden_size // cfg.num_attention_heads,
            word_embed_proj_dim=cfg.word_embed_proj_dim, max_position_embeddings=cfg.max_position_embeddings,
            do_layer_norm_before=cfg.do_layer_norm_before,
            final_layer_norm=cfg.do_layer_norm_before and not cfg._remove_final_layer_norm,
            tie_word_embeddings=bool(cfg.tie_word_embeddings))

    def for_layers(self, layers: range) -> "OPTArgs":
        return dataclasses.replace(self, num_layers=len(layers))


def attention_inputs(a: OPTArgs, w: dict, h: jax.Array, *, num_tokens: jax.Array):
    T = h.shape[0]
    x = layer_norm(h, w["self_attn_layer_norm"], w["self_attn_layer_norm_bias"]) if a.do_layer_norm_before else h
    qkv = w["qkv_proj"](x, num_tokens).reshape(T, a.num_kv_heads, 3, a.head_dim) + w["qkv_bias"]
    qkv = constrain(qkv, SEQUENCE, HEADS, None, None)
    return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]


def mlp_block(a: OPTArgs, w: dict, h: jax.Array, o: jax.Array, *, num_tokens: jax.Array) -> jax.Array:
    T = h.shape[0]
    h = constrain(h + w["o_proj"](o.reshape(T, -1), num_tokens) + w["o_bias"], SEQUENCE, EMBED)
    if not a.do_layer_norm_before:
        h = layer_norm(h, w["self_attn_layer_norm"], w["self_attn_layer_norm_bias"])
    x = layer_norm(h, w["final_layer_norm"], w["final_layer_norm_bias"]) if a.do_layer_norm_before else h
    up = constrain(jax.nn.relu(w["fc1"](x, num_tokens) + w["fc1_bias"]), SEQUENCE, MLP)
    h = constrain(h + w["fc2"](up, num_tokens) + w["fc2_bias"], SEQUENCE, EMBED)
    return h if a.do_layer_norm_before else layer_norm(h, w["final_layer_norm"], w["final_layer_norm_bias"])


def fuse_qkv(a: OPTArgs, key: str, q, k, v):
    """[out, in] q/k/v (or [out] biases) -> [in, heads, 3, head_dim] (biases: [heads, 3, head_dim])."""
    d = a.head_dim
    if not q.shape == k.shape == v.shape or q.shape[0] % d:
        raise ValueError(f"Tensor {key!r}: q/k/v of shapes {q.shape}, {k.shape}, {v.shape} do not fit "
                         f"the model config (heads of {d}).")
    qkv = np.stack([x.reshape(-1, d, *x.shape[1:]) for x in (q, k, v)], axis=1)  # [heads, 3, d(, in)]
    return qkv.transpose(3, 0, 1, 2) if qkv.ndim == 4 else qkv


def weight_spec(a: OPTArgs) -> list[Weight]:
    p, d, heads, H = "model.decoder.layers.{i}.", a.head_dim, a.num_kv_heads, a.hidden_size
    attn = p + "self_attn."
    spec = [
        Weight("embed_tokens", (a.vocab_size, a.word_embed_proj_dim), (VOCAB, EMBED),
               ("model.decoder.embed_tokens.weight",), stage="first"),
        Weight("embed_positions", (a.max_position_embeddings + POSITION_OFFSET, H), (None, None),
               ("model.decoder.embed_positions.weight",), stage="first"),
        linear("lm_head", a.word_embed_proj_dim, (a.vocab_size,), (EMBED, VOCAB), stage="last",
               **(dict(tied_to="embed_tokens") if a.tie_word_embeddings else dict(sources=["lm_head.weight"]))),
        linear("layers.{i}.qkv_proj", H, (heads, 3, d), (EMBED, HEADS, None, None),
               [f"{attn}{x}_proj.weight" for x in "qkv"], functools.partial(fuse_qkv, a),
               name=attn + "qkv_proj.weight"),
        Weight("layers.{i}.qkv_bias", (heads, 3, d), (HEADS, None, None), tuple(f"{attn}{x}_proj.bias" for x in "qkv"),
               functools.partial(fuse_qkv, a), name=attn + "qkv_proj.bias"),
        linear("layers.{i}.o_proj", heads * d, (H,), (HEADS, EMBED), [attn + "out_proj.weight"]),
        vector("layers.{i}.o_bias", H, attn + "out_proj.bias"),
        linear("layers.{i}.fc1", H, (a.intermediate_size,), (EMBED, MLP), [p + "fc1.weight"]),
        vector("layers.{i}.fc1_bias", a.intermediate_size, p + "fc1.bias", axes=(MLP,)),
        linear("layers.{i}.fc2", a.intermediate_size, (H,), (MLP, EMBED), [p + "fc2.weight"]),
        vector("layers.{i}.fc2_bias", H, p + "fc2.bias"),
    ]
    for norm in ("self_attn_layer_norm", "final_layer_norm"):
        spec += [vector(f"layers.{{i}}.{norm}", H, f"{p}{norm}.weight", init=1.0),
                 vector(f"layers.{{i}}.{norm}_bias", H, f"{p}{norm}.bias")]
    if a.final_layer_norm:
        spec += [vector("final_layer_norm", H, "model.decoder.final_layer_norm.weight", init=1.0, stage="last"),
                 vector("final_layer_norm_bias", H, "model.decoder.final_layer_norm.bias", stage="last")]
    if a.word_embed_proj_dim != H:
        spec += [linear("project_in", a.word_embed_proj_dim, (H,), (None, None), ["model.decoder.project_in.weight"],
                        stage="first"),
                 linear("project_out", H, (a.word_embed_proj_dim,), (None, None),
                        ["model.decoder.project_out.weight"], stage="last")]
    return spec


class OPTForCausalLM(CausalLM):
    weight_spec = staticmethod(weight_spec)
    # facebook/opt-* checkpoints name the decoder without the "model." that transformers writes.
    checkpoint_aliases = (("model.decoder.", "decoder."),)

    def embed(self, input_ids: jax.Array) -> jax.Array:
        h = self.embedding_rows(input_ids)
        if self.args.word_embed_proj_dim != self.args.hidden_size:
            h = self.bind("project_in", self.project_in.get_value())(h)
        return h

    def forward_layers(self, h: jax.Array, kv_cache: jax.Array, md: AttentionMetadata, attend,
                       layer_loop) -> tuple[jax.Array, jax.Array]:
        """The learned positions join the embedding first, where this model holds them (the
        first pipeline stage: their spec's stage)."""
        a = self.args
        num_tokens = md.cu_q_lens[md.num_seqs[0]]
        qkv = functools.partial(attention_inputs, a, num_tokens=num_tokens)
        mlp = functools.partial(mlp_block, a, num_tokens=num_tokens)

        def attend_layer(q, k, v, kv_cache, layer):
            return attend(q, k, v, kv_cache, layer, md, a.head_dim ** -0.5)

        if self.embed_positions is not None:
            h = h + self.embed_positions.get_value()[md.positions + POSITION_OFFSET]
        return layer_loop(self.layer_weights(), qkv, attend_layer, mlp, constrain(h, SEQUENCE, EMBED), kv_cache)

    def final_norm(self, h: jax.Array) -> jax.Array:
        """The final LayerNorm where the layout has one (before project_out, which
        compute_logits applies)."""
        if not self.args.final_layer_norm:
            return h
        return layer_norm(h, self.final_layer_norm.get_value(), self.final_layer_norm_bias.get_value())

    def compute_logits(self, hidden: jax.Array, num_rows: jax.Array | None = None) -> jax.Array:
        if self.args.word_embed_proj_dim != self.args.hidden_size:
            hidden = self.bind("project_out", self.project_out.get_value())(hidden, num_rows)
        return super().compute_logits(hidden, num_rows)
