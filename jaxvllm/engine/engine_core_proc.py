"""EngineCoreProc: the EngineCore in its own process, behind two ZMQ sockets.

Three threads, as in vLLM V1: an input thread decodes messages from the front end into
`input_queue`; the main thread runs the busy loop (take input -> schedule -> execute ->
update -> put output); an output thread encodes `output_queue` onto the output socket.
The socket I/O and msgpack work overlaps the device step that way, and the busy loop
never blocks on the network. Everything received is msgpack decoded into the expected
dataclass (serial_utils); nothing is unpickled.
"""
from __future__ import annotations

import gc
import logging
import queue
import threading
import time

import msgpack
import zmq

from jaxvllm.config import EngineConfig
from jaxvllm.engine.engine_core import EngineCore
from jaxvllm.engine.exceptions import EngineSleepingError
from jaxvllm.engine.messages import (
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineCoreRequestType,
    UtilityOutput,
    UtilityRequest,
)
from jaxvllm.outputs import EngineCoreOutput, FinishReason
from jaxvllm.serial_utils import decode, encode

logger = logging.getLogger(__name__)

# Methods the front end may call by name; nothing else is reachable over the socket.
UTILITY_METHODS = ("get_stats", "reset_prefix_cache", "start_profile", "stop_profile", "sleep",
                   "wake_up", "is_sleeping", "update_weights")
_SHUTDOWN = object()


class EngineCoreProc(EngineCore):
    def __init__(self, config: EngineConfig, input_address: str, output_address: str):
        super().__init__(config)
        # What start-up built (modules, the model's Python objects, compiled programs) lives
        # as long as the process: frozen, it is left out of the oldest generation's
        # collections, which would otherwise walk all of it between two steps (vLLM freezes
        # its engine core's start-up heap too).
        gc.collect()
        gc.freeze()
        self.input_queue: queue.Queue = queue.Queue()
        self.output_queue: queue.Queue = queue.Queue()
        self.ctx = zmq.Context()
        threading.Thread(target=self._process_input_socket, args=(input_address,), daemon=True,
                         name="EngineCoreInput").start()
        self.output_thread = threading.Thread(target=self._process_output_socket,
                                              args=(output_address,), daemon=True,
                                              name="EngineCoreOutput")
        self.output_thread.start()

    # ---- the busy loop ------------------------------------------------------------
    def run_busy_loop(self) -> None:
        while True:
            if not self._process_input_queue():
                return
            if self.has_unfinished_requests():
                outputs = self.step()
                if outputs:
                    self.output_queue.put(EngineCoreOutputs(
                        outputs=outputs, scheduler_stats=self.get_stats(), timestamp=time.monotonic()))

    def _process_input_queue(self) -> bool:
        """Handle every queued message; block for one when there is no work. False: shut down."""
        block = not self.has_unfinished_requests()
        while True:
            try:
                item = self.input_queue.get(block=block)
            except queue.Empty:
                return True
            if item is _SHUTDOWN:
                return False
            self._handle_client_request(*item)
            block = False

    def _handle_client_request(self, kind: EngineCoreRequestType, payload: bytes) -> None:
        if kind == EngineCoreRequestType.ADD:
            self._add_request_or_fail_it(payload)
        elif kind == EngineCoreRequestType.ABORT:
            self.abort_requests(msgpack.unpackb(payload))
        elif kind == EngineCoreRequestType.UTILITY:
            call = decode(UtilityRequest, payload)
            try:
                if call.method not in UTILITY_METHODS:
                    raise ValueError(f"Unknown utility method {call.method!r}.")
                out = UtilityOutput(call.call_id, result=getattr(self, call.method)(*call.args))
            except Exception as e:  # reported to the caller; the engine keeps serving
                out = UtilityOutput(call.call_id, failure_message=f"{type(e).__name__}: {e}")
            self.output_queue.put(EngineCoreOutputs(utility_output=out, timestamp=time.monotonic()))

    def _add_request_or_fail_it(self, payload: bytes) -> None:
        """A request the engine cannot take (undecodable, duplicate id, a grammar that does
        not compile, ...) finishes with an error of its own; the loop and the others go on."""
        try:
            request = decode(EngineCoreRequest, payload)
            self.add_request(request)
        except Exception as e:
            request_id = _request_id_of(payload)
            logger.warning("Rejected request %s: %s: %s", request_id, type(e).__name__, e)
            if request_id is not None:  # sleeping: the message as it is, for the front end's 503
                error = str(e) if isinstance(e, EngineSleepingError) else f"The engine rejected the request: {e}"
                self.output_queue.put(EngineCoreOutputs(outputs=[EngineCoreOutput(
                    request_id, [], FinishReason.ERROR, error=error)], timestamp=time.monotonic()))

    # ---- socket threads -----------------------------------------------------------
    def _process_input_socket(self, address: str) -> None:
        sock = self.ctx.socket(zmq.PULL)
        sock.connect(address)
        while True:
            frames = sock.recv_multipart(copy=False)
            try:
                kind = EngineCoreRequestType(frames[0].bytes)
            except ValueError:
                logger.error("Dropped a message of unknown type %r.", frames[0].bytes[:8])
                continue
            self.input_queue.put((kind, frames[1].bytes))

    def _process_output_socket(self, address: str) -> None:
        sock = self.ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 2000)
        sock.connect(address)
        while True:
            item = self.output_queue.get()
            if item is _SHUTDOWN:
                sock.close()
                return
            sock.send(encode(item), copy=False)

    def shutdown(self) -> None:
        super().shutdown()  # workers and multi-host followers get their clean stop
        self.output_queue.put(_SHUTDOWN)
        self.output_thread.join(timeout=5)


def _request_id_of(payload: bytes) -> str | None:
    try:
        request_id = msgpack.unpackb(payload, raw=False).get("request_id")
    except Exception:
        return None
    return request_id if isinstance(request_id, str) else None
