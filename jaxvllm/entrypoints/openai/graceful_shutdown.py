"""Stopping the server on SIGINT or SIGTERM without dropping what is in flight.

The first signal drains: new requests (and /health) get 503 so that load balancers move
on, requests in flight run to the end for up to `shutdown_timeout_s`, and any still open
then end with an error of their own (a stream's last event); uvicorn then stops and the
caller stops the engine. A second signal stops at once. uvicorn's own handler would stop
accepting at once, cancel streams mid-token and re-raise the signal after shutdown (the
traceback and exit code 130 of a Ctrl-C).
"""
from __future__ import annotations

import asyncio
import logging
import time

import uvicorn

from jaxvllm.engine.exceptions import EngineGenerateError

logger = logging.getLogger(__name__)


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine, shutdown_timeout_s: float):
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout_s = shutdown_timeout_s
        self._drain: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig, frame) -> None:
        if self._drain is None and self.started:
            self._loop.call_soon_threadsafe(self._start_drain)
        else:  # a second signal, or one before the server was up
            self.should_exit = self.force_exit = True

    def _start_drain(self) -> None:
        if self._drain is None:
            self._drain = self._loop.create_task(self.drain())

    async def drain(self) -> None:
        self.config.app.state.draining = True
        deadline = time.monotonic() + self.shutdown_timeout_s
        pending = self.engine.get_num_unfinished_requests()
        logger.info("Shutting down: refusing new requests, waiting up to %.0f s for %d in flight.",
                    self.shutdown_timeout_s, pending)
        while pending and time.monotonic() < deadline and not self.force_exit:
            await asyncio.sleep(0.1)
            pending = self.engine.get_num_unfinished_requests()
        if pending:
            logger.warning("Ending %d request(s) still in flight after %.0f s.", pending,
                           self.shutdown_timeout_s)
            self.engine.fail_all_requests(EngineGenerateError(
                "The server is shutting down; this request did not finish in time."))
            await asyncio.sleep(0.2)  # the streams write their last event
        self.should_exit = True
