"""The two layer loops (models/layer_loops.py) compute the same model: the unrolled one that
TPU and GPU steps run, checked here on the CPU against the CPU's fori_loop + switch."""
from __future__ import annotations

import numpy as np
from conftest import run_prefill, write_tiny_llama
from flax import nnx

from jaxvllm.models.layer_loops import switched_layers, unrolled_layers
from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM
from jaxvllm.models.loader import load_weights
from jaxvllm.transformers_utils.config import load_hf_config


def test_unrolled_layers_match_switched_layers(tmp_path):
    write_tiny_llama(tmp_path, num_layers=3)
    hf_config = load_hf_config(str(tmp_path))
    model = nnx.eval_shape(lambda: LlamaForCausalLM(LlamaArgs.from_hf_config(hf_config)))
    model.load_hf_weights(load_weights(str(tmp_path)))
    tokens = [int(t) for t in np.random.default_rng(0).integers(3, 256, 21)]
    np.testing.assert_allclose(run_prefill(model, tokens, layer_loop=unrolled_layers),
                               run_prefill(model, tokens, layer_loop=switched_layers), rtol=1e-5, atol=1e-5)
