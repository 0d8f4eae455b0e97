"""Sleep on a CPU host gives freed memory back to the OS (worker/sleep_mode.py): glibc keeps
freed heap chunks below its top in its arenas, RSS and all, until malloc_trim. The cycle
figures on the default model are benchmarks/sleep_rss.py's."""
from __future__ import annotations

import ctypes.util

import numpy as np
import pytest

from jaxvllm.worker.sleep_mode import release_host_memory


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(not ctypes.util.find_library("c"), reason="no libc to trim")
def test_freed_heap_goes_back_to_the_os():
    chunks = [np.ones(100_000 // 8) for _ in range(2_000)]  # ~200 MB of heap chunks (< mmap's threshold)
    pinned = np.ones(100_000 // 8)  # above them: the heap's top cannot shrink past it
    del chunks
    held = rss_mib()
    release_host_memory()
    assert held - rss_mib() > 100, (held, rss_mib())
    del pinned
