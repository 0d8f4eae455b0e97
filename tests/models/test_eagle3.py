"""EAGLE-3 (method eagle3) on a tiny random Llama and a random head in the published layout
(conftest.write_tiny_eagle3; no embedding of its own, so the target's is shared; vLLM's
default captured layers, 2, 1 and 0 of the 3-layer target): every draft the engine
proposes, step after step with chunked prefill, is the one a float32 torch reference of
vLLM's EAGLE-3 computes from transformers' hidden states of the target; greedy output is
the plain engine's."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import write_tiny_eagle3, write_tiny_llama

from jaxvllm import LLM, SamplingParams

TARGET = dict(hidden_size=64, num_heads=4, num_kv_heads=2, num_layers=3, vocab_size=256)
DRAFT_VOCAB = 160
K = 3
PROMPTS = [[int(t) for t in np.random.default_rng(i).integers(3, 256, n)] for i, n in enumerate([7, 40])]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    target = tmp_path_factory.mktemp("target")
    cfg, target_weights = write_tiny_llama(target, **TARGET)
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer
    load_tokenizer(default_model_path()).save_pretrained(target)
    head = tmp_path_factory.mktemp("eagle3")
    return target, head, write_tiny_eagle3(head, draft_vocab_size=DRAFT_VOCAB), target_weights


def reference_drafts(target_path, head: dict, embed: np.ndarray, sequence: list[int], k: int) -> list[int]:
    """vLLM's EAGLE-3 in torch: the head over (token i + 1, the target's layers 0, 1, 2 inputs
    at i) for every position, the first draft from the last, then k - 1 steps from its own
    hidden state before the final norm."""
    from transformers import AutoModelForCausalLM
    target = AutoModelForCausalLM.from_pretrained(str(target_path), dtype=torch.float32).eval()
    T = {n: torch.from_numpy(np.asarray(v)) for n, v in head.items()}
    with torch.no_grad():
        states = target(torch.tensor([sequence]), output_hidden_states=True).hidden_states
    aux = torch.cat([states[i][0] for i in (0, 1, 2)], dim=-1)[:-1]  # positions 0 .. n - 2
    E = torch.from_numpy(embed)

    def rms(x, w, eps=1e-6):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rope(x, pos):  # [n, heads, 16], Llama's rotate-half
        inv = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
        ang = pos[:, None].float() * inv[None]
        cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
        return x * cos + torch.cat([-x[..., 8:], x[..., :8]], -1) * sin

    keys, values, m = [], [], "midlayer."

    def step(tokens, hidden, pos):
        x = torch.cat([rms(E[tokens], T[m + "input_layernorm.weight"]), rms(hidden, T[m + "hidden_norm.weight"])], -1)
        q = rope((x @ T[m + "self_attn.q_proj.weight"].T).view(-1, 4, 16), pos)
        keys.append(rope((x @ T[m + "self_attn.k_proj.weight"].T).view(-1, 2, 16), pos))
        values.append((x @ T[m + "self_attn.v_proj.weight"].T).view(-1, 2, 16))
        kk, vv = torch.cat(keys).repeat_interleave(2, 1), torch.cat(values).repeat_interleave(2, 1)
        all_pos = torch.arange(kk.shape[0])
        scores = torch.einsum("qhd,khd->hqk", q, kk) / 4.0
        scores = scores.masked_fill(all_pos[None, None] > pos[None, :, None], float("-inf"))
        o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv).reshape(len(pos), -1)
        r = hidden + o @ T[m + "self_attn.o_proj.weight"].T
        y = rms(r, T[m + "post_attention_layernorm.weight"])
        pre = r + (torch.nn.functional.silu(y @ T[m + "mlp.gate_proj.weight"].T) * (y @ T[m + "mlp.up_proj.weight"].T)
                   ) @ T[m + "mlp.down_proj.weight"].T
        best = (rms(pre[-1], T["norm.weight"]) @ T["lm_head.weight"].T).argmax()
        return int(best + T["d2t"][best]), pre[-1:]

    n = len(sequence)
    draft, hidden = step(torch.tensor(sequence[1:]), aux @ T["fc.weight"].T, torch.arange(n - 1))
    drafts = [draft]
    for j in range(k - 1):
        draft, hidden = step(torch.tensor([drafts[-1]]), hidden, torch.tensor([n - 1 + j]))
        drafts.append(draft)
    return drafts


def test_every_draft_is_the_reference_eagle3s_and_greedy_output_is_kept(models):
    target, head_dir, head, target_weights = models
    args = dict(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=128, num_gpu_blocks_override=32,
                skip_warmup=True)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    plain = LLM(str(target), **args)
    want = [o.outputs[0].token_ids for o in plain.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                                                            use_tqdm=False)]
    plain.llm_engine.shutdown()
    llm = LLM(str(target), speculative_config={"method": "eagle3", "model": str(head_dir), "num_speculative_tokens": K},
              **args)
    engine = llm.llm_engine
    scheduler = engine.engine_core.scheduler
    proposed = []  # (the request's tokens when it was proposed, the drafts)
    for i, prompt in enumerate(PROMPTS):  # one at a time: a 40-token prompt takes three 16-token steps
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
        while engine.has_unfinished_requests():
            outputs = engine.step()
            request = scheduler.requests.get(str(i))
            if request is not None and request.spec_token_ids and len(request.spec_token_ids) == K:
                proposed.append((list(request.all_token_ids), list(request.spec_token_ids)))
            for out in outputs:
                if out.finished:
                    assert out.outputs[0].token_ids == want[i]
    assert len(proposed) >= 4
    embed = target_weights["model.embed_tokens.weight"]
    for sequence, drafts in proposed:
        assert drafts == reference_drafts(target, head, embed, sequence, K), sequence
    stats = engine.get_stats()
    assert stats.spec_decode_num_draft_tokens > 0
    pool = scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1
    engine.shutdown()


def test_an_eagle3_head_serves_only_as_a_draft(models, tmp_path):
    target, head_dir, _, _ = models
    with pytest.raises(ValueError, match="is a draft head"):
        LLM(str(head_dir), skip_warmup=True)
    with pytest.raises(ValueError, match="method 'eagle3' takes one"):
        LLM(str(target), skip_warmup=True, speculative_config={"method": "draft_model", "model": str(head_dir),
                                                                 "num_speculative_tokens": 2})
    wide = tmp_path / "wide"  # a head for a target of another hidden size
    write_tiny_eagle3(wide, hidden_size=128)
    with pytest.raises(ValueError, match="for a hidden size of 128, the target's is 64"):
        LLM(str(target), skip_warmup=True, speculative_config={"method": "eagle3", "model": str(wide),
                                                                 "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="method 'eagle3' takes one"):
        LLM(str(target), skip_warmup=True, speculative_config={"method": "eagle3", "model": str(target),
                                                                 "num_speculative_tokens": 2})
