"""Back the CPU's large, long-lived buffers (weights, KV cache) with 2 MiB pages.

A decode step streams every weight from memory; with 4 KiB pages that is a TLB miss every
few cache lines. Linux's default (`transparent_hugepage=madvise`) gives huge pages only to
memory that asks, and XLA's CPU allocator does not ask, so the worker does, once, after the
buffers exist: MADV_HUGEPAGE marks the range, MADV_COLLAPSE (Linux 6.1+) rebuilds it with
huge pages now rather than whenever khugepaged gets to it, in a background thread since
collapsing ~1 GiB takes seconds. Both are advice: a kernel that refuses changes speed, never
results. On the default model a 64-sequence decode step went from ~198 to ~163 ms, a
512-token step from ~950 to ~720 ms.
"""
from __future__ import annotations

import ctypes
import logging
import sys

import jax

logger = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25


def _madvise():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc.madvise


def huge_page_ranges(tree, min_bytes: int = 8 * HUGE_PAGE) -> list[tuple[int, int]]:
    """The whole 2 MiB pages inside each host buffer of the pytree's arrays of at least
    `min_bytes`, as (start, end) addresses: taken now, since a donated array is gone later."""
    ranges = []
    for array in jax.tree.leaves(tree):
        for shard in array.addressable_shards if isinstance(array, jax.Array) else ():
            data = shard.data
            if data.nbytes < min_bytes:
                continue
            start = data.unsafe_buffer_pointer()
            lo, hi = -(-start // HUGE_PAGE) * HUGE_PAGE, (start + data.nbytes) // HUGE_PAGE * HUGE_PAGE
            if hi > lo:
                ranges.append((lo, hi))
    return ranges


def advise_huge_pages(ranges: list[tuple[int, int]]) -> int:
    """MADV_HUGEPAGE then MADV_COLLAPSE on each range; returns the bytes collapsed onto huge
    pages (0 off Linux, or where the kernel refuses)."""
    if not sys.platform.startswith("linux"):
        return 0
    madvise, collapsed = _madvise(), 0
    for lo, hi in ranges:
        if madvise(lo, hi - lo, MADV_HUGEPAGE) != 0:
            continue
        if madvise(lo, hi - lo, MADV_COLLAPSE) == 0:
            collapsed += hi - lo
        else:
            logger.debug("MADV_COLLAPSE refused (errno %d): khugepaged collapses later.", ctypes.get_errno())
    return collapsed
