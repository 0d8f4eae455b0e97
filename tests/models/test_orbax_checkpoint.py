"""`jaxvllm convert` writes an Orbax checkpoint that loads back bit-identical: the same
weights, the same greedy tokens, the same tokenizer."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from flax import nnx

from jaxvllm import LLM, SamplingParams
from jaxvllm.entrypoints.cli import main
from jaxvllm.transformers_utils.orbax_checkpoint import MARKER

ENGINE = dict(skip_warmup=True, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128,
              num_gpu_blocks_override=32)


@pytest.fixture(scope="module")
def orbax_dir(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("orbax") / "tiny-orbax"
    assert main(["convert", str(tiny_model_dir), str(out)]) == 0
    return out


def _params(llm) -> dict:
    flat = nnx.to_flat_state(llm.llm_engine.engine_core.model_executor.driver_worker.model_runner.params)
    return {path: np.asarray(v.get_value()) for path, v in flat}


def test_orbax_round_trip_is_bit_identical(tiny_model_dir, orbax_dir):
    original, restored = LLM(str(tiny_model_dir), **ENGINE), LLM(str(orbax_dir), **ENGINE)
    a, b = _params(original), _params(restored)
    assert a.keys() == b.keys() and len(a) >= 10
    for path in a:
        assert a[path].dtype == b[path].dtype and np.array_equal(a[path], b[path]), path
    prompts = [{"prompt_token_ids": p} for p in ([5, 6, 7, 8], [9, 10, 11, 12, 13], [40])]
    greedy = SamplingParams(temperature=0, max_tokens=12, min_tokens=12)
    tokens = [[o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
              for llm in (original, restored)]
    assert tokens[0] == tokens[1]
    text = "The capital of France is"
    assert restored.get_tokenizer().encode(text) == original.get_tokenizer().encode(text)


def test_convert_refuses_a_non_empty_output_directory(tiny_model_dir, orbax_dir, capsys):
    assert main(["convert", str(tiny_model_dir), str(orbax_dir)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err


def test_checkpoint_of_another_layout_is_refused_by_name(tiny_model_dir, orbax_dir, tmp_path):
    # A checkpoint from before per-layer weights (no params_layout: stacked) must not load
    # into a mismatched tree; it names the fix.
    old = tmp_path / "old"
    shutil.copytree(orbax_dir, old)
    marker = old / MARKER
    meta = json.loads(marker.read_text())
    del meta["params_layout"]
    marker.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="'stacked' layout.*jaxvllm convert"):
        LLM(str(old), **ENGINE)
