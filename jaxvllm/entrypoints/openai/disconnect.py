"""Cancel a request's handler when its client goes away, so that the engine aborts the
request and its KV blocks return to the pool at once."""
from __future__ import annotations

import asyncio
import logging

from fastapi import Request
from fastapi.responses import Response

logger = logging.getLogger(__name__)


async def _wait_for_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(raw: Request, coro):
    """Run a handler (its body already read) and cancel it if the client goes away first."""
    handler = asyncio.ensure_future(coro)
    watcher = asyncio.ensure_future(_wait_for_disconnect(raw))
    try:
        await asyncio.wait({handler, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not handler.done():
        handler.cancel()
        logger.info("Client disconnected; request cancelled.")
        return Response(status_code=499)
    return handler.result()
