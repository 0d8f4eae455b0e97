"""Sleep mode's device side: moving a pytree of (sharded) arrays to host memory and back,
freeing device arrays, and measuring what the devices hold.

A host copy is kept per addressable shard, so each process (a MultiprocExecutor worker, a
host of a slice) copies and restores only its own shards; restoring places each shard back
on its device and reassembles the array with the sharding it had, so the compiled step
programs take it as before: nothing compiles again.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from dataclasses import dataclass

import jax
import numpy as np


@dataclass(frozen=True)
class HostArray:
    """One array's addressable shards in host memory, and what rebuilds it."""
    shape: tuple[int, ...]
    sharding: jax.sharding.Sharding
    shards: tuple[tuple[jax.Device, np.ndarray], ...]

    @property
    def nbytes(self) -> int:
        return sum(data.nbytes for _, data in self.shards)


def offload(tree):
    """The same pytree with each array copied to host memory (the device arrays stay)."""
    def copy(x: jax.Array) -> HostArray:
        # A copy (on the CPU a view would keep the device buffer alive), of the view: numpy's
        # own copy of a jax array (np.array(x, copy=True)) took ~8x as long.
        return HostArray(x.shape, x.sharding, tuple((s.device, np.asarray(s.data).copy())
                                                    for s in x.addressable_shards))
    return jax.tree.map(copy, tree)


def restore(tree):
    """The arrays of a tree of HostArrays, back on their devices with their shardings."""
    def put(h: HostArray) -> jax.Array:
        return jax.make_array_from_single_device_arrays(
            h.shape, h.sharding, [jax.device_put(data, device) for device, data in h.shards])
    return jax.tree.map(put, tree, is_leaf=lambda x: isinstance(x, HostArray))


def free(tree) -> None:
    """Delete the device buffers of every array in the tree (their memory returns to the
    device allocator now, not when Python drops the last reference)."""
    for x in jax.tree.leaves(tree):
        if isinstance(x, jax.Array) and not x.is_deleted():
            x.delete()


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "malloc_trim", None)  # glibc only


def release_host_memory() -> None:
    """Give the host memory that sleep or wake-up just freed back to the OS. glibc keeps
    freed chunks in its arenas (the engine's threads each have one), so without a trim the
    process's RSS stays high asleep and creeps up cycle after cycle; on a CPU host that
    memory is the "device" memory sleep promised to free."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def device_memory_in_use(devices) -> int:
    """Bytes the devices hold: their allocator's count where the backend reports one (GPU,
    TPU), else the bytes of this process's live arrays on them (the CPU)."""
    stats = [d.memory_stats() or {} for d in devices]
    if all("bytes_in_use" in s for s in stats):
        return sum(s["bytes_in_use"] for s in stats)
    gc.collect()  # arrays in reference cycles are garbage, not held
    devices = set(devices)
    buffers = {}  # several jax arrays may share one buffer: counted once
    for x in jax.live_arrays():
        for shard in x.addressable_shards:
            if shard.device in devices:
                buffers[shard.device.id, shard.data.unsafe_buffer_pointer()] = shard.data.nbytes
    return sum(buffers.values())
