"""Random weights of a model's shapes, made on the device, and a complete model directory
around them, so the end-to-end benchmarks run Llama-3-8B shapes with nothing to download.

Random, not zeros: a GPU's clocks and power depend on the data its matmuls multiply, so a
model of zeros times faster than a real one. Each tensor is drawn on the device by a small
jitted program, one tensor at a time (no host ever holds the model in float32, nor twice).
The directory is the engine's own Orbax checkpoint (transformers_utils/orbax_checkpoint.py): the engine
restores it straight into device memory, as it does a model that `jaxvllm convert` wrote,
instead of parsing and casting 16 GB of safetensors on the host. It holds a Hugging Face
config and a stand-in tokenizer (one word per token id, `t0` ... `tN`) that covers the
vocabulary, since the engine detokenizes what it generates.

    python benchmarks/random_weights.py llama3-8b /tmp/llama3-8b-random [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.model_shapes import RANDOM_SHAPES  # noqa: E402
from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM  # noqa: E402

STAMP = "random_weights.json"  # what the directory holds, so a second run reuses it


def random_params(args: LlamaArgs, dtype, seed: int = 0) -> dict:
    """The model's parameter tree (nnx pure dict) with N(0, 0.02) weights and unit norms,
    each drawn on the default device."""
    from flax import nnx
    abstract = nnx.to_pure_dict(nnx.state(nnx.eval_shape(lambda: LlamaForCausalLM(args, dtype=dtype))))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    key = jax.random.key(seed)
    out = []
    for i, (path, leaf) in enumerate(leaves):
        name = jax.tree_util.keystr(path)
        if name.endswith("norm']"):
            out.append(_ones(leaf.shape, leaf.dtype))
        else:
            out.append(_normal(jax.random.fold_in(key, i), leaf.shape, leaf.dtype))
    return jax.tree_util.tree_unflatten(treedef, out)


@jax.jit(static_argnums=(0, 1))
def _ones(shape, dtype):
    return jnp.ones(shape, dtype)


@jax.jit(static_argnums=(1, 2))
def _normal(key, shape, dtype):
    return (0.02 * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def hf_config(args: LlamaArgs):
    """The Hugging Face LlamaConfig of these shapes (what the engine reads from config.json)."""
    import transformers
    cfg = transformers.LlamaConfig(
        vocab_size=args.vocab_size, hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
        num_hidden_layers=args.num_layers, num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads, head_dim=args.head_dim, rms_norm_eps=args.rms_norm_eps,
        rope_theta=args.rope_theta, tie_word_embeddings=args.tie_word_embeddings,
        max_position_embeddings=args.max_position_embeddings, bos_token_id=1, eos_token_id=2)
    cfg.architectures = ["LlamaForCausalLM"]
    return cfg


def word_tokenizer(vocab_size: int):
    """A tokenizer with one whitespace-separated word per id (`t0` ... `t{vocab_size-1}`):
    encodes and decodes every id the model can generate, with nothing to download."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1",
                                                eos_token="t2", pad_token="t0")


def write_random_checkpoint(shape: str | LlamaArgs, out: str | Path, dtype="bfloat16", seed: int = 0) -> Path:
    """A model directory of random weights at `out` (kept and reused when it already holds
    the same shapes, dtype and seed). Returns its path."""
    from jaxvllm.transformers_utils.orbax_checkpoint import save_checkpoint
    args = RANDOM_SHAPES[shape] if isinstance(shape, str) else shape
    out = Path(out).expanduser().resolve()
    dtype = jnp.dtype(dtype)
    stamp = {"args": repr(args), "dtype": dtype.name, "seed": seed}
    if (out / STAMP).is_file() and json.loads((out / STAMP).read_text()) == stamp:
        return out
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty and holds no random weights of these shapes; remove it first.")
    # Written beside it and renamed when complete: a write cut short (a step out of time)
    # leaves no directory that looks whole, and the next call starts it again.
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    start = time.perf_counter()
    params = random_params(args, dtype, seed)
    jax.block_until_ready(params)
    drawn = time.perf_counter() - start
    save_checkpoint(str(partial), params, hf_config(args), word_tokenizer(args.vocab_size), dtype.name)
    (partial / STAMP).write_text(json.dumps(stamp))
    if out.exists():
        out.rmdir()  # empty (checked above)
    partial.rename(out)
    nbytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(params))
    print(f"random weights: {nbytes / 1e9:.2f} GB {dtype.name} drawn on {jax.devices()[0].device_kind} in "
          f"{drawn:.1f} s, written to {out} in {time.perf_counter() - start - drawn:.1f} s", flush=True)
    return out


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=sorted(RANDOM_SHAPES))
    ap.add_argument("out")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    return write_random_checkpoint(a.shape, a.out, a.dtype, a.seed)


if __name__ == "__main__":
    main()
