"""Shape buckets shared by the model runner and the KV swapper: every jitted entry point
pads its inputs to one of a few sizes, so compilations stay few and fixed."""
from __future__ import annotations


def make_buckets(smallest: int, largest: int) -> list[int]:
    """Powers of two from `smallest`, capped by (and ending at) `largest`."""
    buckets, b = [], smallest
    while b < largest:
        buckets.append(b)
        b *= 2
    return buckets + [largest]


def pick_bucket(buckets: list[int], n: int) -> int:
    return next(b for b in buckets if b >= n)
