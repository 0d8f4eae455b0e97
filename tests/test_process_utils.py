"""Reaping a child watched from two threads: whoever loses the waitpid race must still see
the child gone (plain multiprocessing can report a reaped child as alive)."""
from __future__ import annotations

import multiprocessing
import threading
import time

from jaxvllm.process_utils import has_exited, stop_processes, wait_for_exit

_SPAWN = multiprocessing.get_context("spawn")


def test_two_threads_waiting_on_one_exit_both_see_it_gone():
    for _ in range(20):  # plain join() + is_alive() from two threads fails ~1 in 40 here
        proc = _SPAWN.Process(target=time.sleep, args=(0.02,))
        proc.start()
        seen = []
        watcher = threading.Thread(target=lambda: seen.append(wait_for_exit(proc)))  # noqa: B023 (joined below)
        watcher.start()
        assert wait_for_exit(proc, 30)
        assert not proc.is_alive() and proc.exitcode == 0
        watcher.join(30)
        assert seen == [True]


def test_stop_processes_terminates_a_child_that_will_not_exit_by_itself():
    procs = [_SPAWN.Process(target=time.sleep, args=(60,)) for _ in range(2)]
    for p in procs:
        p.start()
    assert not wait_for_exit(procs[0], 0.1) and not has_exited(procs[0])
    stop_processes(procs, grace_s=0.2)
    assert all(has_exited(p) and p.exitcode == -15 for p in procs)
