"""The default model (SmolLM2-135M-Instruct) with three random PEFT adapters of different
ranks, scalings and targets: each prompt token's logprob equals that of peft's model in
transformers (float32, within 1e-4 relative), and the greedy tokens agree."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model

from jaxvllm import LLM, LoRARequest, SamplingParams

pytestmark = pytest.mark.slow

ADAPTERS = {
    "qv-r8": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    "all-r16-rslora": dict(r=16, lora_alpha=32, use_rslora=True,
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj"]),
    "mlp-r4": dict(r=4, lora_alpha=4, target_modules=["gate_proj", "up_proj", "down_proj"]),
}
PROMPT = "The capital of France is Paris, and the capital of Italy is"
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def llm():
    return LLM(enable_lora=True, max_loras=2, max_lora_rank=16, max_num_seqs=4, max_num_batched_tokens=64,
               max_model_len=256, skip_warmup=True)


@torch.no_grad()
def test_default_model_adapters_match_peft(llm, hf_default_model, tmp_path):
    ids = llm.get_tokenizer().encode(PROMPT)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, prompt_logprobs=0)
    for i, (name, kwargs) in enumerate(ADAPTERS.items(), 1):
        torch.manual_seed(i)
        model = get_peft_model(copy.deepcopy(hf_default_model), LoraConfig(init_lora_weights=False, **kwargs))
        for pname, p in model.named_parameters():
            if "lora_B" in pname:
                p.mul_(0.05)  # a fine-tune's size of change
        model.save_pretrained(tmp_path / name)
        model.eval()
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
        expected = np.array([lp[k, ids[k + 1]].item() for k in range(len(ids) - 1)])
        tokens = list(ids)
        for _ in range(MAX_TOKENS):
            tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))
        out = llm.generate([ids], params, use_tqdm=False,
                           lora_request=LoRARequest(name, i, str(tmp_path / name)))[0]
        got = np.array([next(iter(d.values())).logprob for d in out.prompt_logprobs[1:]])
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=name)
        print(f"{name}: max relative logprob difference {np.max(np.abs(got - expected) / np.abs(expected)):.2e}")
        assert list(out.outputs[0].token_ids) == tokens[len(ids):], name
