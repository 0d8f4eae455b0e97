"""LLM.start_profile / stop_profile write a jax.profiler trace with the step's named spans."""
from __future__ import annotations

import pytest

from jaxvllm import LLM, SamplingParams

SPANS = [b"engine_step", b"schedule", b"prepare_inputs", b"model_step", b"sampling",
         b"update_from_output", b"output_processing"]


def test_trace_holds_the_named_spans(tiny_model_dir, tmp_path):
    llm = LLM(str(tiny_model_dir), max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128,
              num_gpu_blocks_override=32, skip_warmup=True)
    with pytest.raises(ValueError, match="profile_dir"):
        llm.start_profile()
    with pytest.raises(ValueError, match="No profile is being captured"):
        llm.stop_profile()
    assert llm.start_profile(str(tmp_path)) == str(tmp_path)
    llm.generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=4), use_tqdm=False)
    llm.stop_profile()
    traces = list(tmp_path.rglob("*.xplane.pb"))
    assert len(traces) == 1
    data = traces[0].read_bytes()
    missing = [s.decode() for s in SPANS if s not in data]
    assert not missing, f"spans missing from the trace: {missing}"
