"""Child processes: started from any script, watched from more than one thread (the engine
process, executor workers).

`start_spawned` starts a "spawn" process (a fresh interpreter: jax and threads do not
survive fork) without the spawn method's habit of re-running the parent's main script in
the child, which is what makes a script without an `if __name__ == "__main__":` guard
start its own engine again (and fail in the bootstrapping phase). Our children's targets
live in the package and need nothing from that script.

multiprocessing is not thread-safe here: when two threads call waitpid for the same child,
one gets its exit status and the other ECHILD, which `Process.poll` reads as "still running",
so `is_alive()` can say True for a process that is gone. Every reap below goes through one
lock and sets the exit code before releasing it; waiting on a sentinel happens outside it.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
import sys
import threading
import time
import types

_REAP_LOCK = threading.Lock()
_START_LOCK = threading.Lock()
# The processes that run a request's chat template or compile its grammar run this much
# nicer than the server and the engine: work a hostile request makes spin for its whole
# time limit gets about a tenth of a core the others also want.
SANDBOX_NICENESS = 10
_SPAWN = multiprocessing.get_context("spawn")


def spawn_process(target, name: str, args: tuple = (), daemon: bool | None = None
                  ) -> multiprocessing.Process:
    return _SPAWN.Process(target=target, name=name, args=args, daemon=daemon)


def start_spawned(proc: multiprocessing.Process) -> None:
    """Start a spawn_process while `__main__` looks empty, so that the child does not import
    the parent's main script (multiprocessing reads `sys.modules["__main__"]` only here)."""
    with _START_LOCK:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            proc.start()
        finally:
            sys.modules["__main__"] = main


def init_child_process(parent_pid: int) -> bool:
    """A child's first call. Linux SIGKILLs it when its parent dies, so that no engine or
    worker outlives the front end; a terminal's Ctrl-C (SIGINT to the whole process group)
    is left to the parent, which stops its children in order. False: the parent is gone."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return os.getppid() == parent_pid  # else the parent died before prctl took effect


def wait_for_exit(proc: multiprocessing.Process, timeout: float | None = None) -> bool:
    """Wait up to `timeout` seconds for `proc` to exit; True once it has been reaped (its
    `exitcode` is then set)."""
    if not multiprocessing.connection.wait([proc.sentinel], timeout):
        return False
    # The sentinel closes when the child releases its files, a moment before it is reapable.
    with _REAP_LOCK:
        proc.join()
    return True


def has_exited(proc: multiprocessing.Process) -> bool:
    """Non-blocking: has `proc` exited (reaping it if so)?"""
    with _REAP_LOCK:
        return proc.exitcode is not None


def stop_processes(procs: list[multiprocessing.Process], grace_s: float = 0.0,
                   signal_wait_s: float = 5.0) -> None:
    """Give `procs` `grace_s` seconds to exit on their own, then SIGTERM, then SIGKILL."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        wait_for_exit(p, max(0.0, deadline - time.monotonic()))
    for send in (lambda p: p.terminate(), lambda p: p.kill()):
        alive = [p for p in procs if not has_exited(p)]
        for p in alive:
            send(p)
        for p in alive:
            wait_for_exit(p, signal_wait_s)


def limit_address_space(extra_bytes: int) -> None:
    """Cap this process's address space at what it maps now plus extra_bytes (a sandboxed
    child's bound on what one input may make it allocate)."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        limit = int(f.read().split()[0]) * resource.getpagesize() + extra_bytes
    if hard == resource.RLIM_INFINITY or limit < hard:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
