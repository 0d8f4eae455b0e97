"""A dict of arrays as a safetensors directory: how update_weights' arrays reach processes
that read their own shards (an engine process, MultiprocExecutor workers), since messages
between processes carry no arrays."""
from __future__ import annotations

import os

import numpy as np


def write_weights_dir(weights: dict, path: str) -> None:
    """Save `weights` ({name: numpy or jax array}) as `path`/model.safetensors, float32."""
    from safetensors.numpy import save_file
    os.makedirs(path, exist_ok=True)
    save_file({name: np.ascontiguousarray(np.asarray(value, np.float32)) for name, value in weights.items()},
              os.path.join(path, "model.safetensors"))
