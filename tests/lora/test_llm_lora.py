"""Multi-LoRA end to end on the tiny random Llama (tests/conftest.py), with transformers +
peft as the reference: three adapters of different ranks, scalings and target modules,
written by peft's save_pretrained. Each reproduces peft's logits and greedy tokens; a batch
mixing them with the base model equals each run alone; steps without adapters run the plain
forward; loading another adapter compiles nothing; adapters never share prefix-cache pages;
bad adapters are refused by name and the engine serves on; at TP=2 a mixed batch still gives
each adapter's tokens; an adapter on a tiny Gemma 3 (its layers reach the loop with their
numbers) reproduces peft. One engine for the module, with fewer device slots and host-cache
places than adapters, so that slots and the cache are reused along the way."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model

from jaxvllm import LLM, LoRARequest, SamplingParams
from jaxvllm.backends.cpu import native_kernels_available

rng = np.random.default_rng(0)
PROMPTS = [[int(t) for t in rng.integers(3, 256, n)] for n in (7, 21, 40)]
MAX_TOKENS = 6
PARAMS = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, prompt_logprobs=0)
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = {
    "qv-r4": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "all-r8-rslora": dict(r=8, lora_alpha=16, use_rslora=True, target_modules=ALL),
    "mlp-o-r16": dict(r=16, lora_alpha=8, target_modules=["o_proj", "gate_proj", "up_proj", "down_proj"]),
    "kv-down-r2": dict(r=2, lora_alpha=4, target_modules=["k_proj", "v_proj", "down_proj"]),
}


def base_model(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def write_adapter(model_dir, out_dir, seed: int = 0, **lora_kwargs):
    """A random PEFT LoRA adapter (B not zero: init_lora_weights=False), saved; returns peft's model."""
    torch.manual_seed(seed)
    model = get_peft_model(base_model(model_dir), LoraConfig(init_lora_weights=False, **lora_kwargs))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.3)  # outputs stay in the base model's range
    model.save_pretrained(out_dir)
    return model.eval()


@torch.no_grad()
def reference(model) -> list[tuple[list[float], list[int]]]:
    """Per prompt: each prompt token's logprob after the ones before it, and greedy tokens."""
    out = []
    for prompt in PROMPTS:
        lp = torch.log_softmax(model(torch.tensor([prompt])).logits[0].double(), -1)
        prompt_lp = [lp[i, prompt[i + 1]].item() for i in range(len(prompt) - 1)]
        ids = list(prompt)
        for _ in range(MAX_TOKENS):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        out.append((prompt_lp, ids[len(prompt):]))
    return out


def results(outputs) -> list[tuple[list[float], list[int]]]:
    return [([next(iter(d.values())).logprob for d in o.prompt_logprobs[1:]], list(o.outputs[0].token_ids))
            for o in outputs]


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("loras")
    out = {}
    for i, (name, kwargs) in enumerate(ADAPTERS.items(), 1):
        model = write_adapter(tiny_model_dir, root / name, seed=i, **kwargs)
        out[name] = (LoRARequest(name, i, str(root / name)), reference(model))
    return out


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir), enable_lora=True, max_loras=2, max_lora_rank=16, max_cpu_loras=2,
               max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256, num_gpu_blocks_override=128,
               skip_warmup=True)


def runner(llm):
    return llm.llm_engine.engine_core.model_executor.driver_worker.model_runner


def test_each_adapter_matches_transformers_and_peft(llm, adapters):
    for name, (lora, expected) in adapters.items():
        got = results(llm.generate(PROMPTS, PARAMS, use_tqdm=False, lora_request=lora))
        for (lp, tokens), (ref_lp, ref_tokens) in zip(got, expected):
            np.testing.assert_allclose(lp, ref_lp, rtol=1e-4, atol=1e-5, err_msg=name)
            assert tokens == ref_tokens, name
    assert len(runner(llm).lora_manager.host_cache) == 2  # max_cpu_loras: the first one was dropped


def test_a_batch_mixing_adapters_and_the_base_equals_each_alone(llm, adapters, tiny_model_dir):
    base = results(llm.generate(PROMPTS, PARAMS, use_tqdm=False))
    assert base == results(llm.generate(PROMPTS, PARAMS, use_tqdm=False, lora_request=None))
    ref_base = reference(base_model(tiny_model_dir))
    assert [t for _, t in base] == [t for _, t in ref_base]
    loras = [None] + [lora for lora, _ in adapters.values()]
    prompts = [p for p in PROMPTS for _ in loras]
    per_prompt = [lora for _ in PROMPTS for lora in loras]
    mixed = results(llm.generate(prompts, PARAMS, use_tqdm=False, lora_request=per_prompt))
    alone = {None: base, **{lora.lora_int_id: exp for lora, exp in adapters.values()}}
    for k, (got, lora) in enumerate(zip(mixed, per_prompt)):
        lp, tokens = alone[lora and lora.lora_int_id][k // len(loras)]
        assert got[1] == tokens
        np.testing.assert_allclose(got[0], lp, rtol=1e-4, atol=1e-5)
    # On one CPU device with the native kernels, each token ran its own slot only (the
    # grouped form); the TP=2 test below runs the dense one.
    if native_kernels_available():
        assert all(layout.grouped for layout in runner(llm).lora_manager.layouts.values())


# At TP=2 on two simulated devices (a subprocess: the device count is fixed when jax starts),
# the stacks split as their base layers: the mixed batch prints each request's tokens.
TP_SCRIPT = """
import json, sys
from jaxvllm import LLM, LoRARequest, SamplingParams
model, loras, prompts, n = json.loads(sys.argv[1])
llm = LLM(model, tensor_parallel_size=2, enable_lora=True, max_loras=4, max_lora_rank=16, max_num_seqs=16,
          max_num_batched_tokens=128, max_model_len=256, num_gpu_blocks_override=128, skip_warmup=True)
requests = [None if l is None else LoRARequest(*l) for l in loras]
outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False,
                    lora_request=requests)
stacks = llm.llm_engine.engine_core.model_executor.driver_worker.model_runner.lora_manager.stacks
split = lambda x: x.addressable_shards[0].data.shape != x.shape
print(json.dumps({"tokens": [list(o.outputs[0].token_ids) for o in outs],
                  "split": {leaf: [split(a), all(map(split, bs))] for leaf, (a, bs) in stacks.items()}}))
"""


def test_a_mixed_batch_at_tp2_gives_each_adapter_its_tokens(adapters, tiny_model_dir):
    loras = [None] + [[lora.lora_name, lora.lora_int_id, lora.lora_path] for lora, _ in adapters.values()]
    prompts = [p for p in PROMPTS for _ in loras]
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    proc = subprocess.run([sys.executable, "-c", TP_SCRIPT, json.dumps(
        [str(tiny_model_dir), [l for _ in PROMPTS for l in loras], prompts, MAX_TOKENS])],
        capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    # As the base layers: a column parallel one's B split over the devices, a row parallel one's A.
    assert got["split"] == {"qkv_proj": [False, True], "o_proj": [True, False],
                            "gate_up_proj": [False, True], "down_proj": [True, False]}
    expected = {None: [t for _, t in reference(base_model(tiny_model_dir))],
                **{lora.lora_int_id: [t for _, t in exp] for lora, exp in adapters.values()}}
    for k, tokens in enumerate(got["tokens"]):
        lora = loras[k % len(loras)]
        assert tokens == expected[lora and lora[1]][k // len(loras)], (k, lora)


def test_steps_without_adapters_run_the_plain_forward(llm, adapters):
    """The runner picks the program per step on the host: base-only steps run the forward that
    enable_lora off compiles, steps with an adapter the LoRA one; the base rows agree."""
    forward, forward_lora = runner(llm)._forward, runner(llm)._forward_lora
    calls = forward.num_calls, forward_lora.num_calls
    base = results(llm.generate(PROMPTS, PARAMS, use_tqdm=False))
    assert forward.num_calls > calls[0] and forward_lora.num_calls == calls[1]
    lora, expected = adapters["qv-r4"]
    mixed = results(llm.generate(PROMPTS * 2, PARAMS, use_tqdm=False, lora_request=[None] * 3 + [lora] * 3))
    assert forward_lora.num_calls > calls[1]
    for (lp, tokens), (ref_lp, ref_tokens) in zip(mixed, base + expected):
        assert tokens == ref_tokens
        np.testing.assert_allclose(lp, ref_lp, rtol=1e-4, atol=1e-5)


def test_loading_another_adapter_compiles_nothing(llm, adapters):
    first, _ = adapters["qv-r4"]
    llm.generate(PROMPTS, PARAMS, use_tqdm=False, lora_request=first)
    compiled = runner(llm).num_compilations
    lora, expected = adapters["mlp-o-r16"]
    again = LoRARequest("mlp-o-r16-again", 99, lora.lora_path)  # a new id: read and loaded anew
    assert 99 not in runner(llm).lora_manager.slots
    got = results(llm.generate(PROMPTS, PARAMS, use_tqdm=False, lora_request=again))
    assert 99 in runner(llm).lora_manager.slots
    assert runner(llm).num_compilations == compiled
    assert [t for _, t in got] == [t for _, t in expected]


def test_adapters_never_share_prefix_cache_pages(llm, adapters):
    (a, _), (b, _) = adapters["qv-r4"], adapters["all-r8-rslora"]
    prompt = [int(t) for t in rng.integers(3, 256, 50)]
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    stats = llm.llm_engine.engine_core.get_stats
    alone_b = llm.generate([prompt], greedy, use_tqdm=False, lora_request=b)[0].outputs[0].token_ids
    llm.reset_prefix_cache()
    llm.generate([prompt], greedy, use_tqdm=False, lora_request=a)
    hits = stats().prefix_cache_hits
    after_a = llm.generate([prompt], greedy, use_tqdm=False, lora_request=b)[0].outputs[0].token_ids
    assert stats().prefix_cache_hits == hits and after_a == alone_b  # nothing of a's pages read
    llm.generate([prompt], greedy, use_tqdm=False, lora_request=b)
    assert stats().prefix_cache_hits >= hits + 48  # b's own pages are


def test_bad_adapters_are_refused_by_name_and_the_engine_serves_on(llm, adapters, tiny_model_dir, tmp_path):
    big = write_adapter(tiny_model_dir, tmp_path / "r32", r=32, lora_alpha=32, target_modules=["q_proj"])
    del big
    head = tmp_path / "head"
    write_adapter(tiny_model_dir, head, r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"])
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8}))
    (corrupt / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    cases = {
        "rank 32 of model.layers.0.self_attn.q_proj is larger than max_lora_rank=16": (tmp_path / "r32", 11),
        "target module 'lm_head' is not supported": (head, 12),
        "no such directory": (tmp_path / "missing", 13),
        "adapter_model.safetensors is not a valid safetensors file": (corrupt, 14),
    }
    for message, (path, i) in cases.items():
        with pytest.raises(ValueError, match=message):
            llm.generate(PROMPTS, PARAMS, use_tqdm=False, lora_request=LoRARequest(f"bad-{i}", i, str(path)))
    llm.generate(PROMPTS[0], PARAMS, use_tqdm=False, lora_request=adapters["qv-r4"][0])
    with pytest.raises(ValueError, match="lora_int_id 1 already names adapter 'qv-r4'"):
        llm.generate(PROMPTS[0], PARAMS, use_tqdm=False, lora_request=LoRARequest("other", 1, str(head)))
    lora, expected = adapters["all-r8-rslora"]
    got = results(llm.generate(PROMPTS, PARAMS, use_tqdm=False, lora_request=lora))
    assert [t for _, t in got] == [t for _, t in expected]
    assert not llm.llm_engine.engine_core.scheduler.requests


def test_lora_request_needs_enable_lora(tiny_model_dir, adapters):
    llm = LLM(str(tiny_model_dir), max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64,
              num_gpu_blocks_override=16, skip_warmup=True)
    with pytest.raises(ValueError, match="enable_lora=True"):
        llm.generate(PROMPTS[0], PARAMS, use_tqdm=False, lora_request=adapters["qv-r4"][0])
    assert runner(llm).lora_manager is None


def test_an_adapter_on_gemma3_matches_peft(tmp_path):
    """Gemma's layers reach the layer loop with their numbers ((i, weights) pairs, not the
    weights alone): an adapter on every projection there too reproduces peft (the Gemma 3
    270M benchmark found the pairs refused)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "models"))
    from family_checkpoints import write_family_checkpoint
    write_family_checkpoint("Gemma3ForCausalLM", tmp_path / "gemma3")
    expected = reference(write_adapter(tmp_path / "gemma3", tmp_path / "lora", seed=5, r=4, lora_alpha=8,
                                       target_modules=ALL))
    llm = LLM(str(tmp_path / "gemma3"), enable_lora=True, max_loras=1, max_lora_rank=8, max_num_seqs=4,
              max_num_batched_tokens=64, max_model_len=256, num_gpu_blocks_override=128, skip_warmup=True)
    lora = LoRARequest("g", 1, str(tmp_path / "lora"))
    got = results(llm.generate(PROMPTS, PARAMS, use_tqdm=False, lora_request=lora))
    for (lp, tokens), (ref_lp, ref_tokens) in zip(got, expected):
        np.testing.assert_allclose(lp, ref_lp, rtol=1e-4, atol=1e-5)
        assert tokens == ref_tokens
