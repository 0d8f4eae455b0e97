"""Compiling a request's grammar where a native crash cannot take the caller with it.

llguidance compiles grammars natively; a grammar past what its recursion survives (a
chain of a few thousand Lark rules, say) overflows the stack and kills the process, and
core/grammar_limits.py can bound JSON schemas and regexes but not every grammar. So the
front end (the server, or LLM's process) checks each new grammar in a process of its own,
with a smaller stack than the engine's threads get, under a memory limit and a time
limit, at a lower priority (SANDBOX_NICENESS); a grammar that crashes it, runs out of
either, or does not compile is the request's 400, and the engine core, which compiles it
again with more stack, only ever sees grammars that compiled here. A new process starts on
the next check after a crash.
"""
from __future__ import annotations

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
    wait_for_exit,
)
from jaxvllm.sampling_params import StructuredOutputsParams

_MEMORY_LIMIT = 2 << 30  # bytes of address space the checking process may add
_STACK_SIZE = 4 << 20  # half of the 8 MiB the engine's threads compile with


def _check_one(data: bytes) -> tuple[str, str]:
    from jaxvllm.core.structured_output import grammar_for
    try:
        grammar_for(StructuredOutputsParams(**json.loads(data)))
    except MemoryError:
        return "error", "structured_outputs: compiling the grammar ran out of memory; simplify it."
    except Exception as e:  # llguidance's and the limits' refusals, which name the problem
        return "error", str(e)[:2000] or type(e).__name__
    return "ok", ""


def _serve_checks(conn, parent_pid: int) -> None:
    """The checking process: grammar params as JSON in, ["ok"|"error", message] out."""
    if not init_child_process(parent_pid):
        return
    limit_address_space(_MEMORY_LIMIT)
    import jaxvllm.core.structured_output  # noqa: F401  (loaded at full priority, before the checks)
    os.nice(SANDBOX_NICENESS)
    threading.stack_size(_STACK_SIZE)
    while True:
        try:
            data = conn.recv_bytes()
        except EOFError:
            return
        reply = []
        worker = threading.Thread(target=lambda: reply.extend(_check_one(data)))  # noqa: B023 (joined below)
        worker.start()
        worker.join()
        conn.send_bytes(json.dumps(reply).encode())


class GrammarSandbox:
    def __init__(self, timeout_s: float = 5.0):
        self.timeout_s = timeout_s
        self._proc = None
        self._conn = None
        self._lock = threading.Lock()  # one check at a time: one process

    def check(self, params: StructuredOutputsParams) -> None:
        """ValueError naming the problem if the grammar does not compile safely."""
        fields = {k: getattr(params, k) for k in ("json", "regex", "choice", "grammar", "json_object")
                  if getattr(params, k) is not None}
        try:
            data = json.dumps(fields, allow_nan=False).encode()
        except (TypeError, ValueError) as e:
            raise ValueError(f"structured_outputs must hold JSON values: {e}.") from None
        with self._lock:
            conn = self._ensure_process()
            conn.send_bytes(data)
            if not conn.poll(self.timeout_s):
                self.close()
                raise ValueError(f"structured_outputs: compiling the grammar took longer than "
                                 f"{self.timeout_s:g} s; simplify it.")
            try:
                status, message = json.loads(conn.recv_bytes())
            except EOFError:
                code = self._proc.exitcode if wait_for_exit(self._proc, 5) else None
                self.close()
                raise ValueError(f"structured_outputs: the grammar crashed its compiler (exit "
                                 f"code {code}); it nests too deep or is too large.") from None
        if status != "ok":
            raise ValueError(message)

    def _ensure_process(self):
        if self._proc is None or not self._proc.is_alive():
            self.close()
            self._conn, child = multiprocessing.Pipe()
            self._proc = spawn_process(_serve_checks, "GrammarSandbox", (child, os.getpid()), daemon=True)
            start_spawned(self._proc)
            child.close()
        return self._conn

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            wait_for_exit(self._proc, 5)
            self._conn.close()
            self._proc = self._conn = None
