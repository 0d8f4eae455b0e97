"""Online serving benchmark: an OpenAI-API load generator for any compatible server
(`jaxvllm serve`, vLLM's `vllm serve`, ...).

Requests of the seeded synthetic workload (benchmarks/workload.py) are streamed from
/v1/completions (stream=true, max_tokens from the workload, ignore_eos so every server does
the same work) with Poisson arrivals at --request-rate (inf: all at once). Per request it
records the time to first token (TTFT), the gaps between streamed chunks (ITL) and the time
per output token after the first (TPOT); it prints their p50/p90/p99, request and token
throughput and failures, and writes them with --json PATH.

    jaxvllm serve --port 8000 &
    python benchmarks/serving.py --base-url http://127.0.0.1:8000 --num-prompts 32 --request-rate 2
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.workload import make_workload  # noqa: E402

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    prompt_len: int
    success: bool = False
    ttft: float = 0.0                      # seconds from sending to the first content chunk
    itl: list[float] = field(default_factory=list)  # seconds between later content chunks
    latency: float = 0.0
    output_tokens: int = 0                 # from the server's usage, else content chunks
    error: str = ""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument("--model", default=None, help="model id to request (default: the server's first model)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer path for building prompts (default: jaxvllm's default model's)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (Poisson); inf: all at once")
    p.add_argument("--max-concurrency", type=int, default=None, help="at most this many requests in flight")
    p.add_argument("--input-len", type=int, nargs=2, default=[32, 256], metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=[16, 128], metavar=("MIN", "MAX"))
    p.add_argument("--prompt-format", choices=("ids", "text"), default="ids",
                   help="send token ids (exact lengths) or their decoded text")
    p.add_argument("--no-ignore-eos", action="store_true", help="don't send vLLM's ignore_eos extra field")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--json", default=None, help="write the figures to this path")
    args = p.parse_args(argv)
    if args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be at least 1, got {args.num_prompts}.")
    if not args.request_rate > 0:
        raise ValueError(f"--request-rate must be positive (or inf), got {args.request_rate}.")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be at least 1, got {args.max_concurrency}.")
    for name in ("input_len", "output_len"):
        lo, hi = getattr(args, name)
        if not 1 <= lo <= hi:
            raise ValueError(f"--{name.replace('_', '-')} must satisfy 1 <= MIN <= MAX, got {lo} {hi}.")
    return args


def load_tokenizer(path: str | None):
    if path is None:
        from jaxvllm.transformers_utils.model_path import default_model_path
        from jaxvllm.transformers_utils.tokenizer import load_tokenizer as load
        return load(default_model_path())
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path)


def arrival_delays(n: int, rate: float, seed: int) -> list[float]:
    """Seconds after the start at which each request is sent: a Poisson process."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def send_request(client: httpx.AsyncClient, url: str, body: dict, prompt_len: int) -> RequestResult:
    result = RequestResult(prompt_len=prompt_len)
    start = last = time.perf_counter()
    chunks = usage_tokens = 0
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread()).decode()[:300]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    result.error = str(event["error"])[:300]
                    return result
                if event.get("usage"):
                    usage_tokens = event["usage"].get("completion_tokens") or usage_tokens
                if any(c.get("text") for c in event.get("choices", [])):
                    now = time.perf_counter()
                    if chunks == 0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                    chunks += 1
        result.latency = time.perf_counter() - start
        result.output_tokens = usage_tokens or chunks
        result.success = chunks > 0
        if not result.success:
            result.error = "the stream carried no text"
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        result.error = f"{type(e).__name__}: {e}"
    return result


async def resolve_model(client: httpx.AsyncClient, base_url: str) -> str:
    response = await client.get(base_url.rstrip("/") + "/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


async def run_benchmark(args, prompts: list, prompt_lens: list[int], output_lens: list[int]) -> tuple:
    """Sends every request at its arrival time; returns (results, wall seconds, model id)."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.max_concurrency or len(prompts),
                          max_keepalive_connections=args.max_concurrency or len(prompts))
    async with httpx.AsyncClient(timeout=args.timeout, headers=headers, limits=limits) as client:
        model = args.model or await resolve_model(client, args.base_url)
        url = args.base_url.rstrip("/") + args.endpoint
        gate = asyncio.Semaphore(args.max_concurrency or len(prompts))

        async def one(delay: float, prompt, prompt_len: int, max_tokens: int) -> RequestResult:
            await asyncio.sleep(delay)
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                    "stream": True, "stream_options": {"include_usage": True}}
            if not args.no_ignore_eos:
                body["ignore_eos"] = True
            async with gate:
                return await send_request(client, url, body, prompt_len)

        delays = arrival_delays(len(prompts), args.request_rate, args.seed)
        start = time.perf_counter()
        results = await asyncio.gather(*(one(d, p, n, m) for d, p, n, m
                                         in zip(delays, prompts, prompt_lens, output_lens)))
        return results, time.perf_counter() - start, model


def summarize(results: list[RequestResult], duration: float) -> dict:
    ok = [r for r in results if r.success]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]

    def stats_ms(values: list[float]) -> dict:
        if not values:
            return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
        arr = np.asarray(values) * 1e3
        return {"mean": float(arr.mean()), **{f"p{q}": float(np.percentile(arr, q)) for q in PERCENTILES}}

    return {"completed": len(ok), "failed": len(results) - len(ok),
            "errors": sorted({r.error for r in results if not r.success})[:5],
            "duration_s": duration, "input_tokens": in_tokens, "output_tokens": out_tokens,
            "request_throughput": len(ok) / duration, "output_tok_s": out_tokens / duration,
            "total_tok_s": (in_tokens + out_tokens) / duration,
            "ttft_ms": stats_ms([r.ttft for r in ok]), "tpot_ms": stats_ms(tpots),
            "itl_ms": stats_ms([g for r in ok for g in r.itl])}


def print_table(summary: dict, model: str, args) -> None:
    print(f"\nServing benchmark: {args.base_url} model={model} rate={args.request_rate} req/s")
    print(f"  completed {summary['completed']}, failed {summary['failed']} "
          f"in {summary['duration_s']:.2f} s")
    for e in summary["errors"]:
        print(f"    error: {e}")
    print(f"  requests/s {summary['request_throughput']:.2f}   output tok/s {summary['output_tok_s']:.1f}"
          f"   total tok/s {summary['total_tok_s']:.1f}")
    print(f"  {'ms':<5} {'mean':>9} " + " ".join(f"{'p' + str(q):>9}" for q in PERCENTILES))
    for name in ("ttft", "tpot", "itl"):
        row = summary[f"{name}_ms"]
        cells = [row["mean"]] + [row[f"p{q}"] for q in PERCENTILES]
        print(f"  {name.upper():<5} " + " ".join(f"{c:>9.1f}" if c is not None else f"{'-':>9}" for c in cells))


def main(argv=None) -> dict:
    args = parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer)
    workload = make_workload(tokenizer, args.num_prompts, tuple(args.input_len), tuple(args.output_len),
                             args.seed)
    prompts = (workload.prompts if args.prompt_format == "ids"
               else [tokenizer.decode(p) for p in workload.prompts])
    results, duration, model = asyncio.run(run_benchmark(
        args, prompts, [len(p) for p in workload.prompts], workload.output_lens))
    summary = summarize(results, duration)
    print_table(summary, model, args)
    out = {"workload": workload.describe(), "base_url": args.base_url, "model": model,
           "request_rate": args.request_rate if math.isfinite(args.request_rate) else "inf",
           "max_concurrency": args.max_concurrency,
           "prompt_format": args.prompt_format, **summary,
           "requests": [asdict(r) for r in results]}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
