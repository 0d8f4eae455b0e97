"""A real `jaxvllm serve` in a subprocess on 127.0.0.1, shared by the tests of a session.

Not a conftest.py: a second conftest module would shadow tests/conftest.py for the tests
that `from conftest import ...`. Test modules import the fixtures from here; the tiny and the
default model's servers serve every module that asks for them, the others one module each.

The tiny server uses a random-weight Llama with the default model's full vocabulary and
tokenizer, so text prompts and the chat template work while a step costs milliseconds."""
from __future__ import annotations

import glob
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import pytest
from conftest import write_tiny_llama
from prometheus_client.parser import text_string_to_metric_families

API_KEY = "test-key"
# Programs compile on first use (no warm-up) and the KV pool is small: quick to start.
TINY_ENGINE_FLAGS = ["--skip-warmup", "--max-model-len", "512", "--max-num-seqs", "16",
                     "--max-num-batched-tokens", "128", "--kv-cache-memory-bytes", str(32 << 20)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RemoteServer:
    """`jaxvllm serve` in a process group of its own (its pid is the group id), as a
    terminal or a supervisor starts it."""

    def __init__(self, args: list[str], timeout: float = 300.0, wait_ready: bool = True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="jaxvllm-serve-", suffix=".log",
                                               delete=False)
        cmd = [sys.executable, "-m", "jaxvllm.entrypoints.cli", "serve", *args,
               "--host", "127.0.0.1", "--port", str(self.port), "--uvicorn-log-level", "warning"]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=os.environ | {"PYTHONUNBUFFERED": "1"},
                                     start_new_session=True)
        if wait_ready:
            self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jaxvllm serve exited with {self.proc.returncode}:\n{self.log_text()[-5000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"jaxvllm serve did not become healthy:\n{self.log_text()[-5000:]}")

    def group_pids(self) -> list[int]:
        """Processes still in the server's process group, from the process table."""
        pids = []
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                with open(stat) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.proc.pid and fields[0] != "Z":  # pgrp; zombies are gone
                pids.append(int(stat.split("/")[2]))
        return pids

    def log_text(self) -> str:
        """The whole log: a pid or a once-only warning may be far above its tail."""
        with open(self.log.name) as f:
            return f.read()

    @property
    def engine_core_pid(self) -> int:
        match = re.search(r"engine core pid (\d+)", self.log_text())
        assert match, self.log_text()
        return int(match.group(1))

    def metrics(self) -> dict[str, float]:
        """Prometheus samples by name (labels other than model_name and engine appended as
        {k=v}), summed over the engine cores."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = {k: v for k, v in s.labels.items() if k not in ("model_name", "engine")}
                key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"
                                if labels else "")
                out[key] = out.get(key, 0) + s.value
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        if os.path.exists(self.log.name):
            os.unlink(self.log.name)


_servers: dict[str, RemoteServer] = {}


def shared_server(request, key: str, make_args) -> RemoteServer:
    """One server per key, started by the first test that uses the module-scoped fixture
    asking for it (`request.fixturename`) and stopped after the last: a server held for the
    whole session would hold its memory (a server and its engine core, about 1.1 GiB) long
    after its tests."""
    if key not in _servers or _servers[key].proc.poll() is not None:
        _servers[key] = RemoteServer(make_args())
        request.config.add_cleanup(_servers[key].stop)
    request.addfinalizer(lambda: _stop_if_no_later_test_uses(request, key))
    return _servers[key]


def _stop_if_no_later_test_uses(request, key: str) -> None:
    items = request.session.items
    ours = [i for i, item in enumerate(items) if item.module is request.module]
    if not any(request.fixturename in item.fixturenames for item in items[ours[-1] + 1:]):
        _servers.pop(key).stop()


def module_server(request, args: list[str]) -> RemoteServer:
    """A server for one fixture's scope (a module, or one test), stopped when it ends."""
    server = RemoteServer(args)
    request.addfinalizer(server.stop)
    return server


def tiny_model(tmp_path_factory):
    """A random Llama with the default model's full vocabulary and tokenizer."""
    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer

    path = tmp_path_factory.mktemp("tiny-llama-full-vocab")
    write_tiny_llama(path, vocab_size=49152)
    load_tokenizer(default_model_path()).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_server(request, tmp_path_factory):
    profile_dir = str(tmp_path_factory.mktemp("profiles"))
    server = shared_server(request, "tiny", lambda: [
        str(tiny_model(tmp_path_factory)), *TINY_ENGINE_FLAGS,
        "--served-model-name", "tiny", "--api-key", API_KEY, "--profile-dir", profile_dir])
    if not hasattr(server, "profile_dir"):
        server.profile_dir = profile_dir
    return server


@pytest.fixture
def client(tiny_server):
    with httpx.Client(base_url=tiny_server.url, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        yield c
