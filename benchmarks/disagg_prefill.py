"""Disaggregated prefill and decode against one engine, as separate processes on this machine:
`jaxvllm serve` as a prefill engine (kv_producer) and as a decode engine (kv_consumer) behind
`jaxvllm disagg-proxy`, and one plain `jaxvllm serve`, each given the same mixed workload in
turn: `--decodes` requests with short prompts and long outputs start at once, and while they
decode, `--long` requests with `--long-len`-token prompts arrive every `--gap` seconds. All
greedy; per request the streamed text, time to first token and time per output token.

Then the failure case: the prefill engine answers `--long` prompts and is killed (SIGKILL)
before the decode engine pulls their KV; those requests, sent to the decode engine beside as
many plain ones, must finish (by recompute) with the same text, the plain ones untouched, and
the decode engine's pool whole afterwards. Their recovery is what they take past requests of
the same shapes computed on the decode engine without P/D beside the same load (its floor:
finding the dead peer, then computing the prompts it did not send); the goal is 5 s.

On a CPU both engines share the same cores, so P/D cannot be faster here: the figures show
what moves and what it costs; the gain needs separate chips.

    python benchmarks/disagg_prefill.py --json benchmarks/results/cpu-disagg-prefill.json
    python benchmarks/disagg_prefill.py --model /tmp/tiny-qwen3moe --long-len 400   # a tiny MoE
    python benchmarks/disagg_prefill.py --only-kill                                  # the failure case
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import signal
import statistics
import time

import httpx
from server_process import ServerProcess, free_port, jaxvllm_server


async def stream(client, url: str, body: dict, delay: float) -> dict:
    await asyncio.sleep(delay)
    start = time.perf_counter()
    text, times = "", []
    async with client.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as response:
        if response.status_code != 200:
            return {"error": (await response.aread()).decode()[:300]}
        async for line in response.aiter_lines():
            if line.startswith("data:") and (data := line[5:].strip()) != "[DONE]":
                event = json.loads(data)
                if "error" in event:
                    return {"error": str(event["error"])[:300]}
                for choice in event.get("choices", []):
                    if choice.get("text"):
                        text += choice["text"]
                        times.append(time.perf_counter())
    n = len(times)
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    return {"text": text, "ttft": times[0] - start, "latency": times[-1] - start,
            "tpot": (times[-1] - times[0]) / (n - 1) if n > 1 else 0.0,
            "gap_median": gaps[len(gaps) // 2] if gaps else 0.0, "gap_max": gaps[-1] if gaps else 0.0}


async def workload(url: str, requests: list[tuple[dict, float]]) -> list[dict]:
    async with httpx.AsyncClient(timeout=1800) as client:
        return await asyncio.gather(*(stream(client, url, body, delay) for body, delay in requests))


def make_requests(args, vocab: int, seed: int = 0) -> tuple[list[tuple[dict, float]], list[str]]:
    rng = random.Random(seed)
    body = {"model": args.served_name, "temperature": 0, "ignore_eos": True}
    reqs, kinds = [], []
    for _ in range(args.decodes):
        prompt = [rng.randrange(100, vocab) for _ in range(32)]
        reqs.append(({**body, "prompt": prompt, "max_tokens": args.decode_tokens}, 0.0))
        kinds.append("decode")
    for i in range(args.long):
        reqs.append(({**body, "prompt": [rng.randrange(100, vocab) for _ in range(args.long_len)], "max_tokens": 16},
                     1.0 + i * args.gap))
        kinds.append("long")
    return reqs, kinds


def summarize(results: list[dict], kinds: list[str]) -> dict:
    out = {}
    for kind in ("long", "decode"):
        rs = [r for r, k in zip(results, kinds) if k == kind and "error" not in r]
        if rs:
            ttft, tpot = sorted(r["ttft"] for r in rs), sorted(r["tpot"] for r in rs)
            out[kind] = {"n": len(rs), "ttft_median_s": round(statistics.median(ttft), 3),
                         "ttft_max_s": round(ttft[-1], 3), "tpot_median_ms": round(1000 * statistics.median(tpot), 2),
                         "tpot_max_ms": round(1000 * tpot[-1], 2)}
    out["errors"] = [r["error"] for r in results if "error" in r]
    return out


def kill_case(args, reference: list[dict] | None, requests, kinds) -> dict:
    """Prefill answers, then SIGKILL; the decode engine gets those params beside plain requests.
    Then its floor: requests of the same shapes (fresh prompts, nothing cached) computed on the
    warm decode engine without P/D, beside the same plain load, so that the recovery's own cost
    is what the affected requests take past it. Without a reference (--only-kill), the texts
    are checked against the same requests computed plainly on the decode engine afterwards."""
    prefill, decode = start_pd(args)
    longs = [b for (b, _), k in zip(requests, kinds) if k == "long"]
    plains = [b for (b, _), k in zip(requests, kinds) if k == "decode"]
    params = [httpx.post(prefill.url + "/v1/completions", timeout=600, json={
        **b, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}).json()["kv_transfer_params"]
        for b in longs]
    prefill.kill(signal.SIGKILL)
    before = decode.metrics()
    failed = lambda m: m.get("jaxvllm:kv_transfer_total[failed_receives]", 0) - before.get(
        "jaxvllm:kv_transfer_total[failed_receives]", 0)
    start = time.perf_counter()
    results = asyncio.run(workload(decode.url, [({**b, "kv_transfer_params": p}, 0.0) for b, p in zip(longs, params)]
                                   + [(b, 0.0) for b in plains]))
    took = time.perf_counter() - start
    # How long each load waited before the decode engine gave it up (its log says).
    waited = [float(t) for t in re.findall(r"not received after ([\d.]+) s", open(decode.log.name).read())]
    time.sleep(1.5)  # /metrics follows the engine's stats once a second
    after = decode.metrics()
    fresh, _ = make_requests(args, args.vocab, seed=1)
    floor = asyncio.run(workload(decode.url, [(b, 0.0) for (b, _), k in zip(fresh, kinds) if k == "long"]
                                 + [(b, 0.0) for (b, _), k in zip(fresh, kinds) if k == "decode"]))
    if reference is None:
        reference = asyncio.run(workload(decode.url, [(b, 0.0) for b, _ in requests]))
    gone = dead_peer_latency(args, decode)
    decode.kill()
    ref_long = [r for r, k in zip(reference, kinds) if k == "long"]
    ref_plain = [r for r, k in zip(reference, kinds) if k == "decode"]
    got_long, got_plain = results[:len(longs)], results[len(longs):]
    affected = [round(g.get("latency", -1), 2) for g in got_long]
    floor_latency = [round(r.get("latency", -1), 2) for r in floor[:len(longs)]]
    return {
        "affected_same_text": all(g.get("text") == r["text"] for g, r in zip(got_long, ref_long)),
        "others_same_text": all(g.get("text") == r["text"] for g, r in zip(got_plain, ref_plain)),
        "affected_latency_s": affected,
        "same_shapes_without_pd_latency_s": floor_latency,
        "dead_peer_found_in_s": max(waited) if waited else None,
        "one_request_alone_s": gone,
        "recovery_s": round(max(affected) - max(floor_latency), 2),
        "all_done_in_s": round(took, 2),
        "failed_receives": failed(after),
        "decode_pool_whole": after["jaxvllm:kv_cache_free_blocks"] == after["jaxvllm:kv_cache_total_blocks"],
        "errors": [g["error"] for g in results if "error" in g],
    }


def dead_peer_latency(args, decode) -> dict:
    """One short request at a time on the idle decode engine, three times each: its KV said to
    wait at a port where nothing listens any more, and the same request without P/D."""
    rng, out = random.Random(2), {"kv_at_a_dead_prefill_engine": [], "without_pd": []}
    for _ in range(3):
        body = {"model": args.served_name, "temperature": 0, "max_tokens": 2,
                "prompt": [rng.randrange(100, args.vocab) for _ in range(64)]}
        gone = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": free_port(),
                "remote_transfer_id": 1, "remote_num_tokens": 64}
        for key, extra in (("kv_at_a_dead_prefill_engine", {"kv_transfer_params": gone}), ("without_pd", {})):
            start = time.perf_counter()
            httpx.post(decode.url + "/v1/completions", timeout=120, json={**body, **extra}).raise_for_status()
            out[key].append(round(time.perf_counter() - start, 3))
            body["prompt"] = [rng.randrange(100, args.vocab) for _ in range(64)]  # nothing cached
    return out


def serve_args(args, *extra) -> list[str]:
    model = [args.model] if args.model else []
    return ["serve", *model, "--served-model-name", args.served_name, "--max-model-len", str(args.max_model_len),
            *args.engine_flags, *extra]


def start_pd(args) -> tuple[ServerProcess, ServerProcess]:
    def config(role):
        return json.dumps({"kv_connector": "JaxTransferConnector", "kv_role": role, "kv_port": free_port()})
    return (jaxvllm_server(serve_args(args, "--kv-transfer-config", config("kv_producer"))),
            jaxvllm_server(serve_args(args, "--kv-transfer-config", config("kv_consumer"))))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="A model path (default: the default model).")
    p.add_argument("--served-name", default="m")
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--decodes", type=int, default=4)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--long", type=int, default=4)
    p.add_argument("--long-len", type=int, default=1500)
    p.add_argument("--gap", type=float, default=1.0)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--only-kill", action="store_true", help="the failure case alone")
    p.add_argument("--engine-flags", nargs=argparse.REMAINDER, default=[])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    requests, kinds = make_requests(args, args.vocab)
    if args.only_kill:
        result = {"model": args.model or "default (SmolLM2-135M-Instruct)",
                  "prefill_killed": kill_case(args, None, requests, kinds)}
        print(json.dumps(result, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        return result

    single = jaxvllm_server(serve_args(args))
    one = asyncio.run(workload(single.url, requests))
    single.kill()

    prefill, decode = start_pd(args)
    proxy = jaxvllm_server(["disagg-proxy", "--prefill", prefill.url, "--decode", decode.url])
    before = decode.metrics()
    pd = asyncio.run(workload(proxy.url, requests))
    time.sleep(1.5)
    after = decode.metrics()
    for proc in (proxy, prefill, decode):
        proc.kill()
    long_tokens = args.long * args.long_len + args.decodes * 32
    moved = after.get("jaxvllm:kv_transfer_total[received_bytes]", 0) - before.get(
        "jaxvllm:kv_transfer_total[received_bytes]", 0)
    received = after.get("jaxvllm:kv_transfer_total[received_requests]", 0) - before.get(
        "jaxvllm:kv_transfer_total[received_requests]", 0)
    result = {
        "model": args.model or "default (SmolLM2-135M-Instruct)",
        "workload": {k: getattr(args, k) for k in ("decodes", "decode_tokens", "long", "long_len", "gap")},
        "same_text": [a.get("text") == b.get("text") for a, b in zip(one, pd)],
        "one_engine": summarize(one, kinds),
        "prefill_decode": summarize(pd, kinds),
        "decode_engine": {
            "prompt_tokens": long_tokens,
            "prefill_tokens_computed": after["jaxvllm:prefill_tokens_computed_total"]
            - before.get("jaxvllm:prefill_tokens_computed_total", 0),
            "received_requests": received, "kv_bytes_per_request": moved / received if received else 0,
            "failed_receives": after.get("jaxvllm:kv_transfer_total[failed_receives]", 0)},
        "prefill_killed": kill_case(args, one, requests, kinds),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
