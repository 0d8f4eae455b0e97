"""Soak of the OpenAI server: many mixed requests with a third of the streams hung up.

N seeded requests (default 300) go out with bounded concurrency (default 32): a mix of
/v1/completions and /v1/chat/completions, streamed and not, greedy and sampled. A third
of the streamed requests are given a long output and closed by the client after their
first few chunks, so the server must abort them in the engine. The same workload runs
--runs times (default 2). After each run the script waits (bounded) for the engine to go
idle and reads `/metrics` and the resident memory (VmRSS) of the server process and of the
engine-core process. It prints one table, writes the figures with --json PATH, and exits
non-zero if any check fails:

  - no 5xx (and no other non-200 status, no transport error, no error event in a stream,
    and every stream that was not dropped ended with [DONE]);
  - the KV cache is whole again: kv_cache_free_blocks == kv_cache_total_blocks,
    kv_cache_usage_perc == 0, num_requests_running == num_requests_waiting == 0;
  - own server: its engine-core process is gone once the server is stopped;
  - RSS of each process grows less than --max-rss-growth % (default 5) from one run to
    the next (the first run compiles the programs and fills the caches; later runs of the
    same workload should not need more memory).

By default it starts its own `jaxvllm serve` on 127.0.0.1 (a free port) over a tiny
random-weight Llama with the default model's tokenizer (a step costs milliseconds, so the
soak exercises the server rather than the model). With --base-url it targets a running
server instead; give --server-pid/--engine-pid (same machine) to measure RSS there.

    python benchmarks/soak.py                                  # 300 requests x 2 runs
    python benchmarks/soak.py --num-requests 24 --runs 2 --json soak.json
    python benchmarks/soak.py --base-url http://127.0.0.1:8000 --server-pid 1234 --engine-pid 1240
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # write_tiny_llama
from benchmarks.workload import corpus_text  # noqa: E402

# As the OpenAI server tests run it (tests/entrypoints/openai/openai_server.py): programs
# compile on first use and the KV pool is small, so the server starts in seconds.
TINY_ENGINE_FLAGS = ["--skip-warmup", "--max-model-len", "512", "--max-num-seqs", "16",
                     "--max-num-batched-tokens", "128", "--kv-cache-memory-bytes", str(32 << 20)]
OWN_API_KEY = "soak-key"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
GAUGES = ("kv_cache_free_blocks", "kv_cache_total_blocks", "kv_cache_usage_perc",
          "num_requests_running", "num_requests_waiting")
COUNTERS = ("num_requests_aborted_total", "generation_tokens_total")


@dataclass
class Spec:
    """One request of the workload."""
    index: int
    endpoint: str                  # "completions" or "chat"
    stream: bool
    drop: bool                     # a stream the client closes after --drop-after chunks
    body: dict


@dataclass
class Result:
    index: int
    endpoint: str
    stream: bool
    drop: bool
    status: int | None = None      # HTTP status; None when the request never got one
    chunks: int = 0                # SSE data events read (streams)
    dropped: bool = False          # closed by the client mid-stream
    done: bool = False             # non-stream: a body with choices; stream: ended with [DONE]
    stream_error: str = ""         # an error event inside a 200 stream
    transport_error: str = ""      # connection error, timeout, bad JSON
    latency: float = 0.0


@dataclass
class RunSummary:
    run: int
    duration_s: float
    requests: int
    statuses: dict[str, int]       # status code (or "none") -> count
    streams: int
    dropped: int
    drops_planned: int
    finished_before_drop: int      # planned drops whose stream ended within --drop-after chunks
    incomplete: int                # non-dropped requests without a full answer
    stream_errors: int
    transport_errors: int
    errors: list[str]              # a few examples
    settled: bool                  # the engine went idle with every block free in time
    metrics: dict[str, float]      # the GAUGES after settling
    aborted: float | None          # num_requests_aborted_total delta over the run
    generation_tokens: float | None
    rss_kb: dict[str, int | None]  # process -> VmRSS after settling
    requests_detail: list[dict] = field(default_factory=list)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default=None,
                   help="a running server (loopback only); default: start a tiny one")
    p.add_argument("--api-key", default=None,
                   help=f"bearer key for the requests (own server: started with it, default {OWN_API_KEY!r})")
    p.add_argument("--model", default=None, help="model id to request (default: the server's first)")
    p.add_argument("--server-pid", type=int, default=None, help="with --base-url: server pid for RSS")
    p.add_argument("--engine-pid", type=int, default=None, help="with --base-url: engine-core pid for RSS")
    p.add_argument("--engine-flags", default=" ".join(TINY_ENGINE_FLAGS),
                   help="own server: engine flags for `jaxvllm serve` (one string)")
    p.add_argument("--server-log", default=None, help="own server: keep its log at this path")
    p.add_argument("--num-requests", type=int, default=300)
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight at most")
    p.add_argument("--runs", type=int, default=2, help="times the same workload is run")
    p.add_argument("--stream-fraction", type=float, default=0.6, help="share of streamed requests")
    p.add_argument("--drop-fraction", type=float, default=1 / 3, help="share of streams dropped")
    p.add_argument("--drop-after", type=int, default=3, help="chunks read before a drop")
    p.add_argument("--output-len", type=int, nargs=2, default=[4, 48], metavar=("MIN", "MAX"),
                   help="max_tokens of requests that run to the end (ignore_eos)")
    p.add_argument("--drop-output-len", type=int, default=256,
                   help="max_tokens of the streams that will be dropped (so they are cut mid-way)")
    p.add_argument("--prompt-words", type=int, nargs=2, default=[4, 80], metavar=("MIN", "MAX"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--run-timeout", type=float, default=1800.0, help="seconds per run at most")
    p.add_argument("--settle-timeout", type=float, default=30.0,
                   help="seconds to wait for the engine to go idle after a run")
    p.add_argument("--max-rss-growth", type=float, default=5.0, help="percent, run over run")
    p.add_argument("--json", default=None, help="write the figures to this path")
    args = p.parse_args(argv)
    for name in ("num_requests", "concurrency", "runs", "drop_after", "drop_output_len"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}.")
    for name in ("stream_fraction", "drop_fraction"):
        if not 0 <= getattr(args, name) <= 1:
            raise ValueError(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(args, name)}.")
    for name in ("output_len", "prompt_words"):
        lo, hi = getattr(args, name)
        if not 1 <= lo <= hi:
            raise ValueError(f"--{name.replace('_', '-')} must satisfy 1 <= MIN <= MAX, got {lo} {hi}.")
    if args.base_url is not None:
        host = urlparse(args.base_url).hostname
        if host not in LOOPBACK:
            raise ValueError(f"--base-url must be a loopback address (127.0.0.1, localhost, ::1), got {host!r}.")
    return args


# --- the workload -----------------------------------------------------------------------

def make_specs(n: int, model: str, args) -> list[Spec]:
    """The seeded mix; the same arguments give the same requests."""
    rng = random.Random(args.seed)
    words = corpus_text().split()
    streams = [rng.random() < args.stream_fraction for _ in range(n)]
    stream_ids = [i for i, s in enumerate(streams) if s]
    drops = set(rng.sample(stream_ids, round(len(stream_ids) * args.drop_fraction)))
    specs = []
    for i in range(n):
        k = rng.randint(*args.prompt_words)
        start = rng.randrange(len(words) - k)
        text = " ".join(words[start:start + k])
        endpoint = "chat" if rng.random() < 0.5 else "completions"
        drop = i in drops
        body: dict = {"model": model, "ignore_eos": True,
                      "max_tokens": args.drop_output_len if drop else rng.randint(*args.output_len)}
        if rng.random() < 0.5:
            body["temperature"] = 0.0
        else:
            body.update(temperature=0.8, top_p=0.95, seed=rng.randrange(1 << 30))
        if endpoint == "chat":
            messages = [{"role": "user", "content": text}]
            if rng.random() < 0.3:
                messages.insert(0, {"role": "system", "content": "You are a terse assistant."})
            body["messages"] = messages
        else:
            body["prompt"] = text
        if streams[i]:
            body["stream"] = True
            if rng.random() < 0.5:
                body["stream_options"] = {"include_usage": True}
        specs.append(Spec(i, endpoint, streams[i], drop, body))
    return specs


async def send(client: httpx.AsyncClient, base_url: str, spec: Spec, drop_after: int) -> Result:
    path = "/v1/chat/completions" if spec.endpoint == "chat" else "/v1/completions"
    r = Result(spec.index, spec.endpoint, spec.stream, spec.drop)
    start = time.perf_counter()
    try:
        if not spec.stream:
            response = await client.post(base_url + path, json=spec.body)
            r.status = response.status_code
            if response.status_code == 200:
                r.done = bool(response.json().get("choices"))
        else:
            async with client.stream("POST", base_url + path, json=spec.body) as response:
                r.status = response.status_code
                if response.status_code != 200:
                    await response.aread()
                else:
                    async for line in response.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[len("data:"):].strip()
                        if data == "[DONE]":
                            r.done = True
                            break
                        event = json.loads(data)
                        if "error" in event:
                            r.stream_error = str(event["error"])[:300]
                            break
                        r.chunks += 1
                        if spec.drop and r.chunks >= drop_after:
                            r.dropped = True  # leaving the block closes the connection
                            break
    except (httpx.HTTPError, json.JSONDecodeError, ValueError) as e:
        r.transport_error = f"{type(e).__name__}: {e}"[:300]
    r.latency = time.perf_counter() - start
    return r


async def run_workload(base_url: str, specs: list[Spec], args, headers: dict) -> tuple[list[Result], float]:
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    gate = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(timeout=args.timeout, headers=headers, limits=limits) as client:
        async def one(spec: Spec) -> Result:
            async with gate:
                return await send(client, base_url, spec, args.drop_after)

        start = time.perf_counter()
        tasks = [asyncio.ensure_future(one(s)) for s in specs]
        done, pending = await asyncio.wait(tasks, timeout=args.run_timeout)
        for t in pending:
            t.cancel()
        results = []
        for spec, t in zip(specs, tasks):
            if t in done and t.exception() is None:
                results.append(t.result())
                continue
            error = (f"not finished within --run-timeout {args.run_timeout} s" if t not in done
                     else f"{type(t.exception()).__name__}: {t.exception()}"[:300])
            results.append(Result(spec.index, spec.endpoint, spec.stream, spec.drop, transport_error=error))
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        return results, time.perf_counter() - start


# --- the server's side ------------------------------------------------------------------

def read_metrics(base_url: str) -> dict[str, float]:
    """The GAUGES and COUNTERS by name without prefix (vLLM's `vllm:` names and the
    `jaxvllm:` ones only jaxvllm has), summed over labels: one model."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(base_url + "/metrics", timeout=10).text
    wanted = {f"{prefix}:{n}" for n in GAUGES + COUNTERS for prefix in ("vllm", "jaxvllm")}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in wanted:
                key = s.name.split(":", 1)[1]
                out[key] = out.get(key, 0.0) + s.value
    return out


def is_settled(m: dict[str, float]) -> bool:
    return (m.get("num_requests_running") == 0 and m.get("num_requests_waiting") == 0
            and m.get("kv_cache_usage_perc") == 0
            and m.get("kv_cache_free_blocks") == m.get("kv_cache_total_blocks", -1) > 0)


def wait_settled(base_url: str, timeout: float) -> tuple[bool, dict[str, float]]:
    """Polls /metrics (every 0.25 s, at most `timeout` s) until the engine is idle and whole."""
    deadline = time.monotonic() + timeout
    m: dict[str, float] = {}
    for _ in range(int(timeout / 0.25) + 2):
        try:
            m = read_metrics(base_url)
        except httpx.HTTPError:
            pass
        if is_settled(m) or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    return is_settled(m), m


def rss_kb(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_tiny_model(path: Path) -> None:
    """A random Llama (2 layers, hidden 64: tests/conftest.py's write_tiny_llama) with the
    default model's vocabulary and tokenizer, as the OpenAI server tests serve it."""
    from conftest import write_tiny_llama

    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer

    write_tiny_llama(path, vocab_size=49152)
    load_tokenizer(default_model_path()).save_pretrained(path)


class OwnServer:
    """`jaxvllm serve` of the tiny model in a subprocess on 127.0.0.1."""

    def __init__(self, args, workdir: Path, start_timeout: float = 300.0):
        model = workdir / "tiny-llama"
        write_tiny_model(model)
        self.api_key = args.api_key or OWN_API_KEY
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(args.server_log) if args.server_log else workdir / "serve.log"
        self.log = open(self.log_path, "w")
        cmd = [sys.executable, "-m", "jaxvllm.entrypoints.cli", "serve", str(model),
               *shlex.split(args.engine_flags), "--served-model-name", "tiny", "--api-key", self.api_key,
               "--host", "127.0.0.1", "--port", str(self.port), "--uvicorn-log-level", "warning"]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=os.environ | {"PYTHONUNBUFFERED": "1"})
        self.pid = self.proc.pid
        self.engine_pid: int | None = None
        self.exit_code: int | None = None
        self.engine_left_behind: bool | None = None
        try:
            self._wait_ready(start_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jaxvllm serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise TimeoutError(f"jaxvllm serve was not healthy within {timeout} s:\n{self.log_tail()}")
        # The pid line is logged just before uvicorn starts listening.
        for _ in range(20):
            match = re.search(r"engine core pid (\d+)", self.log_path.read_text())
            if match:
                self.engine_pid = int(match.group(1))
                return
            time.sleep(0.25)

    def log_tail(self, n: int = 5000) -> str:
        try:
            return self.log_path.read_text()[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.exit_code = self.proc.returncode
        if self.engine_pid is not None:  # the engine core should go with the server
            for _ in range(40):
                if not Path(f"/proc/{self.engine_pid}").exists():
                    break
                time.sleep(0.25)
            self.engine_left_behind = Path(f"/proc/{self.engine_pid}").exists()
        self.log.close()


# --- the soak ---------------------------------------------------------------------------

def summarize(run: int, results: list[Result], duration: float, settled: bool, metrics: dict,
              before: dict, rss: dict) -> RunSummary:
    statuses = Counter(str(r.status) if r.status is not None else "none" for r in results)
    incomplete = [r for r in results if r.status == 200 and not r.dropped and not r.done
                  and not r.stream_error]
    errors = [f"#{r.index} {r.endpoint}: {r.transport_error or r.stream_error}"
              for r in results if r.transport_error or r.stream_error]
    errors += [f"#{r.index} {r.endpoint}: HTTP {r.status}" for r in results
               if r.status is not None and r.status != 200]

    def delta(name):
        if name in metrics and name in before:
            return metrics[name] - before[name]
        return None

    return RunSummary(
        run=run, duration_s=duration, requests=len(results), statuses=dict(sorted(statuses.items())),
        streams=sum(r.stream for r in results), dropped=sum(r.dropped for r in results),
        drops_planned=sum(r.drop for r in results),
        finished_before_drop=sum(r.drop and r.done for r in results),
        incomplete=len(incomplete), stream_errors=sum(bool(r.stream_error) for r in results),
        transport_errors=sum(bool(r.transport_error) for r in results), errors=errors[:8],
        settled=settled, metrics={k: metrics.get(k) for k in GAUGES},
        aborted=delta("num_requests_aborted_total"), generation_tokens=delta("generation_tokens_total"),
        rss_kb=rss, requests_detail=[asdict(r) for r in results])


def growth_pct(runs: list[RunSummary]) -> dict[str, list[float | None]]:
    """Per process, the RSS growth of each run over the run before it, in %."""
    out: dict[str, list[float | None]] = {}
    for name in ("server", "engine_core"):
        values = [r.rss_kb.get(name) for r in runs]
        out[name] = [None if a is None or b is None else 100.0 * (b - a) / a
                     for a, b in zip(values, values[1:])]
    return out


def checks(runs: list[RunSummary], growth: dict, args,
           engine_left_behind: bool | None = None) -> dict[str, bool | None]:
    """Each check passes (True), fails (False) or could not be made (None)."""
    statuses = Counter()
    for r in runs:
        statuses.update(r.statuses)
    measured = [g for gs in growth.values() for g in gs if g is not None]
    return {
        "no_5xx": not any(s.startswith("5") for s in statuses),
        "all_200": set(statuses) <= {"200"},
        "no_transport_errors": all(r.transport_errors == 0 for r in runs),
        "no_stream_errors": all(r.stream_errors == 0 for r in runs),
        "all_completed": all(r.incomplete == 0 for r in runs),
        "streams_dropped": all(r.dropped == r.drops_planned - r.finished_before_drop for r in runs),
        "blocks_free": all(r.settled for r in runs),
        "rss_growth": (all(g < args.max_rss_growth for g in measured) if measured else None),
        "no_process_left": None if engine_left_behind is None else not engine_left_behind,
    }


def print_table(out: dict) -> None:
    print(f"\nSoak: {out['base_url']}  {out['num_requests']} requests x {out['runs_count']} runs, "
          f"concurrency {out['concurrency']}, seed {out['seed']}")
    head = (f"  {'run':>3} {'time s':>7} {'reqs':>5} {'statuses':<16} {'streams':>7} {'dropped':>7} "
            f"{'aborted':>7} {'free/total blocks':>17} {'usage':>5} {'running':>7} "
            f"{'server MB':>9} {'engine MB':>9}")
    print(head)

    def mb(kb):
        return f"{kb / 1024:9.1f}" if kb is not None else f"{'-':>9}"

    for r in out["runs"]:
        m = r["metrics"]
        st = " ".join(f"{k}:{v}" for k, v in r["statuses"].items())
        blocks = f"{m['kv_cache_free_blocks']:.0f}/{m['kv_cache_total_blocks']:.0f}" \
            if m.get("kv_cache_total_blocks") is not None else "-"
        aborted = f"{r['aborted']:.0f}" if r["aborted"] is not None else "-"
        usage = f"{m['kv_cache_usage_perc']:.2f}" if m.get("kv_cache_usage_perc") is not None else "-"
        running = f"{m['num_requests_running']:.0f}" if m.get("num_requests_running") is not None else "-"
        print(f"  {r['run']:>3} {r['duration_s']:7.1f} {r['requests']:>5} {st:<16} {r['streams']:>7} "
              f"{r['dropped']:>7} {aborted:>7} {blocks:>17} {usage:>5} {running:>7} "
              f"{mb(r['rss_kb']['server'])} {mb(r['rss_kb']['engine_core'])}")
        for e in r["errors"]:
            print(f"      error: {e}")
    for name, gs in out["rss_growth_pct"].items():
        cells = ", ".join(f"{g:+.2f}%" if g is not None else "-" for g in gs) or "- (one run)"
        print(f"  RSS growth run over run, {name}: {cells}  (limit {out['max_rss_growth_pct']}%)")
    verdict = {True: "ok", False: "FAIL", None: "not measured"}
    print("  checks: " + ", ".join(f"{k} {verdict[v]}" for k, v in out["checks"].items()))
    print(f"  {'PASSED' if out['passed'] else 'FAILED'}")


def main(argv=None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="jaxvllm-soak-") as tmp:
        server = None
        if args.base_url is None:
            server = OwnServer(args, Path(tmp))
            base_url, api_key = server.url, server.api_key
            pids = {"server": server.pid, "engine_core": server.engine_pid}
        else:
            base_url, api_key = args.base_url.rstrip("/"), args.api_key
            pids = {"server": args.server_pid, "engine_core": args.engine_pid}
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            model = args.model
            if model is None:
                r = httpx.get(base_url + "/v1/models", headers=headers, timeout=30)
                r.raise_for_status()
                model = r.json()["data"][0]["id"]
            specs = make_specs(args.num_requests, model, args)
            runs = []
            for run in range(1, args.runs + 1):
                _, before = wait_settled(base_url, args.settle_timeout)
                results, duration = asyncio.run(run_workload(base_url, specs, args, headers))
                settled, metrics = wait_settled(base_url, args.settle_timeout)
                rss = {name: rss_kb(pid) for name, pid in pids.items()}
                runs.append(summarize(run, results, duration, settled, metrics, before, rss))
        finally:
            if server is not None:
                server.stop()
        growth = growth_pct(runs)
        result_checks = checks(runs, growth, args, server.engine_left_behind if server else None)
        out = {"base_url": base_url, "model": model, "num_requests": args.num_requests,
               "runs_count": args.runs, "concurrency": args.concurrency, "seed": args.seed,
               "drop_after_chunks": args.drop_after, "engine_flags": args.engine_flags if server else None,
               "pids": pids, "max_rss_growth_pct": args.max_rss_growth,
               "runs": [asdict(r) for r in runs], "rss_growth_pct": growth,
               "server_exit_code": server.exit_code if server else None,
               "engine_left_behind": server.engine_left_behind if server else None,
               "checks": result_checks,
               "passed": all(v is not False for v in result_checks.values())}
        if server is not None and not out["passed"]:
            print(f"--- server log (tail) ---\n{server.log_tail()}")
    print_table(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    sys.exit(0 if main()["passed"] else 1)
