"""The front end's handle on one engine core process: spawn it, wait for READY (or the
one-line reason it could not start), watch for its death, and stop it."""
from __future__ import annotations

import logging
import multiprocessing
import os
import tempfile
import threading
import uuid
import weakref

import msgpack

from jaxvllm.config import EngineArgs, EngineConfig
from jaxvllm.engine.engine_core_main import run_engine_core
from jaxvllm.process_utils import has_exited, spawn_process, start_spawned, stop_processes, wait_for_exit
from jaxvllm.serial_utils import decode, encode

logger = logging.getLogger(__name__)


class EngineCoreHandle:
    """The spawned engine process and its two sockets' addresses; shut down on collection.
    With data parallelism, `dp_rank` picks the process's own set of devices."""

    def __init__(self, args: EngineArgs, on_death, dp_rank: int = 0):
        base = os.path.join(tempfile.gettempdir(), f"jaxvllm-{uuid.uuid4().hex[:12]}")
        self.input_address, self.output_address = f"ipc://{base}-in", f"ipc://{base}-out"
        reader, writer = multiprocessing.Pipe(duplex=False)
        per_rank = args.tensor_parallel_size * args.pipeline_parallel_size
        device_set = (dp_rank, per_rank) if args.data_parallel_size > 1 else None
        self.proc = spawn_process(run_engine_core, f"EngineCore_DP{dp_rank}", args=(
            encode(args), self.input_address, self.output_address, writer, os.getpid(), device_set))
        self.on_death = on_death
        self.stopping = threading.Event()
        self._reader, self._writer = reader, writer
        self._finalizer = weakref.finalize(self, _terminate, self.proc, self.stopping)
        self.config: EngineConfig | None = None  # resolved by the engine process

    def start(self) -> None:
        """From a thread that outlives the engine: the child dies with the thread that
        started it (PR_SET_PDEATHSIG follows the thread, not the process)."""
        start_spawned(self.proc)
        self._writer.close()

    def wait_ready(self) -> None:
        """ValueError for a bad argument or model (one line to report); RuntimeError if the
        engine failed otherwise. Interrupted (Ctrl-C), the engine process ends at once."""
        try:
            while not self._reader.poll(0.1):
                if has_exited(self.proc):
                    raise RuntimeError(f"The engine core process exited with code "
                                       f"{self.proc.exitcode} during start-up; see its log above.")
            msg = msgpack.unpackb(self._reader.recv_bytes())
        except BaseException:
            self.shutdown()
            raise
        if msg["status"] != "READY":
            wait_for_exit(self.proc, 10)
            if msg.get("invalid_argument"):
                raise ValueError(msg["error"])
            raise RuntimeError(f"The engine core failed to start: {msg.get('error')}")
        self.config = decode(EngineConfig, msg["config"])
        threading.Thread(target=self._monitor, daemon=True, name="EngineCoreMonitor").start()

    def _monitor(self) -> None:
        wait_for_exit(self.proc)
        if not self.stopping.is_set():
            logger.error("The engine core process died (exit code %s).", self.proc.exitcode)
            self.on_death()

    def shutdown(self) -> None:
        self._finalizer()


def _terminate(proc, stopping: threading.Event) -> None:
    stopping.set()
    stop_processes([proc])
