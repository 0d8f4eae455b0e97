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
