"""Orbax checkpoints of a loaded model: the weights as the engine holds them (dequantized
from GGUF, cast to the engine dtype, one array per layer and weight), written by `jaxvllm convert` with
their sharding metadata, next to the Hugging Face config and tokenizer files, so the
directory is a complete model path.

Restoring reads each device's slices straight from storage into the target shardings; a
GGUF load instead parses, dequantizes and transposes every tensor on the host first.
"""
from __future__ import annotations

import json
import os

MARKER = "jaxvllm_checkpoint.json"
PARAMS_DIR = "params"
# How the weight tree is laid out; checkpoints of another layout (jaxvllm before q/k/v and
# gate/up were fused: "per-layer"; before per-layer weights: stacked on a layer axis) are
# refused with a clear error, not a tree mismatch.
PARAMS_LAYOUT = "fused"


def is_orbax_checkpoint(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MARKER))


def save_checkpoint(out: str, params: dict, hf_config, tokenizer, dtype: str) -> None:
    """params: the model's weights as a pure dict of (sharded) jax Arrays."""
    import orbax.checkpoint as ocp  # here: the loader's other paths need not pay its import
    out = os.path.abspath(os.path.expanduser(out))
    if os.path.exists(out) and os.listdir(out):
        raise ValueError(f"Output directory {out} exists and is not empty.")
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(os.path.join(out, PARAMS_DIR), params)
    checkpointer.wait_until_finished()
    hf_config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    with open(os.path.join(out, MARKER), "w") as f:
        json.dump({"format": "orbax", "params": PARAMS_DIR, "params_layout": PARAMS_LAYOUT, "dtype": dtype,
                   "orbax_checkpoint_version": ocp.__version__}, f, indent=1)


def restore_params(path: str, target: dict) -> dict:
    """target: a pure dict of jax.ShapeDtypeStruct with the shardings (and dtype) wanted."""
    import orbax.checkpoint as ocp
    with open(os.path.join(path, MARKER)) as f:
        layout = json.load(f).get("params_layout", "stacked")
    if layout != PARAMS_LAYOUT:
        raise ValueError(f"{path} holds weights in the {layout!r} layout of another jaxvllm version "
                         f"(this one reads {PARAMS_LAYOUT!r}); convert the model again with `jaxvllm convert`.")
    return ocp.StandardCheckpointer().restore(os.path.join(path, PARAMS_DIR), target)
