"""What keeps idle or slow connections from using up the server: a deadline for each
request head (uvicorn closes idle keep-alive connections, but not one that never finishes
its headers), connections past the limit closed as they are accepted (uvicorn's own limit
answers 503 only once a request arrives, so idle sockets could still take every file
descriptor), the file-descriptor limit raised to its hard limit, and one log line a minute
instead of a traceback per failed accept() should descriptors run out all the same."""
from __future__ import annotations

import asyncio
import logging
import resource
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)


class HeaderTimeoutH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request head is not complete
    `header_timeout_s` after the connection opened or its previous response ended."""
    header_timeout_s = 10.0  # set per server by `protocol_class`
    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if self.limit_concurrency is not None and len(self.connections) > self.limit_concurrency:
            transport.close()
            return
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._on_header_timeout)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the head is in
            self._cancel_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._cancel_header_deadline()
            self._header_deadline = self.loop.call_later(self.header_timeout_s,
                                                         self._on_header_timeout)

    def connection_lost(self, exc) -> None:
        self._cancel_header_deadline()
        super().connection_lost(exc)

    def _cancel_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _on_header_timeout(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def protocol_class(header_timeout_s: float) -> type[HeaderTimeoutH11Protocol]:
    return type("HeaderTimeoutH11Protocol", (HeaderTimeoutH11Protocol,),
                {"header_timeout_s": header_timeout_s})


def raise_fd_limit() -> int:
    """The soft limit on open files up to the hard one; returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def install_accept_error_handler(loop: asyncio.AbstractEventLoop, every_s: float = 60.0) -> None:
    """asyncio logs a traceback for each accept() that fails for lack of descriptors and
    retries a second later, for as long as they are held: one warning per `every_s`."""
    last = [-every_s]

    def handler(loop, context) -> None:
        if "out of system resource" in context.get("message", ""):
            now = time.monotonic()
            if now - last[0] >= every_s:
                last[0] = now
                logger.warning("Cannot accept connections: %s (open files limit %d); retrying.",
                               context.get("exception"), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
