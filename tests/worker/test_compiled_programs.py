"""Step programs compiled ahead of time at warm-up and saved to disk: a second engine loads
every one of them (nothing traced or compiled; in the background, each step waiting for its
own) and generates exactly what the first did, including the extended sampler whose outputs
are custom pytrees; a damaged saved program is recompiled, never fatal."""
from __future__ import annotations

import logging

from jaxvllm import LLM, SamplingParams
from jaxvllm.platforms import get_platform

ENGINE = dict(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128, num_gpu_blocks_override=64,
              skip_warmup=False, check_recompilation=True)
PROMPTS = [[5, 6, 7, 8], list(range(10, 50)), [20, 21]]
PARAMS = [SamplingParams(temperature=0, max_tokens=8, min_tokens=8),
          SamplingParams(temperature=0, max_tokens=8, min_tokens=8, repetition_penalty=1.3, logprobs=2),
          SamplingParams(temperature=0.8, seed=3, max_tokens=8, min_tokens=8)]


def _generate(tiny_model_dir, **engine):
    llm = LLM(str(tiny_model_dir), **{**ENGINE, **engine})
    runner = llm.llm_engine.engine_core.model_executor.driver_worker.model_runner
    compiled = runner.num_compilations
    outputs = [(o.outputs[0].token_ids, o.outputs[0].cumulative_logprob)
               for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
    for program in runner.programs:
        program.wait_until_loaded()
    loaded = sum(p.num_loaded for p in runner.programs)
    expected = 2 * len(runner.token_buckets) + 4 * len(runner.request_buckets) + 1
    return (compiled, runner.num_compilations - compiled, loaded), expected, outputs


def test_second_engine_loads_every_program_and_matches(tiny_model_dir, fresh_executables, monkeypatch):
    # The first engine compiles on 3 threads (an accelerator host's warm-up): each program
    # once, every one saved; the second, on the CPU's one, loads them all.
    with monkeypatch.context() as m:
        m.setattr(get_platform("cpu"), "compile_threads", 3)
        (compiled, later, loaded), expected, outputs = _generate(tiny_model_dir)
    assert (compiled, later, loaded) == (expected, 0, 0)  # every step ran a warmed program
    assert len(list(fresh_executables.iterdir())) == expected
    (compiled, later, loaded), _, again = _generate(tiny_model_dir)
    assert (compiled, later, loaded) == (0, 0, expected)
    assert again == outputs


def test_a_damaged_saved_program_is_recompiled(tiny_model_dir, fresh_executables, caplog):
    """It loads in the background, so it is found broken, and compiled, when first called:
    after warm-up (check_recompilation would say so, and is off here)."""
    _, expected, outputs = _generate(tiny_model_dir, check_recompilation=False)
    for path in fresh_executables.iterdir():
        path.write_bytes(b"not a program")
    with caplog.at_level(logging.WARNING, logger="jaxvllm.worker.compiled_programs"):
        (compiled, later, loaded), _, again = _generate(tiny_model_dir, check_recompilation=False)
    assert compiled == 0 and later > 0 and loaded == 0 and again == outputs
    assert "its saved copy did not load" in caplog.text


_CHILD = """
import json, sys
import jax
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
from jaxvllm import LLM, SamplingParams
llm = LLM(sys.argv[2], skip_warmup=sys.argv[3] == "skip", max_num_seqs=2, max_num_batched_tokens=16,
          max_model_len=64, num_gpu_blocks_override=16)
out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(temperature=0, max_tokens=4, min_tokens=4),
                   use_tqdm=False)
print(json.dumps(out[0].outputs[0].token_ids))
"""


def test_programs_already_in_the_xla_cache_are_saved_in_a_loadable_form(tiny_model_dir, tmp_path):
    """On CPU an executable that JAX's persistent cache loaded serializes into a copy that
    fails to run; warm-up therefore compiles the programs it saves afresh. Three processes:
    the first fills the XLA cache (no warm-up), the second warms up (and saves), the third
    loads and runs what the second saved."""
    import json
    import subprocess
    import sys

    runs = [subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "xla"), str(tiny_model_dir), mode],
                           capture_output=True, text=True, timeout=600) for mode in ("skip", "warm", "warm")]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    assert len({run.stdout.strip().splitlines()[-1] for run in runs}) == 1
    assert len(json.loads(runs[0].stdout.strip().splitlines()[-1])) == 4
    assert any((tmp_path / "xla" / "executables").iterdir())


def test_prune_removes_least_recently_used_programs_first(tmp_path):
    import os

    from jaxvllm.worker.compiled_programs import prune

    for age, name in enumerate(["newest", "middle", "oldest"]):
        path = tmp_path / f"{name}.bin"
        path.write_bytes(b"x" * 100)
        os.utime(path, (1_000_000 - age * 10, 1_000_000 - age * 10))
    (tmp_path / "other.txt").write_bytes(b"y" * 1000)  # not a program: never touched
    prune(str(tmp_path), 250)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["middle.bin", "newest.bin", "other.txt"]
    prune(str(tmp_path), 100)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["newest.bin", "other.txt"]
