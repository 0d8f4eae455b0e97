"""Tensor and pipeline parallelism for every model family beyond Llama: greedy tokens at TP=2
(and the extended sampler's) and at PP=2 equal TP=1's on simulated CPU devices (tp_check.py,
one subprocess for all families). OPT, whose forward is its own, is not split into stages."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "models"))

from family_checkpoints import FAMILIES, write_family_checkpoint  # noqa: E402

PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15] * 3, [40, 41]]
PIPELINED = sorted(set(FAMILIES) - {"OPTForCausalLM"})


@pytest.fixture(scope="module")
def tp_results(tmp_path_factory) -> dict:
    paths = {arch: tmp_path_factory.mktemp(arch) for arch in FAMILIES}
    for arch, path in paths.items():
        write_family_checkpoint(arch, path)
    layouts = {str(path): "1,2,pp2" if arch in PIPELINED else "1,2" for arch, path in paths.items()}
    script = (f"import sys; sys.path.insert(0, {HERE!r}); import tp_check\n"
              f"for path, layouts in {layouts!r}.items():\n"
              f"    tp_check.main(path, layouts, {json.dumps(PROMPTS)!r}, '8')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return dict(zip(paths, map(json.loads, lines)))


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_tp2_matches_tp1(tp_results, arch):
    r = tp_results[arch]
    assert r["2"]["tokens"] == r["1"]["tokens"]
    for (tokens, cum), (ref_tokens, ref_cum) in zip(r["2"]["extended"], r["1"]["extended"]):
        assert tokens == ref_tokens and abs(cum - ref_cum) < 1e-4
    # Really split: the KV cache by KV head, the fused q/k/v by KV head.
    assert [s[4] for s in r["2"]["kv_cache"]["shards"]] == [r["1"]["kv_cache"]["shape"][4] // 2] * 2
    qkv = r["2"]["weights"]["layers.0.qkv_proj"]
    assert qkv["shards"] == [[qkv["shape"][0], qkv["shape"][1] // 2, *qkv["shape"][2:]]] * 2


@pytest.mark.parametrize("arch", PIPELINED)
def test_pp2_matches_tp1(tp_results, arch):
    """Two stages, the layers split as stage_layer_ranges says (Gemma 3's 3 layers: its two
    sliding-window layers in the first stage, the global one in the second)."""
    r = tp_results[arch]
    assert r["pp2"]["tokens"] == r["1"]["tokens"]
    num_layers = FAMILIES[arch][1]["num_hidden_layers"]  # at TP=1 Gemma's cache has a slot per group's layer
    assert [shape[0] for shape in r["pp2"]["kv_cache"]] == [(num_layers + 1) // 2, num_layers // 2]
