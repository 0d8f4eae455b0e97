"""A slow-mask attack against the other requests' time per output token (TPOT): `jaxvllm serve`
decodes `--plain` greedy streams, alone and then beside `--attacks` requests whose grammar
makes each next-token mask slow to compute (sixty regexes alive at every position, each a
lexer that grows with the text: as Lark, and as a JSON schema's alternation at every item
of a long array), sampled at temperature 1. Rounds alternate with and without the attack.
Per round: the plain streams' TPOT (median and max) and what each attack request got.

The server runs the jaxvllm that PYTHONPATH holds, so the same script measures a tree
without the mask budget (core/grammar_limits.py) too.

    python benchmarks/grammar_attack.py --json benchmarks/results/cpu-grammar-attack.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics

from disagg_prefill import workload
from server_process import jaxvllm_server

PATTERNS = [f"[a-z]*{chr(97 + i % 26)}[a-z]{{{6 + i % 9}}}" for i in range(60)]
ATTACKS = {
    "lark": {"grammar": "start: x+\nx: " + " | ".join(f"/{p}/" for p in PATTERNS)},
    "json": {"json": {"type": "array", "minItems": 64, "items": {"anyOf": [
        {"type": "string", "pattern": f"^{p}$"} for p in PATTERNS]}}},
}


def requests(ns, attacked: bool) -> tuple[list, list[str]]:
    rng = random.Random(0)
    plain = {"model": "m", "temperature": 0, "ignore_eos": True, "max_tokens": ns.tokens}
    reqs = [({**plain, "prompt": [rng.randrange(100, 49152) for _ in range(32)]}, 0.0) for _ in range(ns.plain)]
    kinds = ["plain"] * ns.plain
    if attacked:
        for i in range(ns.attacks):
            kind = list(ATTACKS)[i % len(ATTACKS)]
            reqs.append(({"model": "m", "prompt": "Write it.", "temperature": 1.0, "max_tokens": ns.tokens,
                          "structured_outputs": ATTACKS[kind]}, 0.5))
            kinds.append(kind)
    return reqs, kinds


def summarize(results: list[dict], kinds: list[str]) -> dict:
    plain = [r for r, k in zip(results, kinds) if k == "plain" and "error" not in r]
    tpots = [1000 * r["tpot"] for r in plain]
    return {"plain_tpot_median_ms": round(statistics.median(tpots), 1), "plain_tpot_max_ms": round(max(tpots), 1),
            "plain_gap_median_ms": round(1000 * statistics.median(r["gap_median"] for r in plain), 1),
            "plain_gap_max_ms": round(1000 * max(r["gap_max"] for r in plain), 1),
            "plain_errors": sum(1 for r, k in zip(results, kinds) if k == "plain" and "error" in r),
            "attacks": [{"kind": k, **({"error": r["error"][:160]} if "error" in r else
                                       {"chars": len(r.get("text", "")), "latency_s": round(r["latency"], 2)})}
                        for r, k in zip(results, kinds) if k != "plain"]}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plain", type=int, default=4)
    p.add_argument("--attacks", type=int, default=2)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--engine-flags", nargs=argparse.REMAINDER, default=[])
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    server = jaxvllm_server(["serve", "--served-model-name", "m", *ns.engine_flags])
    rounds = []
    try:
        # Warm-up: the buckets compile, and the engine loads llguidance's tokenizer (its first
        # constrained request's one-time cost, about a second of the busy loop).
        asyncio.run(workload(server.url, requests(ns, False)[0] + [({
            "model": "m", "prompt": "Hi", "max_tokens": 4, "structured_outputs": {"regex": "[a-z]+"}}, 0.0)]))
        for r in range(ns.rounds):
            for attacked in (False, True) if r % 2 == 0 else (True, False):
                reqs, kinds = requests(ns, attacked)
                rounds.append({"attack": attacked, **summarize(asyncio.run(workload(server.url, reqs)), kinds)})
                print(json.dumps(rounds[-1]), flush=True)
    finally:
        server.kill()
    out = {"workload": {k: getattr(ns, k) for k in ("plain", "attacks", "tokens", "rounds")}, "rounds": rounds}
    print(f"\n{'attack':8s}{'plain TPOT median ms':>22s}{'max ms':>9s}{'longest gap ms':>16s}  attack requests")
    for r in rounds:
        got = "; ".join(a.get("error", f"{a.get('chars')} chars")[:60] for a in r["attacks"]) or "-"
        print(f"{str(r['attack']):8s}{r['plain_tpot_median_ms']:>22.1f}{r['plain_tpot_max_ms']:>9.1f}"
              f"{r['plain_gap_max_ms']:>16.1f}  {got}")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
