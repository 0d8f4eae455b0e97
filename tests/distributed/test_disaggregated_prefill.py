"""Disaggregated prefill and decode (JaxTransferConnector) between two engines in one process,
on tiny random models: a prefill engine computes each prompt, a decode engine pulls its KV
through jax.experimental.transfer and goes on with greedy outputs equal to one engine's,
computing one prompt token per request; a pull that fails (an id already pulled, a prefill
engine that does not answer) is computed on the decode side instead; an abort while the KV
is on the way, and bad kv_transfer_params, lose nothing. (Two engine processes behind the
proxy, and a prefill engine killed mid-transfer: benchmarks/disagg_prefill.py.)"""
from __future__ import annotations

import socket

import numpy as np
import pytest
from conftest import write_tiny_moe

from jaxvllm import LLM, SamplingParams

PROMPTS = [[int(t) for t in np.random.default_rng(i).integers(3, 256, n)] for i, n in enumerate([40, 100, 17, 64, 5])]
ARGS = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256, num_gpu_blocks_override=80,
            block_size=16, skip_warmup=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def transfer_config(role: str, **extra) -> dict:
    return {"kv_connector": "JaxTransferConnector", "kv_role": role, "kv_port": free_port(),
            "kv_connector_extra_config": extra}


def with_params(params: dict | None, max_tokens: int = 8) -> SamplingParams:
    extra = {"kv_transfer_params": dict(params)} if params is not None else None
    return SamplingParams(temperature=0, max_tokens=max_tokens, min_tokens=max_tokens, extra_args=extra)


def prefill(llm, prompts) -> list[dict]:
    """What a proxy does first: one token from the prefill engine, and where its KV waits."""
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], with_params({"do_remote_decode": True}, 1),
                        use_tqdm=False)
    return [o.kv_transfer_params for o in outs]


def decode(llm, prompts, params) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], [with_params(p) for p in params],
                        use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def assert_pool_whole(llm):
    sched = llm.llm_engine.engine_core.scheduler
    pool = sched.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1 and not sched.requests and not sched.waiting_for_remote


def counters(llm) -> tuple[int, dict]:
    s = llm.llm_engine.engine_core.get_stats()
    return s.num_prefill_tokens, s.kv_connector_stats


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    """A prefill and a decode engine, and the greedy outputs of one engine alone (the prefill
    engine's, for requests without kv_transfer_params)."""
    producer = LLM(str(tiny_model_dir), kv_transfer_config=transfer_config("kv_producer"), **ARGS)
    expected = decode(producer, PROMPTS, [None] * len(PROMPTS))
    consumer = LLM(str(tiny_model_dir), kv_transfer_config=transfer_config("kv_consumer", pull_timeout_s=1.0),
                   **ARGS)
    return expected, producer, consumer


def test_decode_engine_continues_from_the_prefill_engines_kv(engines):
    expected, producer, consumer = engines
    params = prefill(producer, PROMPTS)
    assert all(p["do_remote_prefill"] and p["remote_num_tokens"] == len(q) for p, q in zip(params, PROMPTS))
    prefilled, before = counters(consumer)
    assert decode(consumer, PROMPTS, params) == expected
    prefilled_after, after = counters(consumer)
    # The decode engine computed only each prompt's last token (for its logits).
    assert prefilled_after - prefilled == len(PROMPTS)
    assert after["kv_transfer_received_requests"] - before.get("kv_transfer_received_requests", 0) == len(PROMPTS)
    assert after["kv_transfer_failed_receives"] == before.get("kv_transfer_failed_receives", 0)
    row = consumer.llm_engine.engine_core.model_executor.driver_worker.kv_connector.copier.row_bytes
    blocks = sum(-(-len(p) // 16) for p in PROMPTS)
    assert after["kv_transfer_received_bytes"] - before.get("kv_transfer_received_bytes", 0) == blocks * row
    assert_pool_whole(producer)
    assert_pool_whole(consumer)


def test_a_local_prefix_hit_loads_only_the_rest(engines):
    """The decode engine has a prompt's first blocks cached: it pulls the KV past them."""
    expected, producer, consumer = engines
    consumer.generate([{"prompt_token_ids": PROMPTS[1][:48]}], with_params(None, 1), use_tqdm=False)
    params = prefill(producer, PROMPTS[1:2])
    assert decode(consumer, PROMPTS[1:2], params) == expected[1:2]
    assert_pool_whole(consumer)


def test_failed_pulls_are_computed_on_the_decode_side(engines):
    """An id already pulled (the prefill engine has nothing under it) and a prefill engine
    that does not answer (pull_timeout_s=1): the same outputs, computed here, counted."""
    expected, producer, consumer = engines
    params = prefill(producer, PROMPTS[:2])
    decode(consumer, PROMPTS[:2], params)
    consumer.reset_prefix_cache()  # nothing of these prompts is left here to hit
    silent = dict(params[1], remote_port=free_port())
    prefilled, before = counters(consumer)
    assert decode(consumer, PROMPTS[:2], [params[0], silent]) == expected[:2]
    prefilled_after, after = counters(consumer)
    assert after["kv_transfer_failed_receives"] - before["kv_transfer_failed_receives"] == 2
    assert prefilled_after - prefilled == len(PROMPTS[0]) + len(PROMPTS[1])
    assert_pool_whole(consumer)


def test_an_abort_while_the_kv_is_on_the_way_frees_its_pages(engines):
    expected, producer, consumer = engines
    engine = consumer.llm_engine
    silent = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": free_port(),
              "remote_transfer_id": 1, "remote_num_tokens": len(PROMPTS[1])}
    engine.add_request("waits", {"prompt_token_ids": PROMPTS[1]}, with_params(silent))
    engine.step()
    assert "waits" in engine.engine_core.scheduler.waiting_for_remote
    engine.abort_request(["waits"])
    assert_pool_whole(consumer)
    params = prefill(producer, PROMPTS[:1])  # the pages it held serve the next request
    assert decode(consumer, PROMPTS[:1], params) == expected[:1]
    assert_pool_whole(consumer)


def test_bad_kv_transfer_params_and_settings_are_refused_by_name(engines, tiny_model_dir):
    _, producer, consumer = engines
    with pytest.raises(ValueError, match="do_remote_decode needs kv_role"):
        consumer.generate([{"prompt_token_ids": PROMPTS[0]}], with_params({"do_remote_decode": True}))
    with pytest.raises(ValueError, match="remote_port must be an int"):
        consumer.generate([{"prompt_token_ids": PROMPTS[0]}],
                          with_params({"do_remote_prefill": True, "remote_host": "h", "remote_transfer_id": 1,
                                       "remote_num_tokens": 5}))
    with pytest.raises(ValueError, match="extra_args must be a dict whose one key is kv_transfer_params"):
        SamplingParams(extra_args={"other": 1})
    assert_pool_whole(consumer)
    taken = producer.llm_engine.engine_core.scheduler.connector.port
    for config, match in [({**transfer_config("kv_both"), "kv_port": 0}, "kv_port must be a port"),
                          (transfer_config("kv_both", pull_timeout_s=-1), "pull_timeout_s must be a positive"),
                          (transfer_config("kv_both", num_cpu_blocks=4), "unknown fields"),
                          ({**transfer_config("kv_producer"), "kv_port": taken}, "cannot take the prefill engine")]:
        with pytest.raises(ValueError, match=match):
            LLM(str(tiny_model_dir), kv_transfer_config=config, **ARGS)


def test_the_prefill_engines_held_copies_are_capped(engines, tiny_model_dir):
    """Copies awaiting a pull take num_send_blocks rows at most: a prefill whose copy does not
    fit waits in the queue (the engine runs on), and starts once a decode engine pulls one;
    a prompt whose copy could never fit is refused by name."""
    expected, _, consumer = engines
    producer = LLM(str(tiny_model_dir), kv_transfer_config=transfer_config("kv_producer", num_send_blocks=8), **ARGS)
    engine, sched = producer.llm_engine, producer.llm_engine.engine_core.scheduler
    params = {}
    for i in (0, 3, 0):  # 40 and 64 tokens: 4 rows each (3 and 4 blocks, padded to a power of two)
        engine.add_request(f"p{len(params)}", {"prompt_token_ids": PROMPTS[i]},
                           with_params({"do_remote_decode": True}, 1))
        params[f"p{len(params)}"] = None
    for _ in range(20):
        params |= {o.request_id: o.kv_transfer_params for o in engine.step() if o.finished}
    assert params["p0"] and params["p1"] and params["p2"] is None  # the third waits: 4 + 4 + 4 > 8
    assert [r.request_id for r in sched.waiting] == ["p2"] and sum(sched.connector._held.values()) == 8
    assert decode(consumer, PROMPTS[:1], [params["p0"]]) == expected[:1]  # one copy pulled: room for p2
    while engine.has_unfinished_requests():
        params |= {o.request_id: o.kv_transfer_params for o in engine.step() if o.finished}
    assert decode(consumer, [PROMPTS[3], PROMPTS[0]], [params["p1"], params["p2"]]) == [expected[3], expected[0]]
    # Those pulls free their rows (reported at the next step): the next prefill gets them.
    assert decode(consumer, PROMPTS[3:4], prefill(producer, PROMPTS[3:4])) == expected[3:4]
    with pytest.raises(ValueError, match=r"copy takes 16 blocks, more than .*num_send_blocks=8"):
        producer.generate([{"prompt_token_ids": PROMPTS[1] * 2}], with_params({"do_remote_decode": True}, 1))
    assert_pool_whole(producer)


def test_tiny_moe_decodes_from_transferred_kv(tmp_path_factory):
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer

    path = tmp_path_factory.mktemp("qwen3moe")
    write_tiny_moe(path, "Qwen3Moe")
    load_tokenizer(default_model_path()).save_pretrained(path)
    producer = LLM(str(path), kv_transfer_config=transfer_config("kv_both"), **ARGS)
    consumer = LLM(str(path), kv_transfer_config=transfer_config("kv_both"), **ARGS)
    expected = decode(producer, PROMPTS, [None] * len(PROMPTS))
    assert decode(consumer, PROMPTS, prefill(producer, PROMPTS)) == expected
    assert counters(consumer)[0] == len(PROMPTS)
