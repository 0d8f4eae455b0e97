"""The model family contract (models/interfaces.py, models/weight_spec.py) for every
registered architecture: the class is a ModelFamily; its weight spec is complete (every
checkpoint tensor feeds exactly one weight, every parameter is fed); and the memory plan
(jaxvllm/memory_plan.py, from the spec alone) is the bytes the loaded model holds, with float
weights and with 8-bit ones, experts included."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from family_checkpoints import write_checkpoint
from flax import nnx

from jaxvllm.backends import get_backend
from jaxvllm.distributed.partition import param_name
from jaxvllm.layers.quantization.config import QuantizationConfig
from jaxvllm.memory_plan import engine_config, weight_bytes
from jaxvllm.models.interfaces import ModelFamily
from jaxvllm.models.loader import load_weights
from jaxvllm.models.model_loader import build_model, model_args
from jaxvllm.models.registry import get_model_class, supported_architectures
from jaxvllm.models.weight_spec import canonical
from jaxvllm.platforms import get_platform
from jaxvllm.transformers_utils.config import load_hf_config


@pytest.fixture(scope="module", params=supported_architectures())
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    write_checkpoint(request.param, path)
    return load_hf_config(str(path)), load_weights(str(path))


def test_weight_spec_is_complete(checkpoint):
    hf_config, weights = checkpoint
    model_cls, args_cls = get_model_class(hf_config)
    model = nnx.eval_shape(lambda: model_cls(args_cls.from_hf_config(hf_config)))
    assert isinstance(model, ModelFamily)
    spec = model.weights()
    sources = [s for w in spec.values() for s in w.sources]
    assert len(sources) == len(set(sources)), "a checkpoint tensor feeds two weights"
    assert set(sources) == set(canonical(weights, model.checkpoint_aliases))
    params = {param_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(nnx.state(model))[0]}
    assert params == {path for path, w in spec.items() if getattr(model, path, True) is not None}
    assert all(w.sources or w.tied_to for w in spec.values())


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_memory_plan_is_what_the_model_holds(checkpoint, quantization):
    hf_config, weights = checkpoint
    model_cls, args_cls = get_model_class(hf_config)
    args = model_args(model_cls, args_cls.from_hf_config(hf_config), 1)
    backend = get_backend(engine_config(quantization=quantization), get_platform("tpu"))
    quant = QuantizationConfig(backend.linear_method, backend.moe_method)
    model = build_model(model_cls, args, dtype=jnp.float32, linear_method=quant.linear_method,
                        moe_method=quant.moe_method)
    model.load_hf_weights(weights)
    held = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
    assert sum(weight_bytes(model_cls, args, quant, jnp.float32)) == held
