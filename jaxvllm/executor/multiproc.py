"""MultiprocExecutor: the model in worker processes, one device each, joined by
jax.distributed into one mesh, driven by `collective_rpc(method, args)` over ZMQ.

The engine's own process drives all local devices by default (JAX's way on one host: the
Worker in process, executor/uniproc.py). With distributed_executor_backend="mp" the devices are driven by
`tensor_parallel_size` worker processes instead, so that a crashing worker (driver fault,
OOM kill) fails the engine's requests with a clear error instead of taking the front end
down or hanging it:
- out: one PUB socket broadcasts each call to every worker; back: one PULL socket per worker;
- a monitor thread waits on the workers' process sentinels; the first death marks the
  executor failed, wakes any caller waiting for results (they poll in 0.1 s slices), and
  runs the failure callback;
- shutdown: a grace period, then SIGTERM, then SIGKILL; workers also die with their parent
  (PR_SET_PDEATHSIG), so none is ever orphaned.
"""
from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import tempfile
import threading
import time
import uuid
import weakref

import zmq

from jaxvllm.config import EngineConfig
from jaxvllm.executor.abstract import REFUSABLE, WORKER_METHODS, Executor, WorkerDiedError, check_method
from jaxvllm.process_utils import (
    has_exited,
    init_child_process,
    spawn_process,
    start_spawned,
    stop_processes,
    wait_for_exit,
)
from jaxvllm.serial_utils import decode, encode

logger = logging.getLogger(__name__)
_SHUTDOWN = b"__shutdown__"
_POLL_MS = 100


class MultiprocExecutor(Executor):
    def __init__(self, config: EngineConfig, on_failure=None, shutdown_grace_s: float = 2.0):
        self.on_failure = on_failure
        self.shutdown_grace_s = shutdown_grace_s
        super().__init__(config)

    def _init_executor(self) -> None:
        config, shutdown_grace_s = self.config, self.shutdown_grace_s
        self.world_size = config.parallel.tensor_parallel_size
        self.failure: str | None = None
        self._dead: multiprocessing.Process | None = None  # the first worker seen dead
        self._closing = False

        base = os.path.join(tempfile.gettempdir(), f"jaxvllm-exec-{uuid.uuid4().hex[:12]}")
        self.ctx = zmq.Context()
        self.rpc = self.ctx.socket(zmq.XPUB)
        self.rpc.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.rpc.bind(f"ipc://{base}-rpc")
        self.responses = []
        for rank in range(self.world_size):
            sock = self.ctx.socket(zmq.PULL)
            sock.bind(f"ipc://{base}-resp{rank}")
            self.responses.append(sock)
        with socket_free_port() as port:
            coordinator = f"127.0.0.1:{port}"
        self.procs = [spawn_process(_worker_main, f"JaxvllmWorker-{rank}", daemon=True, args=(
            encode(config), rank, self.world_size, coordinator, f"ipc://{base}-rpc",
            f"ipc://{base}-resp{rank}", os.getpid())) for rank in range(self.world_size)]
        for p in self.procs:
            start_spawned(p)
        self._finalizer = weakref.finalize(self, stop_processes, self.procs, shutdown_grace_s, 1.0)
        threading.Thread(target=self._monitor, daemon=True, name="WorkerMonitor").start()
        self._wait_for_subscribers()

    # ---- RPC ------------------------------------------------------------------------
    def collective_rpc(self, method: str, args: tuple = ()) -> list:
        """Run `method(*args)` on every worker; their results in rank order. Raises
        WorkerDiedError within 0.1 s of a worker's death."""
        check_method(method)
        self._check_alive()
        self.rpc.send_multipart([method.encode(), encode(list(args))])
        results, refused = [], None
        for rank, sock in enumerate(self.responses):
            while not sock.poll(_POLL_MS):
                self._check_alive()
            ok, payload = sock.recv_multipart()
            if ok == b"2":
                refused = payload.decode()
                continue
            if ok != b"1":
                # A peer's death fails the others' collectives too: name the cause if it is that.
                deadline = time.monotonic() + 2.0
                while self._dead is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                self._fail(self._death_message() or f"Worker {rank} failed in {method}: {payload.decode()}")
                self._check_alive()
            kind = WORKER_METHODS[method][1]
            results.append(None if kind is None else decode(kind, payload))
        if refused is not None:
            raise ValueError(refused)
        return results

    def _check_alive(self) -> None:
        # The monitor thread normally notices a death first; asking the processes directly
        # too means no waiting call depends on that thread alone.
        if self.failure is None and not self._closing:
            dead = self._dead or next((p for p in self.procs if has_exited(p)), None)
            if dead is not None:
                self._dead = dead
                self._fail(self._death_message())
        if self.failure is not None:
            raise WorkerDiedError(self.failure)

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
            logger.error("%s", reason)
            if self.on_failure is not None:
                self.on_failure(reason)

    def _monitor(self) -> None:
        sentinels = {p.sentinel: p for p in self.procs}
        dead = sentinels[multiprocessing.connection.wait(list(sentinels))[0]]
        wait_for_exit(dead)  # so that the failure names the dead worker and its exit code
        self._dead = dead
        if not self._closing:
            self._fail(self._death_message())

    def _death_message(self) -> str | None:
        p = self._dead
        if p is None:
            return None
        return (f"Worker process {p.name} (pid {p.pid}) died with exit code {p.exitcode}; "
                f"the engine cannot continue.")

    def _wait_for_subscribers(self) -> None:
        for _ in range(self.world_size):
            while not self.rpc.poll(_POLL_MS):
                self._check_alive()
            self.rpc.recv()

    def shutdown(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self.failure is None:
            self.rpc.send_multipart([_SHUTDOWN, b""])
        self._finalizer()
        for sock in self.responses + [self.rpc]:
            sock.close(linger=0)
        self.ctx.term()


class socket_free_port:
    """A free TCP port on 127.0.0.1 for the jax.distributed coordinator."""

    def __enter__(self) -> int:
        import socket
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return self.sock.getsockname()[1]

    def __exit__(self, *exc) -> None:
        self.sock.close()


def _worker_main(config_bytes: bytes, rank: int, world_size: int, coordinator: str,
                 rpc_address: str, response_address: str, parent_pid: int) -> None:
    """A worker process: one device, joined into the mesh; builds the Worker, then serves
    calls until told to shut down."""
    if not init_child_process(parent_pid):
        return
    # One device per worker: the rank-th GPU; on a CPU, one CPU device (not the parent's
    # simulated count).
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[rank] if len(visible) > rank and visible[rank] else str(rank)
    os.environ["XLA_FLAGS"] = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                                       if not f.startswith("--xla_force_host_platform_device_count"))
    import jax

    from jaxvllm.worker.worker import Worker

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=world_size, process_id=rank)
    ctx = zmq.Context()
    rpc = ctx.socket(zmq.SUB)
    rpc.setsockopt(zmq.SUBSCRIBE, b"")
    rpc.connect(rpc_address)
    out = ctx.socket(zmq.PUSH)
    out.connect(response_address)
    worker = Worker(decode(EngineConfig, config_bytes))
    while True:
        method, payload = rpc.recv_multipart()
        if method == _SHUTDOWN:
            return
        name = method.decode()
        try:
            check_method(name)
            arg_types, result_type = WORKER_METHODS[name]
            result = getattr(worker, name)(*(decode(arg_types, payload) if arg_types else ()))
            out.send_multipart([b"1", b"" if result_type is None else encode(result)])
        except Exception as e:  # reported to the executor, which fails the engine unless refused
            if isinstance(e, ValueError) and name in REFUSABLE:
                out.send_multipart([b"2", str(e).encode()])
                continue
            logger.exception("Worker %d failed in %s.", rank, name)
            out.send_multipart([b"0", f"{type(e).__name__}: {e}".encode()])
