"""update_weights' conversion for every registered architecture: a full update by the
checkpoint's names leaves exactly the weights a fresh load of those tensors gives (each
family's own fusing and layout), and a partial one changes only the weights made from the
tensors given (the family's weight spec says which)."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from family_checkpoints import write_checkpoint
from flax import nnx

from jaxvllm.distributed.mesh import make_mesh
from jaxvllm.distributed.partition import param_name
from jaxvllm.models.loader import load_weights
from jaxvllm.models.registry import get_model_class, supported_architectures
from jaxvllm.models.weight_update import WeightUpdater
from jaxvllm.transformers_utils.config import load_hf_config


def load(hf_config, weights) -> nnx.Module:
    model_cls, args_cls = get_model_class(hf_config)
    model = nnx.eval_shape(lambda: model_cls(args_cls.from_hf_config(hf_config)))
    model.load_hf_weights(weights)
    return model


def params(model) -> dict[str, np.ndarray]:
    return {param_name(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(nnx.state(model))[0]}


@pytest.mark.parametrize("arch", supported_architectures())
def test_update_by_checkpoint_names(arch, tmp_path):
    write_checkpoint(arch, tmp_path)
    hf_config, weights = load_hf_config(str(tmp_path)), load_weights(str(tmp_path))
    rng = np.random.default_rng(0)
    new = {k: (v + 0.05 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in weights.items()}
    model = load(hf_config, weights)
    updater = WeightUpdater(model, make_mesh(1), hf_config, {k: v.shape for k, v in weights.items()})
    old = params(model)
    model.load_weights(updater.prepare(new))
    expected = params(load(hf_config, new))
    assert params(model).keys() == expected.keys()
    for name, value in params(model).items():
        np.testing.assert_array_equal(value, expected[name], err_msg=name)

    one = next(k for k in weights
               if k.endswith(("layers.1.self_attn.o_proj.weight", "layers.1.self_attn.out_proj.weight")))
    model.load_weights(updater.prepare({one: weights[one]}))
    changed = {name for name, value in params(model).items() if not np.array_equal(value, expected[name])}
    assert changed == {"layers.1.o_proj"}
    np.testing.assert_array_equal(params(model)["layers.1.o_proj"], old["layers.1.o_proj"])
