"""The engine's own step lowered for a TPU and an NVIDIA GPU on this CPU (benchmarks/lower_step.py,
`model_step.py --lower`): for the default model's and Llama-3-8B's shapes the forward and every
sampler variant hold no conditional and no loop, the forward calls the platform's attention
kernel once per layer, and it updates the KV cache in place."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import model_step  # noqa: E402
from benchmarks.family_configs import ARCHITECTURES, family_args  # noqa: E402
from benchmarks.lower_step import KERNEL_TARGETS, lower_step, program_rows  # noqa: E402
from benchmarks.model_shapes import SHAPES, SMOLLM2, TINY  # noqa: E402
from jaxvllm.backends.backend import Backend  # noqa: E402
from jaxvllm.models.layer_loops import switched_layers  # noqa: E402

# Lane-sized heads (Mosaic tiles head_dim by 128); three layers, so Gemma's differ in window.
FAMILY_SHAPE = dataclasses.replace(TINY, num_layers=3, hidden_size=256, num_heads=2, num_kv_heads=1,
                                   head_dim=128)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("platform", sorted(KERNEL_TARGETS))
def test_step_has_no_conditionals_or_loops_and_one_kernel_per_layer(platform, shape, tmp_path, capsys):
    rows = {r["program"]: r for r in model_step.main(["--lower", platform, "--shape", shape,
                                                       "--dump-hlo", str(tmp_path)])}
    assert sum(name.startswith("sample ") for name in rows) == 3  # greedy, random, top_k/top_p
    assert sum(name.startswith("sample_extended ") for name in rows) == 3
    for name, row in rows.items():
        assert (row["case"], row["loops"]) == (0, 0), row
        assert row["kernels"] == (SHAPES[shape].num_layers if name == "forward" else 0), row
    assert rows["forward"]["kv_donated"] is True
    assert len(list(tmp_path.glob(f"{platform}-{shape}-*.mlir"))) == len(rows)
    assert "forward" in capsys.readouterr().out


@pytest.mark.parametrize("platform", sorted(KERNEL_TARGETS))
def test_tensor_parallel_step_over_eight_devices(platform):
    """Llama-3-8B over 8 chips (configs/tpu-v5e-8.yaml, gpu-h100x8.yaml): attention runs per
    shard inside shard_map, still one kernel per layer and nothing that branches or loops."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    out = subprocess.run([sys.executable, str(Path(model_step.__file__)), "--lower", platform,
                          "--shape", "llama3-8b", "--tensor-parallel-size", "8"],
                         env=env, capture_output=True, text=True, timeout=300, check=True).stdout
    assert "tensor parallel 8" in out
    forward = re.search(r"^  forward +(\d+) +(\d+) +(\d+) +(\w+)$", out, re.M)
    assert forward and forward.groups() == ("0", "0", "32", "True"), out
    rows = re.findall(r"^  sample\S* .*? +(\d+) +(\d+) +(\d+) *$", out, re.M)
    assert len(rows) == 6 and all(r == ("0", "0", "0") for r in rows), out


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("platform", sorted(KERNEL_TARGETS))
def test_every_family_step_donates_the_kv_cache(platform, arch):
    """Every registered family (family_configs.py, small shapes), Gemma's sliding and global
    layers included (the window is a value the kernel takes): no conditional, no loop, one
    kernel per layer, and the KV cache donated (updated in place)."""
    model_cls, args = family_args(arch, FAMILY_SHAPE, sliding_window=64)
    texts, kv_cache = lower_step(platform, args, model_cls=model_cls, programs=("forward",))
    forward = program_rows(platform, texts, kv_cache)[0]
    assert (forward["case"], forward["kv_donated"]) == (0, True), forward
    if hasattr(args, "num_experts") and platform == "tpu":
        return  # megablox's gmm kernels and their metadata loop: test_lower_moe_step.py
    assert (forward["loops"], forward["kernels"]) == (0, args.num_layers), forward


@pytest.mark.parametrize("platform", sorted(KERNEL_TARGETS))
def test_lora_step_has_no_conditionals_or_loops(platform):
    """With enable_lora, forward_lora applies every token's adapter (a shrink per adapted
    projection: qkv, o, gate/up, down; an expand per part: q, k, v, o, gate, up, down): still
    nothing that branches or loops, one kernel per layer, the KV cache in place; the forward
    is the plain one."""
    args = FAMILY_SHAPE
    plain, _ = lower_step(platform, args, programs=("forward",))
    texts, kv_cache = lower_step(platform, args, programs=("forward", "forward_lora"), enable_lora=True,
                                 max_loras=4, max_lora_rank=16)
    assert texts["forward"] == plain["forward"]  # a step without adapters runs the plain program
    forward = program_rows(platform, {"forward_lora": texts["forward_lora"]}, kv_cache)[0]
    assert (forward["case"], forward["loops"], forward["kernels"], forward["kv_donated"]) == (
        0, 0, args.num_layers, True), forward
    dots = [t.count("stablehlo.dot_general") for t in (plain["forward"], texts["forward_lora"])]
    assert dots[1] - dots[0] == (4 + 7) * args.num_layers


def test_conditionals_and_loops_are_counted(monkeypatch):
    """The CPU's layer loop (fori_loop + switch) lowered for a GPU shows what the test above
    rules out: the counts are not vacuous."""
    monkeypatch.setattr(Backend, "layer_loop", staticmethod(switched_layers))  # the CUDA backend's
    texts, kv_cache = lower_step("cuda", SMOLLM2)
    forward = program_rows("cuda", {"forward": texts["forward"]}, kv_cache)[0]
    assert forward["case"] > 0 and forward["loops"] > 0 and forward["kernels"] == 1
    assert forward["kv_donated"] is True


@pytest.mark.parametrize("platform", sorted(KERNEL_TARGETS))
def test_speculative_decoding_step_has_no_conditionals_or_loops(platform):
    """With speculative decoding (n-gram, 4 drafts) the forward returns 5 positions per
    request and every `verify` variant (the LM head over them and the rejection sampler, plain
    and extended: penalty rows, structured output's masks and the emitted tokens' logprobs)
    lowers with no conditional and no loop."""
    texts, kv_cache = lower_step(platform, FAMILY_SHAPE, programs=("forward", "verify"),
                                 speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    rows = program_rows(platform, texts, kv_cache)
    assert sum(row["program"].startswith("verify ") for row in rows) == 6  # 3 variants, plain and extended
    assert sum(row["program"].endswith(" extended") for row in rows) == 3  # logprobs are lowered here
    for row in rows:
        assert (row["case"], row["loops"]) == (0, 0), row
        assert row["kernels"] == (FAMILY_SHAPE.num_layers if row["program"] == "forward" else 0), row


@pytest.mark.parametrize("platform", sorted(KERNEL_TARGETS))
def test_draft_model_programs_have_no_conditionals_or_loops(platform):
    """A draft model of 2 layers (method draft_model, 4 drafts): its forward over the step's
    tokens only writes K/V, so its last layer's attention is dead code and the kernel runs for
    the first layer alone; `propose` calls it once per layer and draft step (4 greedy steps
    unrolled); both update the shared KV cache in place, with no conditional and no loop."""
    texts, kv_cache = lower_step(platform, FAMILY_SHAPE, programs=("draft_forward", "propose"), draft_layers=2,
                                 speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    rows = {row["program"]: row for row in program_rows(platform, texts, kv_cache)}
    assert rows.keys() == {"draft_forward", "propose"}
    for name, kernels in (("draft_forward", 1), ("propose", 2 * 4)):
        assert (rows[name]["case"], rows[name]["loops"], rows[name]["kernels"], rows[name]["kv_donated"]) == (
            0, 0, kernels, True), rows[name]


@pytest.mark.parametrize("platform", sorted(KERNEL_TARGETS))
def test_eagle3_programs_have_no_conditionals_or_loops(platform):
    """With an EAGLE-3 head (4 drafts) the forward also returns the three captured hidden
    states, its layers still one kernel call each, and `propose_eagle` (the head over the
    step's tokens, then 3 more steps unrolled) calls the kernel 4 times; both update the KV
    cache in place, with no conditional and no loop."""
    texts, kv_cache = lower_step(platform, FAMILY_SHAPE, programs=("forward", "propose_eagle"), eagle3=True,
                                 speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    rows = {row["program"]: row for row in program_rows(platform, texts, kv_cache)}
    assert rows.keys() == {"forward", "propose_eagle"}
    for name, kernels in (("forward", FAMILY_SHAPE.num_layers), ("propose_eagle", 4)):
        assert (rows[name]["case"], rows[name]["loops"], rows[name]["kernels"], rows[name]["kv_donated"]) == (
            0, 0, kernels, True), rows[name]
