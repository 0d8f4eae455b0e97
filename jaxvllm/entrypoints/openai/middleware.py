"""One ASGI middleware for what every request goes through before its handler:
503 while the server drains for shutdown, the API key (on every path but the probes in
OPEN_PATHS), the request-size limit, and echoing `x-request-id`.

Pure ASGI rather than BaseHTTPMiddleware, which would buffer streamed responses and
hide client disconnects from the handlers."""
from __future__ import annotations

import secrets

from jaxvllm.entrypoints.openai.errors import APIError, error_response

# Liveness, version and metrics probes answer without a key (load balancers and
# Prometheus scrape them); everything that does work needs it.
OPEN_PATHS = frozenset({"/health", "/version", "/metrics"})


class ServerMiddleware:
    def __init__(self, app, api_key: str | None, max_request_bytes: int):
        self.app = app
        self.api_key = api_key
        self.max_request_bytes = max_request_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        request_id = headers.get(b"x-request-id")

        async def send_with_id(message):
            if message["type"] == "http.response.start" and request_id is not None:
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id)]
            await send(message)

        if scope["app"].state.draining and scope["path"] not in ("/metrics", "/version"):
            response = error_response("The server is shutting down.", 503)
            return await response(scope, receive, send_with_id)
        if self.api_key and scope["path"] not in OPEN_PATHS and not self._authorized(headers):
            response = error_response("Missing or invalid API key: send the header "
                                      "'Authorization: Bearer <key>'.", 401)
            return await response(scope, receive, send_with_id)
        limit = self.max_request_bytes
        length = headers.get(b"content-length", b"").decode("latin-1")
        if length.isdigit() and int(length) > limit:
            response = error_response(f"The request body ({length} bytes) exceeds the limit of "
                                      f"{limit} bytes.", 413)
            return await response(scope, receive, send_with_id)
        received = 0

        async def limited_receive():  # chunked bodies carry no content-length
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise APIError(f"The request body exceeds the limit of {limit} bytes.", 413)
            return message

        await self.app(scope, limited_receive, send_with_id)

    def _authorized(self, headers: dict) -> bool:
        given = headers.get(b"authorization", b"").decode("latin-1")
        return secrets.compare_digest(given.encode(), f"Bearer {self.api_key}".encode())
