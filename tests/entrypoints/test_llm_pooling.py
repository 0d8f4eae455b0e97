"""Pooling models on tiny random checkpoints written by transformers: Llama and Qwen3
`*ForSequenceClassification` (classify probabilities and cross-encoder scores against
transformers' logits), a Matryoshka embedding model (`dimensions`), the runner resolved from
the architecture, and each runner refusing the other's requests."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from jaxvllm import LLM, PoolingParams, SamplingParams

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "models"))
from family_checkpoints import write_family_checkpoint  # noqa: E402

PROMPTS = [[5, 9, 33, 12, 7], list(range(3, 60)), [40, 41] * 30 + [17]]
ENGINE = dict(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128, num_gpu_blocks_override=64,
              skip_warmup=True)


def pool_is_full(llm) -> bool:
    pool = llm.llm_engine.engine_core.scheduler.kv_cache_manager.block_pool
    return pool.get_num_free_blocks() == pool.num_blocks - 1


@pytest.fixture(scope="module", params=[("LlamaForSequenceClassification", 3),
                                        ("Qwen3ForSequenceClassification", 1)])
def classifier(request, tmp_path_factory):
    arch, labels = request.param
    path = tmp_path_factory.mktemp(arch)
    hf = write_family_checkpoint(arch, path, num_labels=labels)
    return LLM(str(path), **ENGINE), hf, labels


def hf_logits(hf, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].numpy()


def test_classify_matches_transformers(classifier):
    llm, hf, labels = classifier
    config = llm.llm_engine.config.model
    assert (config.runner, config.convert, config.pooler_config.pooling_type) == ("pooling", "classify", "LAST")
    outputs = llm.classify([{"prompt_token_ids": p} for p in PROMPTS], use_tqdm=False)  # 32-token chunks
    for ids, out in zip(PROMPTS, outputs):
        logits = hf_logits(hf, ids)
        want = torch.sigmoid(torch.tensor(logits)) if labels == 1 else torch.softmax(torch.tensor(logits), -1)
        assert out.outputs.num_classes == labels
        np.testing.assert_allclose(out.outputs.probs, want.numpy(), rtol=0, atol=1e-5)
    raw = llm.classify([PROMPTS[1]], pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    np.testing.assert_allclose(raw[0].outputs.probs, hf_logits(hf, PROMPTS[1]), rtol=0, atol=1e-5)
    assert pool_is_full(llm)


def test_score_is_the_cross_encoders_output(classifier):
    llm, hf, labels = classifier
    if labels != 1:
        with pytest.raises(ValueError, match="one-label classifier"):
            llm.score("a", ["b"], use_tqdm=False)
        return
    tok = llm.get_tokenizer()
    query, docs = "12", ["34", "5678"]  # digits: ids inside the tiny vocabulary
    scores = llm.score(query, docs, use_tqdm=False)
    raw = llm.score(query, docs, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    for doc, s, r in zip(docs, scores, raw):
        ids = tok(query, doc)["input_ids"]
        logit = float(hf_logits(hf, ids)[0])
        assert r.outputs.score == pytest.approx(logit, abs=1e-5)
        assert s.outputs.score == pytest.approx(1 / (1 + np.exp(-logit)), abs=1e-5)
        assert s.prompt_token_ids == ids


def test_a_pooling_engine_does_not_generate(classifier):
    llm = classifier[0]
    with pytest.raises(ValueError, match="runner='pooling'"):
        llm.generate([[5, 6]], SamplingParams(max_tokens=2), use_tqdm=False)
    with pytest.raises(ValueError, match="task='embed' needs an embedding model"):
        llm.embed([[5, 6]], use_tqdm=False)


@pytest.fixture(scope="module")
def matryoshka(tmp_path_factory):
    """A tiny causal LM marked Matryoshka (its config's matryoshka_dimensions), embedding."""
    path = tmp_path_factory.mktemp("matryoshka")
    hf = write_family_checkpoint("LlamaForCausalLM", path, matryoshka_dimensions=[16, 32])
    return LLM(str(path), runner="pooling", pooler_config={"pooling_type": "MEAN"}, **ENGINE), hf


def test_dimensions_truncate_then_normalize(matryoshka):
    llm, hf = matryoshka
    with torch.no_grad():
        h = hf.model(torch.tensor([PROMPTS[1]])).last_hidden_state[0].numpy()
    full, cut = (llm.embed([PROMPTS[1]], pooling_params=PoolingParams(dimensions=d), use_tqdm=False)[0]
                 for d in (None, 16))
    mean = h.mean(0)
    np.testing.assert_allclose(full.outputs.embedding, mean / np.linalg.norm(mean), rtol=0, atol=1e-5)
    assert cut.outputs.hidden_size == 16
    np.testing.assert_allclose(cut.outputs.embedding, mean[:16] / np.linalg.norm(mean[:16]), rtol=0, atol=1e-5)
    # CLS and ALL over two chunks; the pooler config's MEAN stays the default.
    (cls,) = llm.embed([PROMPTS[1]], pooling_params=PoolingParams(pooling_type="CLS", normalize=False),
                       use_tqdm=False)
    np.testing.assert_allclose(cls.outputs.embedding, h[0], rtol=0, atol=1e-5)
    (every,) = llm.encode([PROMPTS[1]], pooling_task="token_embed", use_tqdm=False,
                          pooling_params=PoolingParams(normalize=False))
    np.testing.assert_allclose(every.outputs.data, h, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="dimensions must be at most the hidden size 64"):
        llm.embed([[5]], pooling_params=PoolingParams(dimensions=65), use_tqdm=False)
    with pytest.raises(ValueError, match="dimensions must be a positive integer"):
        PoolingParams(dimensions=0)
    assert pool_is_full(llm)


def test_runner_and_pooler_config_are_checked(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), **ENGINE)  # a causal LM: the generate runner
    assert llm.llm_engine.config.model.runner == "generate"
    with pytest.raises(ValueError, match="needs a model served with runner='pooling'"):
        llm.embed([[5, 6]], use_tqdm=False)
    for kwargs, match in [(dict(convert="classify"), "convert='classify' needs a \\*ForSequenceClassification"),
                          (dict(runner="pooling", pooler_config={"pooling_type": "MAX"}),
                           "pooling_type must be one of"),
                          (dict(runner="pooling", pooler_config={"pool": 1}), "unknown fields \\['pool'\\]"),
                          (dict(runner="generate", convert="embed"), "convert='embed' needs runner='pooling'")]:
        with pytest.raises(ValueError, match=match):
            LLM(str(tiny_model_dir), **ENGINE, **kwargs)


@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "Gemma3ForCausalLM"])
def test_other_families_embed(arch, tmp_path):
    """Any family embeds through the same path: Qwen3's q/k norms, Gemma 3's sliding layers
    (the prompt outlasts its window of 12) and its scaled embedding."""
    hf = write_family_checkpoint(arch, tmp_path)
    llm = LLM(str(tmp_path), runner="pooling", pooler_config='{"pooling_type": "MEAN", "normalize": false}',
              **ENGINE)
    with torch.no_grad():
        h = hf.model(torch.tensor([PROMPTS[1]])).last_hidden_state[0].numpy()
    (out,) = llm.embed([PROMPTS[1]], use_tqdm=False)
    np.testing.assert_allclose(out.outputs.embedding, h.mean(0), rtol=0, atol=1e-4)
