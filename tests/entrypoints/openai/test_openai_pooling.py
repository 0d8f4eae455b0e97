"""The pooling endpoints of `jaxvllm serve --runner pooling` (a tiny random Llama with the
default model's tokenizer): the OpenAI SDK's embeddings (base64, its default, and float; text
and token ids; `dimensions`), /pooling, /classify refused for an embedding model, /score and
the rerank shapes (Jina's /v1/rerank, Cohere's /v2/rerank), each equal to the offline LLM's
result; bad inputs answered with a 400 naming the field, every page back afterwards; and each
runner refusing the other's endpoints."""
from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest
from openai_server import API_KEY, TINY_ENGINE_FLAGS, module_server, tiny_model, tiny_server  # noqa: F401

from jaxvllm import LLM

TEXTS = ["The capital of France is Paris.", "Bread is baked in an oven.", "Paris lies on the Seine."]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.fixture(scope="module")
def server(request, model_dir):
    return module_server(request, [
        str(model_dir), *TINY_ENGINE_FLAGS, "--runner", "pooling", "--served-model-name", "tiny-embed",
        "--api-key", API_KEY])


@pytest.fixture(scope="module")
def offline(model_dir):
    return LLM(str(model_dir), runner="pooling", max_model_len=512, max_num_seqs=16,
               max_num_batched_tokens=128, num_gpu_blocks_override=64, skip_warmup=True)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        yield c


def test_sdk_embeddings_equal_the_offline_ones(server, offline):
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    want = np.array([o.outputs.embedding for o in offline.embed(TEXTS, use_tqdm=False)])
    default = oai.embeddings.create(model="tiny-embed", input=TEXTS)  # base64 on the wire
    plain = oai.embeddings.create(model="tiny-embed", input=TEXTS, encoding_format="float")
    ids = offline.get_tokenizer().encode(TEXTS[0])
    by_ids = oai.embeddings.create(model="tiny-embed", input=[ids])
    for reply in (default, plain):
        assert [d.index for d in reply.data] == [0, 1, 2]
        np.testing.assert_allclose([d.embedding for d in reply.data], want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(by_ids.data[0].embedding, want[0], rtol=0, atol=1e-6)
    n = sum(len(offline.get_tokenizer().encode(t)) for t in TEXTS)
    assert plain.usage.prompt_tokens == plain.usage.total_tokens == n


def test_pooling_score_and_rerank_shapes(http, offline):
    pooled = http.post("/pooling", json={"input": TEXTS[0]}).json()
    want = offline.embed(TEXTS[:1], use_tqdm=False)[0].outputs.embedding
    np.testing.assert_allclose(pooled["data"][0]["data"], want, rtol=0, atol=1e-6)
    messages = [{"role": "user", "content": TEXTS[0]}]  # vLLM's chat-style embedding input
    chat = http.post("/v1/embeddings", json={"messages": messages}).json()
    ids = offline.get_tokenizer().apply_chat_template(messages, tokenize=True, add_generation_prompt=False,
                                                      return_dict=False)
    want = offline.embed([{"prompt_token_ids": list(ids)}], use_tqdm=False)[0].outputs.embedding
    np.testing.assert_allclose(chat["data"][0]["embedding"], want, rtol=0, atol=1e-6)
    scores = [s.outputs.score for s in offline.score(TEXTS[0], TEXTS[1:], use_tqdm=False)]
    reply = http.post("/score", json={"text_1": TEXTS[0], "text_2": TEXTS[1:]}).json()
    assert [d["score"] for d in reply["data"]] == pytest.approx(scores, abs=1e-6)
    order = sorted(range(2), key=lambda i: -scores[i])
    for path in ("/v1/rerank", "/v2/rerank", "/rerank"):
        reply = http.post(path, json={"query": TEXTS[0], "documents": TEXTS[1:], "top_n": 2}).json()
        assert [r["index"] for r in reply["results"]] == order
        assert [r["relevance_score"] for r in reply["results"]] == pytest.approx([scores[i] for i in order], abs=1e-6)
        assert reply["results"][0]["document"] == {"text": TEXTS[1:][order[0]]}
        assert reply["usage"]["total_tokens"] > 0


@pytest.mark.parametrize("path,body,param", [
    ("/v1/embeddings", {"input": []}, "input"),
    ("/v1/embeddings", {"input": ["a"] * 10_000}, "input"),
    ("/v1/embeddings", {"input": [[7] * 600]}, "input"),
    ("/v1/embeddings", {"input": "a", "dimensions": 8}, "dimensions"),
    ("/v1/embeddings", {"input": [[49152]]}, "input"),
    ("/v1/embeddings", {"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ("/v1/embeddings", {"input": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1"),
    ("/v1/rerank", {"query": "a", "documents": []}, "documents"),
])
def test_bad_input_is_a_400_naming_the_field(http, server, path, body, param):
    reply = http.post(path, json=body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param, reply.json()
    assert http.post("/v1/embeddings", json={"input": "next"}).status_code == 200
    assert server.metrics()["vllm:kv_cache_usage_perc"] == 0


def test_each_runner_refuses_the_others_endpoints(http, tiny_server):  # noqa: F811
    reply = http.post("/v1/completions", json={"prompt": "a", "max_tokens": 2})
    assert reply.status_code == 400 and "--runner pooling" in reply.json()["error"]["message"]
    assert http.post("/classify", json={"input": "a"}).status_code == 400  # an embedding model
    with httpx.Client(base_url=tiny_server.url, timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        for path, body in (("/v1/embeddings", {"input": "a"}), ("/rerank", {"query": "a", "documents": ["b"]})):
            reply = c.post(path, json=body)
            assert reply.status_code == 400 and "--runner pooling" in reply.json()["error"]["message"]
