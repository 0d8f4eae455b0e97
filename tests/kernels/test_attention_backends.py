"""The Pallas and native kernels as the model's attention backend: its selection per platform
(jaxvllm/backends), and
greedy tokens of the tiny Llama through LLM with the kernels (interpret mode on CPU) equal
to the xla backend's, over prefill, chunked prefill and mixed decode steps."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import backend_for

from jaxvllm import LLM, SamplingParams
from jaxvllm.backends.cpu import native_kernels_available
from jaxvllm.kernels.cpu import build as native_build

CPU_AUTO = "native" if native_kernels_available() else "xla"


@pytest.mark.parametrize("backend,platform,want", [
    ("auto", "cpu", (CPU_AUTO, False)),
    ("auto", "tpu", ("tpu", False)),
    ("auto", "gpu", ("gpu", False)),
    ("auto", "cuda", ("gpu", False)),
    ("pallas", "cpu", ("tpu", True)),
    ("pallas", "gpu", ("gpu", False)),
    ("pallas-gpu", "cpu", ("gpu", True)),
    ("pallas-tpu", "tpu", ("tpu", False)),
    ("xla", "tpu", ("xla", False)),
    ("xla", "cpu", ("xla", False)),
])
def test_backend_selection(backend, platform, want):
    chosen = backend_for(platform, backend)
    assert (chosen.attention_kernel, chosen.interpret) == want


def test_unknown_backend_rejected():
    with pytest.raises(ValueError, match="attention_backend"):
        backend_for("cpu", "flash")


def test_native_backend_is_cpu_only():
    with pytest.raises(ValueError, match="CPU only"):
        backend_for("tpu", "native")


PROMPTS = [[int(t) for t in np.random.default_rng(i).integers(3, 256, n)] for i, n in enumerate([5, 21, 1])]


def greedy(path, backend):
    llm = LLM(str(path), max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64,
              num_gpu_blocks_override=32, skip_warmup=True, attention_backend=backend)
    params = SamplingParams(temperature=0, max_tokens=6, min_tokens=6)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def xla_tokens(tiny_model_dir):
    return greedy(tiny_model_dir, "xla")


@pytest.mark.parametrize("backend", ["pallas-tpu", "pallas-gpu", pytest.param("native", marks=pytest.mark.skipif(
    not native_build.available(), reason="no C++ compiler"))])
def test_greedy_matches_xla_backend(tiny_model_dir, xla_tokens, backend):
    assert greedy(tiny_model_dir, backend) == xla_tokens
