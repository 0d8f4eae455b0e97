"""advise_huge_pages: what it reports collapsed is backed by huge pages in /proc/self/smaps,
values are untouched, small buffers are left alone, a stop request ends it, and the thread
that collapses runs at idle priority."""
from __future__ import annotations

import os
import sys
import threading

import jax.numpy as jnp
import numpy as np
import pytest

from jaxvllm.platforms.huge_pages import HUGE_PAGE, advise_huge_pages, huge_page_ranges, run_at_idle_priority

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux advice")


def anon_huge_bytes(address: int) -> int:
    """AnonHugePages of the mapping that holds `address`."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1]) * 1024
    return 0


def test_collapsed_bytes_are_huge_pages_and_values_are_kept():
    x = jnp.arange(24 * HUGE_PAGE // 4, dtype=jnp.float32)
    want = np.asarray(x).copy()
    ranges = huge_page_ranges({"w": x, "small": jnp.ones(16)})
    assert len(ranges) == 1
    collapsed = advise_huge_pages(ranges)
    assert collapsed % HUGE_PAGE == 0 and collapsed <= x.nbytes
    if collapsed:  # a kernel without MADV_COLLAPSE (before 6.1) collapses nothing now
        assert anon_huge_bytes(x.unsafe_buffer_pointer() + x.nbytes // 2) >= collapsed
    np.testing.assert_array_equal(np.asarray(x), want)


def test_small_buffers_are_left_alone():
    assert huge_page_ranges([jnp.ones((1024, 1024))]) == []  # 4 MiB: under the 16 MiB floor


def test_a_stop_request_ends_the_collapse():
    x = jnp.ones(24 * HUGE_PAGE // 4, dtype=jnp.float32)
    stop = threading.Event()
    stop.set()
    assert advise_huge_pages(huge_page_ranges(x), stop) == 0


def test_the_collapsing_thread_runs_at_idle_priority():
    policies = []

    def body():
        run_at_idle_priority()
        policies.append(os.sched_getscheduler(0))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert policies == [os.SCHED_IDLE]
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the caller's own thread is untouched
