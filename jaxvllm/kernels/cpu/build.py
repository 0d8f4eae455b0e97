"""Compile the native CPU kernels once per machine and register them with XLA.

The library is built with the system C++ compiler ($CXX, else c++) against the XLA FFI
headers that ship with jaxlib, for this CPU (-march=native), and cached under
$JAXVLLM_NATIVE_CACHE (default ~/.cache/jaxvllm/native) by a hash of everything that
shapes it: sources, flags, compiler, jaxlib and the CPU's feature flags. A machine without a
compiler gets a NativeBuildError, and `auto` falls back to the XLA kernel.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import subprocess
import tempfile
from pathlib import Path

import jax
import jaxlib

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = ("ragged_paged_attention.cc", "packed_matmul.cc")  # one library
HEADERS = ("attend.h", "parallel.h", "simd.h")
# FFI target name -> the handler symbol the library exports for it.
TARGETS = {"jaxvllm_ragged_paged_attention": "JaxvllmRaggedPagedAttention",
           "jaxvllm_ragged_paged_attention_bf16_bits": "JaxvllmRaggedPagedAttentionBf16Bits",
           "jaxvllm_packed_matmul": "JaxvllmPackedMatmul",
           "jaxvllm_packed_matmul_bf16": "JaxvllmPackedMatmulBf16",
           "jaxvllm_grouped_packed_matmul": "JaxvllmGroupedPackedMatmul",
           "jaxvllm_grouped_packed_matmul_bf16": "JaxvllmGroupedPackedMatmulBf16"}
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fopenmp-simd")


class NativeBuildError(RuntimeError):
    """The native kernels could not be built or loaded on this machine."""


def cpu_features() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def _compile(cxx: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [cxx, *FLAGS, "-I", jax.ffi.include_dir(), *(str(HERE / s) for s in SOURCES), "-o", tmp]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise NativeBuildError(f"{' '.join(cmd)} failed:\n{result.stderr[-4000:]}")
        os.replace(tmp, out)  # atomic: concurrent builders each publish a complete library
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def library_path() -> Path:
    """The library for this machine, compiled first if it is not cached yet."""
    cxx = os.environ.get("CXX", "c++")
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise NativeBuildError(f"no working C++ compiler ({cxx}): {e}") from e
    sources = [(HERE / name).read_text() for name in SOURCES + HEADERS]
    key = hashlib.sha256("\0".join([*sources, *FLAGS, version, jaxlib.__version__,
                                    cpu_features()]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("JAXVLLM_NATIVE_CACHE", Path.home() / ".cache" / "jaxvllm" / "native"))
    path = cache / f"jaxvllm_native-{key}.so"
    if not path.exists():
        logger.info("Building native CPU kernels: %s", path)
        _compile(cxx, path)
    return path


@functools.cache
def load() -> ctypes.CDLL:
    """Load the library and register its FFI targets for the CPU platform, once a process."""
    path = library_path()
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise NativeBuildError(f"cannot load {path}: {e}") from e
    for target, symbol in TARGETS.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    return lib


@functools.cache
def available() -> bool:
    """Whether the native kernels can run here; the reason they cannot is logged once."""
    try:
        load()
        return True
    except NativeBuildError as e:
        logger.warning("Native CPU kernels unavailable, using the XLA kernel: %s", e)
        return False
