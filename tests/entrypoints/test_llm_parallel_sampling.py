"""SamplingParams.n: one prompt, n samples that share its KV blocks through the prefix cache."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from test_llm_tiny import assert_pool_full, make_llm

from jaxvllm import SamplingParams

PROMPT = [int(t) for t in np.random.default_rng(7).integers(3, 256, 512)]
BLOCK = 16


@pytest.fixture(scope="module")
def long_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with room for a 512-token prompt and its samples."""
    path = tmp_path_factory.mktemp("tiny-llama-long")
    shutil.copytree(tiny_model_dir, path, dirs_exist_ok=True)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = 1024
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_n_samples_share_the_prompt_and_reproduce_with_a_seed(long_model_dir):
    llm = make_llm(long_model_dir, max_model_len=640, num_gpu_blocks_override=200)
    core = llm.llm_engine.engine_core
    params = SamplingParams(n=4, temperature=1.0, max_tokens=16, seed=11, logprobs=1)
    out = llm.generate(PROMPT, params, use_tqdm=False)
    assert len(out) == 1 and out[0].finished and out[0].request_id == "0"
    completions = out[0].outputs
    assert [c.index for c in completions] == [0, 1, 2, 3]
    samples = [tuple(c.token_ids) for c in completions]
    assert len(set(samples)) == 4 and all(len(s) == 16 for s in samples)
    assert all(len(c.logprobs) == 16 for c in completions)
    stats = core.get_stats()
    # The prompt is computed once: each later child finds all its full blocks but the
    # last cached (the last token is always computed, so its block is recomputed).
    print(f"n=4, 512-token prompt: prefill tokens computed {stats.num_prefill_tokens}, "
          f"prefix cache hits {stats.prefix_cache_hits} of {stats.prefix_cache_queries} queried")
    assert stats.prefix_cache_hits == 3 * (len(PROMPT) - BLOCK)
    assert stats.num_prefill_tokens == len(PROMPT) + 3 * BLOCK
    assert_pool_full(llm)

    again = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs
    assert [tuple(c.token_ids) for c in again] == samples
    # child i samples exactly like a lone request with seed + i
    alone = llm.generate([PROMPT] * 4, [SamplingParams(temperature=1.0, max_tokens=16, seed=11 + i)
                                        for i in range(4)], use_tqdm=False)
    assert [tuple(o.outputs[0].token_ids) for o in alone] == samples
    unseeded = llm.generate(PROMPT, SamplingParams(n=3, temperature=1.0, max_tokens=8), use_tqdm=False)
    assert len({tuple(c.token_ids) for c in unseeded[0].outputs}) == 3
    assert_pool_full(llm)


def test_n_with_an_abort_releases_every_child(tiny_model_dir):
    llm = make_llm(tiny_model_dir)
    engine = llm.llm_engine
    engine.add_request("p", PROMPT[:40], SamplingParams(n=3, max_tokens=50, temperature=1.0))
    engine.step()
    assert engine.has_unfinished_requests()
    engine.abort_request(["p"])
    assert not engine.has_unfinished_requests()
    engine.step()  # the core tells the worker to drop the aborted children
    assert_pool_full(llm)
