"""Child processes watched from more than one thread (the engine process, executor workers).

multiprocessing is not thread-safe here: when two threads call waitpid for the same child,
one gets its exit status and the other ECHILD, which `Process.poll` reads as "still running",
so `is_alive()` can say True for a process that is gone. Every reap below goes through one
lock and sets the exit code before releasing it; waiting on a sentinel happens outside it.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import threading
import time

_REAP_LOCK = threading.Lock()


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
