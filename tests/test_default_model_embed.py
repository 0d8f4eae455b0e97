"""The default model (SmolLM2-135M-Instruct) as an embedding model (runner="pooling",
convert="embed") against transformers' final hidden states in float32: LAST (normalized) and
MEAN pooled the same way (CLS and ALL too), on prompts over many pages, whole and in chunks
of 32 tokens, and with prefix-cache hits; every page back in the pool afterwards. One engine
for the module: the chunked runs lower its scheduler's per-request prefill budget."""
from __future__ import annotations

import contextlib
import functools

import numpy as np
import pytest
import torch

from jaxvllm import LLM, PoolingParams

pytestmark = pytest.mark.slow

TEXTS = [
    "The capital of France is Paris, a city on the Seine.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n" * 3,
    "Photosynthesis is the process by which green plants, algae and some bacteria convert light "
    "energy into chemical energy. During this process, carbon dioxide and water are transformed into "
    "glucose and oxygen, using sunlight captured by chlorophyll in the chloroplasts. The light "
    "dependent reactions take place in the thylakoid membranes, where water is split and ATP and NADPH "
    "are produced, while the Calvin cycle in the stroma uses these to fix carbon.",
]
INSTRUCTION = ("Represent this sentence for searching relevant passages about science, history, "
               "programming and the natural world, in any language, however it is phrased: ") * 2


@pytest.fixture(scope="module")
def llm():
    return LLM(runner="pooling", max_num_seqs=4, max_num_batched_tokens=128, max_model_len=512,
               skip_warmup=True)


@pytest.fixture(scope="module")
def hf_hidden(hf_default_model):
    """transformers' final (normed) hidden states of a prompt, float32 (once per prompt)."""
    @functools.cache
    def hidden(ids: tuple[int, ...]) -> np.ndarray:
        with torch.no_grad():
            return hf_default_model.model(torch.tensor([ids])).last_hidden_state[0].numpy()
    return lambda ids: hidden(tuple(ids))


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@contextlib.contextmanager
def chunked(llm, tokens: int):
    """Prefill in chunks of at most `tokens` per request and step."""
    scheduler = llm.llm_engine.engine_core.scheduler
    scheduler.long_prefill_token_threshold = tokens
    try:
        yield
    finally:
        scheduler.long_prefill_token_threshold = 0


def pool_is_full(llm) -> bool:
    pool = llm.llm_engine.engine_core.scheduler.kv_cache_manager.block_pool
    return pool.get_num_free_blocks() == pool.num_blocks - 1


@pytest.mark.parametrize("chunk", [None, 32])
@pytest.mark.parametrize("pooling_type", ["LAST", "MEAN"])
def test_embeddings_match_transformers(llm, hf_hidden, pooling_type, chunk):
    tok = llm.get_tokenizer()
    ids = [tok.encode(t) for t in TEXTS]
    assert max(map(len, ids)) > 5 * 16 > 32  # many pages, several chunks
    with chunked(llm, chunk) if chunk else contextlib.nullcontext():
        outputs = llm.embed([{"prompt_token_ids": i} for i in ids], use_tqdm=False,
                            pooling_params=PoolingParams(pooling_type=pooling_type))
    for i, out in zip(ids, outputs):
        h = hf_hidden(i)
        want = {"LAST": h[-1], "MEAN": h.mean(0)}[pooling_type]
        got = np.asarray(out.outputs.embedding)
        assert out.outputs.hidden_size == 576 and out.prompt_token_ids == i
        assert abs(np.linalg.norm(got) - 1) < 1e-5  # normalized
        assert cosine(got, want) >= 0.99999, (pooling_type, chunk, cosine(got, want))
    assert pool_is_full(llm)


def test_last_embeddings_with_prefix_cache_hits(llm, hf_hidden):
    tok = llm.get_tokenizer()
    queries = ["What is photosynthesis?", "Who painted the Mona Lisa?", "How do I sort a list in Python?"]
    prompts = [INSTRUCTION + q for q in queries]
    stats = llm.llm_engine.engine_core.scheduler.kv_cache_manager.prefix_cache_stats
    first = llm.embed(prompts[:1], use_tqdm=False)
    hits = stats.hits
    with chunked(llm, 32):
        rest = llm.embed(prompts[1:], use_tqdm=False)
    assert stats.hits - hits >= 2 * 16 * (len(tok.encode(INSTRUCTION)) // 16 - 1)  # the shared pages, in tokens
    for prompt, out in zip(prompts, first + rest):
        assert cosine(out.outputs.embedding, hf_hidden(tok.encode(prompt))[-1]) >= 0.99999
    # MEAN reads every position: it computes the whole prompt, cached pages or not.
    hits = stats.hits
    mean = llm.embed(prompts[1:], use_tqdm=False, pooling_params=PoolingParams(pooling_type="MEAN"))
    assert stats.hits == hits
    for prompt, out in zip(prompts[1:], mean):
        assert cosine(out.outputs.embedding, hf_hidden(tok.encode(prompt)).mean(0)) >= 0.99999
    assert pool_is_full(llm)


def test_encode_all_score_and_errors(llm, hf_hidden):
    tok = llm.get_tokenizer()
    ids = tok.encode(TEXTS[2])
    (out,) = llm.encode([ids], use_tqdm=False, pooling_task="token_embed",
                        pooling_params=PoolingParams(normalize=False))
    np.testing.assert_allclose(out.outputs.data, hf_hidden(ids), rtol=0, atol=2e-4)
    (cls,) = llm.embed([ids], use_tqdm=False, pooling_params=PoolingParams(pooling_type="CLS"))
    assert cosine(cls.outputs.embedding, hf_hidden(ids)[0]) >= 0.99999
    raw = llm.embed([ids], use_tqdm=False, pooling_params=PoolingParams(normalize=False))[0]
    np.testing.assert_allclose(raw.outputs.embedding, hf_hidden(ids)[-1], rtol=0, atol=2e-4)
    # score: the cosine of the two embeddings.
    a, b = llm.embed(TEXTS[:2], use_tqdm=False)
    (score,) = llm.score(TEXTS[0], [TEXTS[1]], use_tqdm=False)
    assert score.outputs.score == pytest.approx(float(np.dot(a.outputs.embedding, b.outputs.embedding)), abs=1e-6)
    # truncate_prompt_tokens keeps the prompt's last tokens.
    (cut,) = llm.embed([ids], truncate_prompt_tokens=20, use_tqdm=False)
    assert cut.prompt_token_ids == ids[-20:]
    assert cosine(cut.outputs.embedding, hf_hidden(ids[-20:])[-1]) >= 0.99999
    with pytest.raises(ValueError, match="dimensions.*Matryoshka"):
        llm.embed(["a"], pooling_params=PoolingParams(dimensions=8), use_tqdm=False)
    with pytest.raises(ValueError, match="prompt_token_ids must lie in"):
        llm.embed([[49152]], use_tqdm=False)
    with pytest.raises(ValueError, match="longer than the maximum model length"):
        llm.embed([[1] * 600], use_tqdm=False)
    with pytest.raises(ValueError, match="task='classify' needs a classification model"):
        llm.classify(["a"], use_tqdm=False)
    with pytest.raises(ValueError, match="runner='pooling'"):
        llm.generate(["a"], use_tqdm=False)
    with pytest.raises(ValueError, match="score needs one data_1 text, or as many as data_2"):
        llm.score(["a", "b"], ["c", "d", "e"], use_tqdm=False)
    assert pool_is_full(llm)
