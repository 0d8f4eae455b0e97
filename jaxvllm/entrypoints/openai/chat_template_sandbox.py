"""Rendering a chat template that a request brought (`--trust-request-chat-template`).

A template is a program: nested loops can run for minutes or build gigabytes. It runs
in a separate process, in Jinja's immutable sandbox with the environment transformers
gives chat templates, under a memory limit; the server waits `timeout_s` for the text and
kills the process past it (a new one starts on the next render). Output past `max_chars`
is refused. It renders at a lower priority (SANDBOX_NICENESS), so that a template spinning
for its whole timeout leaves the cores to the server (its /health) and the engine. The
model's own template is trusted and renders in a thread of the server.
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import threading

from jaxvllm.process_utils import (
    SANDBOX_NICENESS,
    init_child_process,
    limit_address_space,
    spawn_process,
    start_spawned,
)

_MEMORY_LIMIT = 1 << 30  # bytes of address space the rendering process may add


class ChatTemplateError(ValueError):
    """The template failed, ran too long or rendered too much (the client's doing: 400)."""


def _render(template: str, context: dict, max_chars: int) -> str:
    from datetime import datetime

    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: datetime.now().strftime(fmt))
    pieces, size = [], 0
    for piece in env.from_string(template).generate(**context):
        size += len(piece)
        if size > max_chars:
            raise ChatTemplateError(f"the rendered prompt exceeds {max_chars} characters")
        pieces.append(piece)
    return "".join(pieces)


def _serve_renders(conn, parent_pid: int) -> None:
    """The rendering process: one (template, context, max_chars) in, ("ok"|"error", text) out."""
    if not init_child_process(parent_pid):
        return
    limit_address_space(_MEMORY_LIMIT)
    import jinja2.sandbox  # noqa: F401  (loaded at full priority, before the renders)
    os.nice(SANDBOX_NICENESS)
    while True:
        try:
            template, context, max_chars = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", _render(template, context, max_chars)))
        except MemoryError:
            conn.send(("error", "rendering it ran out of memory"))
        except Exception as e:  # jinja's own errors, the sandbox's refusals, ChatTemplateError
            conn.send(("error", str(e)[:500] or type(e).__name__))


class ChatTemplateSandbox:
    def __init__(self, timeout_s: float, max_chars: int):
        self.timeout_s = timeout_s
        self.max_chars = max_chars
        self._proc = None
        self._conn = None
        self._lock = asyncio.Lock()  # one render at a time: one process
        self._start_lock = threading.Lock()

    def _ensure_process(self):
        with self._start_lock:
            if self._proc is None or not self._proc.is_alive():
                self._conn, child = multiprocessing.Pipe()
                self._proc = spawn_process(_serve_renders, "ChatTemplateSandbox",
                                           (child, os.getpid()), daemon=True)
                start_spawned(self._proc)
                child.close()
        return self._conn

    def _render_blocking(self, template: str, context: dict) -> str:
        conn = self._ensure_process()
        conn.send((template, context, self.max_chars))
        if not conn.poll(self.timeout_s):
            self.close()  # the render goes on in there: end it
            raise ChatTemplateError(f"rendering the chat template took longer than {self.timeout_s} s")
        try:
            status, text = conn.recv()
        except EOFError:
            self.close()
            raise ChatTemplateError("the chat template's rendering process died") from None
        if status != "ok":
            raise ChatTemplateError(text)
        return text

    async def render(self, template: str, context: dict) -> str:
        async with self._lock:
            return await asyncio.to_thread(self._render_blocking, template, context)

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
            self._conn.close()
            self._proc = self._conn = None
