"""Step programs compiled ahead of time, and kept on disk so that a restart neither traces nor
lowers them.

Warm-up compiles every bucket with `jit(...).lower(...).compile()` against the live weights
and KV cache and `jax.ShapeDtypeStruct`s for the rest, so it allocates nothing and runs
nothing. JAX's persistent compilation cache (JAXVLLM_XLA_CACHE) then saves the XLA compile,
but not the Python tracing and MLIR lowering that come before its lookup: ~10 s for the
default model's programs on 2 CPU cores. So each program is also saved as a serialized
executable (`jax.experimental.serialize_executable`) in `executables/` under the XLA cache,
named by a hash of everything that shapes it: jax, the devices, jaxvllm's source, the engine
and model configs, and the program's argument shapes, dtypes and shardings. Loading runs
what is on disk, as the XLA cache does: keep that directory private, like the XLA cache.

Saved programs load in the background (`warm_all`), so that a warm restart reaches its first
token while the rest still load: a call waits only for its own program. A call whose shapes
were warmed runs the ahead-of-time program; any other, and one whose saved copy failed to
load, falls back to the jitted function, which traces and compiles it as usual.

Programs that will be saved are compiled with JAX's persistent cache off: on CPU an executable
loaded from that cache serializes into a copy that fails to run ("Function ... not found").
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import threading
from pathlib import Path

import jax
import msgpack
from jax.experimental.compilation_cache import compilation_cache
from jax.experimental.serialize_executable import deserialize_and_load, serialize

logger = logging.getLogger(__name__)
# Counters of programs warmed on several threads (warm_all) are updated under this.
COUNT_LOCK = threading.Lock()
# The folder is bounded: past this, the programs least recently saved or loaded are removed.
MAX_SAVED_BYTES = 2 << 30
_TRACED_PACKAGES = ("jaxvllm", "pallas_kernels")  # whose code ends up in the programs


@functools.cache
def _source_hash() -> str:
    digest = hashlib.sha256()
    for package in _TRACED_PACKAGES:
        root = Path(importlib.util.find_spec(package).origin).parent
        # The native kernels' sources too: a program calls them by name, with their signature.
        for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".cc", ".h")):
            digest.update(f"{package}/{path.relative_to(root)}".encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def fingerprint(*parts: object) -> str:
    """What every saved program depends on besides its own arguments; `parts` adds the
    caller's configuration (reprs must be deterministic)."""
    devices = jax.devices()
    env = [jax.__version__, importlib.metadata.version("jaxlib"),
           jax.default_backend(), devices[0].client.platform_version, devices[0].device_kind,
           len(devices), jax.process_count(), os.environ.get("XLA_FLAGS", ""),
           jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision, _source_hash()]
    return hashlib.sha256(repr(env + list(parts)).encode()).hexdigest()


def executables_dir() -> str | None:
    """Where programs are saved: beside the XLA cache, and off when it is off."""
    xla_dir = jax.config.jax_compilation_cache_dir
    return os.path.join(xla_dir, "executables") if xla_dir else None


@contextlib.contextmanager
def persistent_cache_off(off: bool = True):
    """JAX's persistent compilation cache off within the block (if `off`); see the module doc."""
    if not off or not jax.config.jax_enable_compilation_cache:
        yield
        return
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # it remembers whether it is in use
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", True)
        compilation_cache.reset_cache()


def prune(directory: str, max_bytes: int) -> None:
    """Remove the least recently used programs until the folder holds at most `max_bytes`."""
    entries = []
    for entry in os.scandir(directory):
        with contextlib.suppress(OSError):  # another process may be pruning too
            if entry.name.endswith(".bin"):
                stat = entry.stat()
                entries.append((stat.st_mtime, stat.st_size, entry.path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= max_bytes:
            break
        with contextlib.suppress(OSError):
            os.remove(path)
        total -= size


def _signature(args: tuple, static: dict, fixed: tuple[int, ...]) -> tuple:
    """What selects a program at call time: the shapes and dtypes of the arguments that vary
    (flattening the weights on every call would cost more than the lookup saves), and
    static values."""
    varying = [a for i, a in enumerate(args) if i not in fixed]
    return (tuple((x.shape, x.dtype) for x in jax.tree.leaves(varying)), tuple(sorted(static.items())))


def _describe(tree) -> list[tuple]:
    """What of each array a saved program depends on: shape, dtype and sharding."""
    return [(tuple(x.shape), str(x.dtype), str(getattr(x, "sharding", None))) for x in jax.tree.leaves(tree)]


class CompiledProgram:
    """One jitted step function and its ahead-of-time programs, by argument signature.
    `fixed_argnums`: arguments whose shapes never change (weights, caches)."""

    def __init__(self, name: str, fn, jitted, fingerprint: str, directory: str | None, devices,
                 fixed_argnums: tuple[int, ...] = ()):
        self.name, self.fn, self.jitted, self.fixed = name, fn, jitted, fixed_argnums
        self.fingerprint, self.directory, self.devices = fingerprint, directory, devices
        self.programs: dict[tuple, jax.stages.Compiled] = {}
        self.loading: dict[tuple, tuple] = {}  # saved programs loading: (future, what it loads)
        self._out_tree = self._fixed_leaves = None
        self.num_compiled = self.num_loaded = 0
        self.num_calls = 0  # steps it ran (which of a runner's variants serve, e.g. with or without LoRA)

    def __call__(self, *args, **static):
        self.num_calls += 1
        signature = _signature(args, static, self.fixed)
        program = self.programs.get(signature)
        if program is None:
            program = self._loaded(signature)
        return program(*args) if program is not None else self.jitted(*args, **static)

    def warm(self, *args, **static) -> None:
        """Have the program for these arguments (arrays or ShapeDtypeStructs) ready: compile
        (and save) it now unless it is ready, loading, or saved."""
        signature = _signature(args, static, self.fixed)
        if signature in self.programs or signature in self.loading:
            return
        loaded = (program := self.load_saved(*args, **static)) is not None
        if not loaded:
            path = self._path(args, static)
            program = self.jitted.lower(*args, **static).compile()
            if path:
                self._save(path, program)
        with COUNT_LOCK:  # warm_all may warm on several threads
            self.num_loaded += loaded
            self.num_compiled += not loaded
        self.programs[signature] = program

    def load_in_background(self, pool: concurrent.futures.Executor, *args, **static) -> bool:
        """Start loading the saved program for these arguments on `pool`; False if none is saved."""
        signature, path = _signature(args, static, self.fixed), self._path(args, static)
        if signature in self.programs or signature in self.loading:
            return True
        if not (path and os.path.exists(path)):
            return False
        self.loading[signature] = (pool.submit(self._load, path, args, static), (path, args, static))
        return True

    def wait_until_loaded(self) -> None:
        """Finish every background load (the saved programs that failed are left to compile
        when first called)."""
        for signature in list(self.loading):
            self._loaded(signature)

    def _loaded(self, signature) -> jax.stages.Compiled | None:
        """The program a background load produced for `signature`, waiting for it (or loading
        it here, if the load has not started); None if there was none, or it failed."""
        future, job = self.loading.pop(signature, (None, None))
        if future is None:
            return None
        program = self._load(*job) if future.cancel() else future.result()
        if program is not None:
            self.programs[signature] = program
            self.num_loaded += 1
        return program

    def load_saved(self, *args, **static) -> jax.stages.Compiled | None:
        """The saved program for these arguments, or None; safe to call from several threads."""
        path = self._path(args, static)
        return self._load(path, args, static) if path and os.path.exists(path) else None

    def _path(self, args, static) -> str | None:
        if self.directory is None:
            return None
        if self._fixed_leaves is None:  # described once: ~150 weights' shardings took 0.3 s per start
            self._fixed_leaves = _describe([args[i] for i in self.fixed])
        varying = _describe([a for i, a in enumerate(args) if i not in self.fixed])
        key = hashlib.sha256(repr((self.fingerprint, self.name, self._fixed_leaves, varying,
                                   sorted(static.items()))).encode()).hexdigest()[:32]
        return os.path.join(self.directory, f"{self.name}-{key}.bin")

    def _save(self, path: str, program: jax.stages.Compiled) -> None:
        try:
            payload, _, out_tree = serialize(program)
            try:  # builtin containers only; others are recovered by tracing once (_load)
                tree = out_tree.serialize_using_proto()
            except ValueError:
                tree = None
            os.makedirs(self.directory, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(msgpack.packb({"executable": payload, "out_tree": tree}))
            os.replace(tmp, path)  # readers never see half a file
            prune(self.directory, MAX_SAVED_BYTES)
        except (OSError, ValueError) as e:  # saving is an optimisation: the program still runs
            logger.warning("Could not save the %s program: %s", self.name, e)

    def _load(self, path: str, args, static) -> jax.stages.Compiled | None:
        try:
            with open(path, "rb") as f:
                entry = msgpack.unpackb(f.read())
            os.utime(path)  # recently used: kept when the folder is pruned
            out_tree = (jax.tree_util.PyTreeDef.deserialize_using_proto(
                jax.tree_util.default_registry, entry["out_tree"]) if entry["out_tree"] else
                self._traced_out_tree(args, static))
            return deserialize_and_load(entry["executable"], jax.tree.structure((args, {})),
                                        out_tree, execution_devices=self.devices)
        except Exception as e:  # a stale or damaged entry is recompiled, never fatal
            logger.warning("Recompiling the %s program: its saved copy did not load (%r).", self.name, e)
            return None

    def _traced_out_tree(self, args, static):
        # The output structure is the same for every bucket: trace the plain function once.
        if self._out_tree is None:
            self._out_tree = jax.tree.structure(jax.eval_shape(functools.partial(self.fn, **static), *args))
        return self._out_tree


def warm_all(jobs: list[tuple[CompiledProgram, tuple, dict]], threads: int = 1, compile_threads: int = 1) -> None:
    """Warm many (program, args, static) at once: saved programs load in the background, in
    job order, on one thread by default (XLA releases the GIL while it loads; with more, the
    loads took both cores from the first step); whatever was not saved compiles now, on
    `compile_threads` threads (tracing holds the GIL, XLA's compile does not: tpu-inference
    compiles its programs ahead of time on a pool too)."""
    pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="load-program")
    unsaved = [job for job in jobs if not job[0].load_in_background(pool, *job[1], **job[2])]
    pool.shutdown(wait=False)  # its threads end once the queued loads are done
    run_on_pool([functools.partial(program.warm, *args, **static) for program, args, static in unsaved],
                compile_threads)


def run_on_pool(calls: list, threads: int) -> list:
    """Each call's result, in order, run on `threads` threads (here, one after another if 1);
    the first exception is raised once all have ended."""
    if threads <= 1:
        return [call() for call in calls]
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="compile-program") as compiler:
        futures = [compiler.submit(call) for call in calls]
    return [f.result() for f in futures]
