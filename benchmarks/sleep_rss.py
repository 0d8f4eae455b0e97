"""Host memory (RSS) of a server's engine-core process across /sleep and /wake_up cycles on
a CPU host, as a client drives it: on the CPU the "device" is host memory, so sleep must
give it back, and cycles must not pile it up. Each cycle serves a few completions, sleeps,
wakes up. Prints RSS awake and asleep per cycle and the last awake RSS against the first
(the bound asked for: within 10%).

    python benchmarks/sleep_rss.py [--model PATH] [--cycles 20] [--level 1] [--json PATH]

Run it with PYTHONPATH pointing at another checkout to measure that code as the peer.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def start_server(model: str | None, port: int, log) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "jaxvllm.entrypoints.cli", "serve", *([model] if model else []),
           "--enable-sleep-mode", "--skip-warmup", "--served-model-name", "m", "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "512", "--uvicorn-log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server did not start")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--level", type=int, default=1)
    parser.add_argument("--json", default=None)
    ns = parser.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tempfile.NamedTemporaryFile("w+", suffix=".log")
    proc = start_server(ns.model, port, log)
    try:
        log.seek(0)
        pid = int(re.search(r"engine core pid (\d+)", log.read()).group(1))
        c = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300)
        body = {"model": "m", "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}
        first_text = c.post("/v1/completions", json=body).json()["choices"][0]["text"]
        rows = []
        for cycle in range(ns.cycles):
            for _ in range(3):
                assert c.post("/v1/completions", json=body).status_code == 200
            awake = rss_mib(pid)
            assert c.post("/sleep", params={"level": ns.level}).status_code == 200
            asleep = rss_mib(pid)
            assert c.post("/wake_up").status_code == 200
            same = c.post("/v1/completions", json=body).json()["choices"][0]["text"] == first_text
            rows.append({"cycle": cycle + 1, "awake_mib": round(awake, 1), "asleep_mib": round(asleep, 1),
                         "same_output": same})
            print(f"cycle {cycle + 1:2d}: awake {awake:8.1f} MiB  asleep {asleep:8.1f} MiB  "
                  f"same output {same}", flush=True)
        final = rss_mib(pid)
    finally:
        proc.terminate()
        proc.wait(60)
    r = {"code": os.environ.get("PYTHONPATH", ""), "level": ns.level, "cycles": rows,
         "awake_after_mib": round(final, 1), "growth_vs_first": round(final / rows[0]["awake_mib"] - 1, 4)}
    print(f"awake after {ns.cycles} cycles: {final:.1f} MiB ({r['growth_vs_first']:+.1%} vs the first); "
          f"asleep {min(x['asleep_mib'] for x in rows):.1f}-{max(x['asleep_mib'] for x in rows):.1f} MiB")
    if ns.json:
        Path(ns.json).write_text(json.dumps(r, indent=1))
    return r


if __name__ == "__main__":
    main()
