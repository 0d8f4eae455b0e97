"""scripts/serve_tpu_vm.sh --dry-run: the commands it would run on each host of a slice,
and that the engine flags it passes exist (the presets load, the CLI parses the flags)."""
from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from jaxvllm.config import EngineArgs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "serve_tpu_vm.sh")


def dry_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", SCRIPT, "--dry-run", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=30)


def commands(stdout: str) -> list[list[str]]:
    return [shlex.split(line) for line in stdout.splitlines() if line and not line.startswith("#")]


def test_two_host_slice_gets_one_process_per_host_with_its_rank():
    proc = dry_run("--tpu", "my-tpu", "--zone", "us-east5-b", "--config", "configs/tpu-v5e-8.yaml",
                   "--hosts", "10.0.0.2,10.0.0.3", "--model", "/models/my model")
    assert proc.returncode == 0, proc.stderr
    copy, host0, host1, health = commands(proc.stdout)
    assert copy[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and "--worker=all" in copy
    for rank, cmd in enumerate((host0, host1)):
        assert cmd[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-tpu"]
        assert f"--worker={rank}" in cmd
        remote = cmd[cmd.index("--command") + 1]
        install, serve = remote.split(" && ")
        assert shlex.split(install) == ["pip", "install", "-q", "jaxvllm[tpu]"]
        argv = shlex.split(serve.split(" > ")[0])
        assert argv[:3] == ["nohup", "jaxvllm", "serve"]
        flags = dict(zip(argv[3::2], argv[4::2]))
        assert flags == {"--config": "jaxvllm-tpu-v5e-8.yaml", "--host": "0.0.0.0", "--port": "8000",
                         "--model": "/models/my model", "--nnodes": "2", "--node-rank": str(rank),
                         "--master-addr": "10.0.0.2", "--master-port": "29501"}
        # Every flag is an engine argument (or the server's --host/--port).
        fields = set(EngineArgs.__dataclass_fields__)
        assert {f[2:].replace("-", "_") for f in flags} - {"host", "port", "config"} <= fields
    assert "--worker=0" in health and health[-1] == "curl -sf http://localhost:8000/health"


def test_ray_starts_a_cluster_and_one_engine_with_a_worker_per_host():
    proc = dry_run("--tpu", "t", "--zone", "z", "--config", "configs/tpu-v5e-8.yaml", "--ray",
                   "--hosts", "10.0.0.2,10.0.0.3")
    assert proc.returncode == 0, proc.stderr
    _, host0, host1, _ = commands(proc.stdout)
    head = host0[host0.index("--command") + 1].split(" && ")
    assert shlex.split(head[0]) == ["pip", "install", "-q", "jaxvllm[tpu,ray]"]
    assert head[1] == "ray start --head --port 6379"
    argv = shlex.split(head[2].split(" > ")[0])
    assert argv[:4] == ["RAY_ADDRESS=auto", "nohup", "jaxvllm", "serve"]
    flags = dict(zip(argv[4::2], argv[5::2]))
    assert flags["--distributed-executor-backend"] == "ray" and flags["--ray-workers"] == "2"
    assert {f[2:].replace("-", "_") for f in flags} - {"host", "port", "config"} <= set(
        EngineArgs.__dataclass_fields__)
    assert host1[host1.index("--command") + 1].split(" && ")[1] == "ray start --address 10.0.0.2:6379"


def test_single_host_needs_no_distributed_flags():
    proc = dry_run("--tpu", "t", "--zone", "z", "--config", "configs/tpu-v6e-8.yaml", "--hosts", "10.1.1.1")
    assert proc.returncode == 0, proc.stderr
    (_, host0, _) = commands(proc.stdout)
    assert "--nnodes" not in host0[host0.index("--command") + 1]


@pytest.mark.parametrize("args, message", [
    (["--zone", "z", "--config", "configs/tpu-v5e-8.yaml"], "--tpu is required"),
    (["--tpu", "t", "--zone", "z", "--config", "configs/nope.yaml"], "not found"),
    (["--tpu", "t", "--zone", "z", "--config", "configs/tpu-v5e-8.yaml", "--bogus"], "unknown argument"),
])
def test_bad_arguments_fail_clearly(args, message):
    proc = dry_run(*args)
    assert proc.returncode == 2 and message in proc.stderr


@pytest.mark.parametrize("preset", ["tpu-v5e-8", "tpu-v6e-8", "gpu-h100x8"])
def test_presets_are_valid_engine_arguments(preset):
    args = EngineArgs.from_file(os.path.join(ROOT, "configs", f"{preset}.yaml"))
    assert args.tensor_parallel_size == 8 and args.dtype == "bfloat16"
    import transformers
    hf_config = transformers.LlamaConfig(num_key_value_heads=8, max_position_embeddings=8192)
    config = args.create_engine_config(hf_config, "tpu")
    assert config.parallel.tensor_parallel_size == 8


def test_dry_run_without_hosts_calls_no_gcloud(tmp_path):
    """A `gcloud` first on PATH that records being called: a dry run must never call it."""
    called = tmp_path / "called"
    fake = tmp_path / "gcloud"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {called}\necho 10.0.0.1\n")
    fake.chmod(0o755)
    proc = subprocess.run(["bash", SCRIPT, "--dry-run", "--tpu", "t1", "--zone", "z1",
                           "--config", "configs/tpu-v5e-8.yaml"], cwd=ROOT, capture_output=True,
                          text=True, timeout=30, env=os.environ | {"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    assert not called.exists(), called.read_text()
    cmds = commands(proc.stdout)
    assert cmds[0][:5] == ["gcloud", "compute", "tpus", "tpu-vm", "describe"]
    assert any("jaxvllm serve" in " ".join(c) for c in cmds)
