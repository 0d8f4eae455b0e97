"""get_stage_models: a model split into pipeline stages, each a model of the same class
holding only its own decoder layers (numbered from 0, read from the checkpoint's own layers),
placed on its own mesh.

The checkpoint is read once; each stage converts its layers' tensors. The weights outside
the layers go where their spec says (`stage`): the embedding to the first stage, the final
norm and the head to the last (and the embedding there too where the head is tied to it), so
no stage holds a weight it does not run.
"""
from __future__ import annotations

from flax import nnx
from jax.sharding import Mesh

from jaxvllm.models.loader import load_weights
from jaxvllm.models.model_loader import get_model
from jaxvllm.transformers_utils.orbax_checkpoint import is_orbax_checkpoint


def get_stage_models(model_path: str, hf_config, meshes: list[Mesh], layer_ranges: list[range], *, dtype: str,
                     expert_parallel: bool = False, linear_method=None, moe_method=None,
                     keep_gguf_blocks: bool = False) -> list[nnx.Module]:
    if is_orbax_checkpoint(model_path):
        raise ValueError("pipeline_parallel_size > 1 loads GGUF or safetensors checkpoints, not "
                         "Orbax ones; serve the original checkpoint.")
    weights = load_weights(model_path, keep_gguf_blocks)
    stages = []
    for s, (mesh, layers) in enumerate(zip(meshes, layer_ranges)):
        model = get_model(model_path, hf_config, mesh, dtype=dtype, expert_parallel=expert_parallel,
                          linear_method=linear_method, moe_method=moe_method,
                          weights=weights, layers=layers)
        held = stage_weights(model, first=s == 0, last=s == len(meshes) - 1)
        for path in model.weights():
            if not path.startswith("layers.") and path not in held:
                setattr(model, path, None)
        stages.append(model)
    return stages


def stage_weights(model: nnx.Module, *, first: bool, last: bool) -> set[str]:
    """The paths outside the layers a stage holds: those of its stage, and on the last stage
    the weight a tied head is made of (unless the method keeps its own copy of the head)."""
    spec = model.weights()
    held = {p for p, w in spec.items() if w.stage == "first" and first or w.stage == "last" and last}
    if last:
        held |= {w.tied_to for p, w in spec.items() if w.tied_to and getattr(model, p) is None}
    return held
