"""benchmarks/random_weights.py: the random model's config reads back as the shapes asked
for (Llama-3-8B's included, with no weights drawn), and its parameter tree is the model's."""
from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import random_weights  # noqa: E402
from benchmarks.model_shapes import RANDOM_SHAPES, TINY  # noqa: E402
from jaxvllm.models.llama import LlamaArgs  # noqa: E402


@pytest.mark.parametrize("shape", sorted(RANDOM_SHAPES))
def test_config_reads_back_as_the_shapes(shape):
    args = RANDOM_SHAPES[shape]
    assert LlamaArgs.from_hf_config(random_weights.hf_config(args)) == args


def test_params_are_random_with_unit_norms():
    params = random_weights.random_params(TINY, jnp.float32)
    layer = params["layers"][0]
    group = TINY.num_heads // TINY.num_kv_heads  # q/k/v fused per KV head (models/llama.py)
    assert layer["qkv_proj"].shape == (TINY.hidden_size, TINY.num_kv_heads, group + 2, TINY.head_dim)
    assert np.all(np.asarray(layer["input_layernorm"]) == 1)
    std = float(jnp.std(layer["gate_up_proj"]))
    assert 0.015 < std < 0.025
    assert not np.allclose(np.asarray(params["layers"][0]["qkv_proj"]),
                           np.asarray(params["layers"][1]["qkv_proj"]))
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(params))


def test_tokenizer_decodes_every_id():
    tok = random_weights.word_tokenizer(TINY.vocab_size)
    assert tok.decode([5, TINY.vocab_size - 1]) == f"t5 t{TINY.vocab_size - 1}"


def test_checkpoint_is_written_whole_or_not_at_all_and_reused(tmp_path):
    out = tmp_path / "model"
    (tmp_path / "model.partial").mkdir()  # a write cut short earlier
    (tmp_path / "model.partial" / "junk").write_text("x")
    assert random_weights.write_random_checkpoint("tiny", out, "float32") == out
    assert not (tmp_path / "model.partial").exists()
    assert (out / "config.json").is_file() and (out / random_weights.STAMP).is_file()
    stamp = (out / random_weights.STAMP).stat().st_mtime_ns
    random_weights.write_random_checkpoint("tiny", out, "float32")  # same shapes: kept as is
    assert (out / random_weights.STAMP).stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="not empty"):
        random_weights.write_random_checkpoint("tiny", out, "float32", seed=1)
