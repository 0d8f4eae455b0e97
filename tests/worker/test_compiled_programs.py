"""Step programs compiled ahead of time at warm-up and saved to disk: a second engine loads
every one of them (nothing traced or compiled) and generates exactly what the first did,
including the extended sampler whose outputs are custom pytrees; a damaged saved program is
recompiled, never fatal."""
from __future__ import annotations

import logging

from jaxvllm import LLM, SamplingParams

ENGINE = dict(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128, num_gpu_blocks_override=64,
              skip_warmup=False, check_recompilation=True)
PROMPTS = [[5, 6, 7, 8], list(range(10, 50)), [20, 21]]
PARAMS = [SamplingParams(temperature=0, max_tokens=8, min_tokens=8),
          SamplingParams(temperature=0, max_tokens=8, min_tokens=8, repetition_penalty=1.3, logprobs=2),
          SamplingParams(temperature=0.8, seed=3, max_tokens=8, min_tokens=8)]


def _programs(runner):
    return (runner._forward, runner._prompt_logprobs, runner._sample, runner._sample_extended, runner._set_row)


def _generate(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), **ENGINE)
    runner = llm.llm_engine.engine_core.model_runner
    counts = (runner.num_compilations, sum(p.num_loaded for p in _programs(runner)))
    outputs = [(o.outputs[0].token_ids, o.outputs[0].cumulative_logprob)
               for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
    assert runner.num_compilations == counts[0]  # every step ran a warmed program
    expected = 2 * len(runner.token_buckets) + 4 * len(runner.request_buckets) + 1
    return counts, expected, outputs


def test_second_engine_loads_every_program_and_matches(tiny_model_dir, fresh_executables):
    (compiled, loaded), expected, outputs = _generate(tiny_model_dir)
    assert (compiled, loaded) == (expected, 0)
    assert len(list(fresh_executables.iterdir())) == expected
    (compiled, loaded), _, again = _generate(tiny_model_dir)
    assert (compiled, loaded) == (0, expected)
    assert again == outputs


def test_a_damaged_saved_program_is_recompiled(tiny_model_dir, fresh_executables, caplog):
    _, expected, outputs = _generate(tiny_model_dir)
    for path in fresh_executables.iterdir():
        path.write_bytes(b"not a program")
    with caplog.at_level(logging.WARNING, logger="jaxvllm.worker.compiled_programs"):
        (compiled, loaded), _, again = _generate(tiny_model_dir)
    assert (compiled, loaded) == (expected, 0) and again == outputs
    assert "its saved copy did not load" in caplog.text
