"""Clients of the EngineCore: one per way of using it.

- InprocClient: the core in this process, stepped by the caller (tests, notebooks, LLM).
- SyncMPClient: the core in its own process; blocking calls (LLM with multiprocessing).
- AsyncMPClient: the core in its own process; asyncio calls (AsyncLLM, the server).

An MP client starts the engine process (engine_core_handle.py), watches it, and shuts it down. If the
process dies first, every waiting call fails with EngineDeadError within a second or so.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from concurrent.futures import Future

import msgpack
import zmq
import zmq.asyncio

from jaxvllm.config import EngineArgs, EngineConfig
from jaxvllm.engine.engine_core_handle import EngineCoreHandle
from jaxvllm.engine.exceptions import EngineDeadError
from jaxvllm.engine.messages import EngineCoreOutputs, EngineCoreRequest, EngineCoreRequestType, UtilityRequest
from jaxvllm.serial_utils import decode, encode

logger = logging.getLogger(__name__)
_SEND_TIMEOUT_MS = 5000


class InprocClient:
    def __init__(self, config: EngineConfig):
        from jaxvllm.engine.engine_core import EngineCore  # jax: only where the core runs here
        self.engine_core = EngineCore(config)

    def get_output(self) -> EngineCoreOutputs:
        return EngineCoreOutputs(outputs=self.engine_core.step())

    def add_request(self, request: EngineCoreRequest) -> None:
        self.engine_core.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.engine_core.abort_requests(request_ids)

    def call_utility(self, method: str, *args):
        return getattr(self.engine_core, method)(*args)

    def shutdown(self) -> None:
        self.engine_core.shutdown()


class _MPClientBase:
    def __init__(self, args: EngineArgs, zmq_ctx: zmq.Context, dp_rank: int = 0,
                 wait_ready: bool = True):
        self.engine_dead = False
        self.ctx = zmq_ctx
        self.engine = EngineCoreHandle(args, self._on_engine_death, dp_rank)
        self.input_socket = self.ctx.socket(zmq.PUSH)
        self.input_socket.setsockopt(zmq.SNDTIMEO, _SEND_TIMEOUT_MS)
        self.input_socket.setsockopt(zmq.LINGER, 0)
        self.input_socket.bind(self.engine.input_address)
        self.output_socket = self.ctx.socket(zmq.PULL)
        self.output_socket.setsockopt(zmq.LINGER, 0)
        self.output_socket.bind(self.engine.output_address)
        self._call_ids = itertools.count()
        self.pending_utility: dict[int, object] = {}
        self.engine.start()
        self.config: EngineConfig | None = None
        if wait_ready:
            self.wait_ready()

    def wait_ready(self) -> None:
        self.engine.wait_ready()
        self.config = self.engine.config

    @property
    def engine_core_pid(self) -> int | None:
        return self.engine.proc.pid

    def _frames(self, kind: EngineCoreRequestType, payload: bytes) -> list[bytes]:
        if self.engine_dead:
            raise EngineDeadError()
        return [kind.value, payload]

    def _on_engine_death(self) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        self.engine.shutdown()
        self.input_socket.close()
        self.output_socket.close()


class SyncMPClient(_MPClientBase):
    def __init__(self, args: EngineArgs, dp_rank: int = 0, wait_ready: bool = True):
        super().__init__(args, zmq.Context(), dp_rank, wait_ready)
        self.outputs_queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._process_outputs_socket, daemon=True,
                                        name="EngineCoreOutputReader")
        self._reader.start()

    def _process_outputs_socket(self) -> None:
        """Owns the output socket: a zmq socket must not be closed by another thread
        while this one waits on it, so the thread polls, notices _stop and closes it."""
        sock = self.output_socket
        while not self._stop.is_set():
            if not sock.poll(100):
                continue
            outputs = decode(EngineCoreOutputs, sock.recv())
            if outputs.utility_output is not None:
                future = self.pending_utility.pop(outputs.utility_output.call_id, None)
                if future is not None:
                    _resolve(future, outputs.utility_output)
            if outputs.outputs:
                self.outputs_queue.put(outputs)
        sock.close()

    def shutdown(self) -> None:
        self._stop.set()
        self._reader.join(timeout=5)
        self.engine.shutdown()
        self.input_socket.close()

    def _on_engine_death(self) -> None:
        self.engine_dead = True
        self.outputs_queue.put(EngineDeadError())
        for future in list(self.pending_utility.values()):
            future.set_exception(EngineDeadError())
        self.pending_utility.clear()

    def get_output(self) -> EngineCoreOutputs:
        item = self.outputs_queue.get()
        if isinstance(item, Exception):
            self.outputs_queue.put(item)  # every later call fails the same way
            raise item
        return item

    def _send(self, kind, payload) -> None:
        try:
            self.input_socket.send_multipart(self._frames(kind, payload))
        except zmq.Again:
            raise EngineDeadError("The engine core stopped reading its input.") from None

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send(EngineCoreRequestType.ADD, encode(request))

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids and not self.engine_dead:
            self._send(EngineCoreRequestType.ABORT, msgpack.packb(list(request_ids)))

    def call_utility(self, method: str, *args):
        call_id = next(self._call_ids)
        future: Future = Future()
        self.pending_utility[call_id] = future
        self._send(EngineCoreRequestType.UTILITY, encode(UtilityRequest(call_id, method, list(args))))
        return future.result()


class AsyncMPClient(_MPClientBase):
    """All socket work happens in the event loop that first uses the client."""

    def __init__(self, args: EngineArgs, dp_rank: int = 0, wait_ready: bool = True):
        super().__init__(args, zmq.asyncio.Context(), dp_rank, wait_ready)
        self.outputs_queue: asyncio.Queue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader_task: asyncio.Task | None = None

    def _ensure_started(self) -> None:
        if self._reader_task is None:
            self._loop = asyncio.get_running_loop()
            self.outputs_queue = asyncio.Queue()
            self._reader_task = self._loop.create_task(self._process_outputs_socket())
            if self.engine_dead:
                self._fail_all()

    async def _process_outputs_socket(self) -> None:
        while True:
            outputs = decode(EngineCoreOutputs, await self.output_socket.recv())
            if outputs.utility_output is not None:
                future = self.pending_utility.pop(outputs.utility_output.call_id, None)
                if future is not None and not future.done():
                    _resolve(future, outputs.utility_output)
            if outputs.outputs:
                self.outputs_queue.put_nowait(outputs)

    def _on_engine_death(self) -> None:  # runs in the monitor thread
        self.engine_dead = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._fail_all)

    def _fail_all(self) -> None:
        self.outputs_queue.put_nowait(EngineDeadError())
        for future in list(self.pending_utility.values()):
            if not future.done():
                future.set_exception(EngineDeadError())
        self.pending_utility.clear()

    async def get_output_async(self) -> EngineCoreOutputs:
        self._ensure_started()
        item = await self.outputs_queue.get()
        if isinstance(item, Exception):
            self.outputs_queue.put_nowait(item)
            raise item
        return item

    async def _send(self, kind, payload) -> None:
        self._ensure_started()
        try:
            await self.input_socket.send_multipart(self._frames(kind, payload))
        except zmq.Again:
            raise EngineDeadError("The engine core stopped reading its input.") from None

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        await self._send(EngineCoreRequestType.ADD, encode(request))

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        if request_ids and not self.engine_dead:
            await self._send(EngineCoreRequestType.ABORT, msgpack.packb(list(request_ids)))

    async def call_utility_async(self, method: str, *args):
        self._ensure_started()
        call_id = next(self._call_ids)
        future = self._loop.create_future()
        self.pending_utility[call_id] = future
        await self._send(EngineCoreRequestType.UTILITY,
                         encode(UtilityRequest(call_id, method, list(args))))
        return await future

    async def call_utility_by_engine_async(self, method: str, *args) -> dict[int, object]:
        return {0: await self.call_utility_async(method, *args)}

    def shutdown(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
        super().shutdown()


def _resolve(future, utility_output) -> None:
    if utility_output.failure_message is not None:
        future.set_exception(RuntimeError(utility_output.failure_message))
    else:
        future.set_result(utility_output.result)
