"""Sleep, wake-up and update_weights at TP=2 on simulated CPU devices, with attention heads
padded (3 KV heads become 4): the update goes through the loader's fusing and padding and
lands in each device's shards, giving exactly a fresh TP=2 engine's greedy tokens."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from conftest import write_tiny_llama
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_sleep_and_update_weights_at_tp2(tmp_path):
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(default_model_path())
    model, new = tmp_path / "model", tmp_path / "new"
    shape = dict(hidden_size=48, num_heads=6, num_kv_heads=3)
    _, tensors = write_tiny_llama(model, **shape)
    write_tiny_llama(new, **shape)
    rng = np.random.default_rng(3)
    save_file({k: (v + 0.05 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in tensors.items()},
              str(new / "model.safetensors"))
    for path in (model, new):
        tokenizer.save_pretrained(path)
    # A compilation cache of its own: the fresh engine compiles the same programs again.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
           "JAXVLLM_XLA_CACHE": str(tmp_path / "xla")}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "lifecycle_check.py"), str(model), str(new), "2"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["after_wake_up"] == r["before"] == r["restored"]
    assert r["updated"] == r["fresh"] != r["before"]
    assert r["compiled"] == []
    assert r["asleep"] < 0.1 * r["awake"]
