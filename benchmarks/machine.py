"""This machine's limits, measured in the same run as the benchmark that divides by them:
the fastest dense matmul it has (FLOP/s) and its memory copy bandwidth.

An MFU is only meaningful against the fastest matmul the engine could have used: on a CPU
with AVX-512 the model's matmuls run the native packed kernel (jaxvllm/kernels/cpu), which beats
XLA's CPU matmul, so dividing by XLA's figure gave a decode "MFU" over 100%. `peak_matmul`
therefore times every matmul the platform may use and keeps the fastest.
"""
from __future__ import annotations

import statistics
import threading
import time

import jax
import jax.numpy as jnp


def _times(fn, *args, repeats: int = 5) -> list[float]:
    """Seconds of each of `repeats` calls, after one that compiles and warms."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return times


def _best_time(fn, *args, repeats: int = 5) -> float:
    return min(_times(fn, *args, repeats=repeats))


def engine_backend(attention_backend: str = "auto", dtype="float32"):
    """The backend (jaxvllm/backends) an engine of this dtype runs with here, on one device."""
    from jaxvllm.backends import get_backend
    from jaxvllm.config import EngineConfig, ModelConfig
    from jaxvllm.platforms import current_platform
    config = EngineConfig(model=ModelConfig(dtype=jnp.dtype(dtype).name, attention_backend=attention_backend))
    return get_backend(config, current_platform)


def xla_matmul(dtype):
    """XLA's matmul as the backend runs a `dtype` model's (its accumulation dtype)."""
    return jax.jit(engine_backend("xla", dtype).linear_method.apply)


def matmul_flops(n: int = 2048, dtype="float32") -> float:
    """XLA's FLOP/s from one large square matmul in `dtype` (best of several)."""
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    return 2 * n**3 / _best_time(xla_matmul(dtype), a, b)


def native_matmul_flops(n: int = 2048) -> float | None:
    """FLOP/s of the packed native CPU matmul (float32), or None where the backend does not
    run it (no AVX-512, no compiler, or not a CPU)."""
    try:
        method = engine_backend().linear_method
    except (ValueError, OSError, RuntimeError):  # a CPU that cannot build the kernels: XLA's
        return None
    from jaxvllm.kernels.cpu.packed_matmul import pack_weight, packed_matmul
    from jaxvllm.layers.packed_linear import PackedLinearMethod
    if not isinstance(method, PackedLinearMethod):
        return None
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    packed = pack_weight(jax.random.normal(jax.random.key(1), (n, n), jnp.float32))
    return 2 * n**3 / _best_time(jax.jit(packed_matmul), a, packed)


def peak_matmul(dtype="float32", n: int = 2048) -> dict:
    """The fastest matmul this machine has, in FLOP/s, and which one it is: XLA's in `dtype`,
    and, where the platform uses it, the native packed kernel (float32, the CPU's dtype)."""
    found = {f"xla {jnp.dtype(dtype).name}": matmul_flops(n, dtype)}
    native = native_matmul_flops(n)
    if native is not None:
        found["native packed float32"] = native
    source = max(found, key=found.get)
    return {"flops": found[source], "source": source, "measured": found}


def decode_matmul_peak(hf_config, batch: int, dtype="float32") -> dict:
    """The FLOP/s decode's matmuls can reach: each of the model's linear shapes at `batch` rows
    ([batch, in] x [in, out]: q/k/v, o, gate/up, down, the LM head) timed alone, by every matmul
    the platform may use, on the threads the engine's steps use (XLA's pool, this process);
    total FLOPs over the sum of each shape's best time. A large square matmul is the wrong
    yardstick for decode's skinny ones: against it a decode step measured "MFU 118.7%"."""
    c = hf_config
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    inter = getattr(c, "intermediate_size", None) or c.ffn_dim
    shapes = [(c.hidden_size, (c.num_attention_heads + 2 * c.num_key_value_heads) * hd),
              (c.num_attention_heads * hd, c.hidden_size), (c.hidden_size, 2 * inter), (inter, c.hidden_size)]
    matmuls = {f"xla {jnp.dtype(dtype).name}": xla_matmul(dtype)}
    try:
        from jaxvllm.kernels.cpu.packed_matmul import pack_weight, packed_matmul
        from jaxvllm.layers.packed_linear import PackedLinearMethod
        if jnp.dtype(dtype) == jnp.float32 and isinstance(engine_backend().linear_method, PackedLinearMethod):
            matmuls["native packed"] = jax.jit(packed_matmul)
    except (ImportError, ValueError, OSError, RuntimeError):  # no native kernels here: XLA's only
        pass
    layers_time = layers_flops = 0.0
    for k, n in shapes + [(c.hidden_size, c.vocab_size)]:
        x = jax.random.normal(jax.random.key(0), (batch, k), dtype)
        w = jax.random.normal(jax.random.key(1), (k, n), dtype)
        best = min(_best_time(fn, x, pack_weight(w) if name == "native packed" else w)
                   for name, fn in matmuls.items())
        weight = c.num_hidden_layers if (k, n) in shapes else 1
        layers_time += weight * best
        layers_flops += weight * 2 * batch * k * n
    return {"flops": layers_flops / layers_time, "source": f"{' / '.join(matmuls)} at decode's shapes, batch {batch}"}


def memory_bandwidth(num_bytes: int = 256 << 20) -> float:
    """Bytes/s moved by an out-of-place copy (read + write) of a large float32 array."""
    x = jnp.ones(num_bytes // 4, jnp.float32)
    return 2 * num_bytes / _best_time(jax.jit(lambda v: v * 1.0000001), x)


def llama_flops_per_token(hf_config, context_len: float) -> float:
    """Forward FLOPs of one token: 2 x matmul parameters (LM head included) plus attention
    over `context_len` cached positions (QK^T and PV)."""
    c = hf_config
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return args_flops_per_token(c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads * hd,
                                c.num_key_value_heads * hd, c.vocab_size, context_len)


def args_flops_per_token(num_layers: int, hidden: int, intermediate: int, q_size: int, kv_size: int,
                         vocab: int, context_len: float, lm_head: bool = True) -> float:
    """The same from the shapes alone (benchmarks/model_step.py has LlamaArgs, no HF config);
    lm_head=False for a prefill token that samples nothing."""
    per_layer = hidden * (2 * q_size + 2 * kv_size) + 3 * hidden * intermediate
    matmul_params = num_layers * per_layer + (vocab * hidden if lm_head else 0)
    attention = 4 * num_layers * q_size * context_len
    return 2 * matmul_params + attention


def cpu_times() -> list[int] | None:
    """This machine's CPU time counters (/proc/stat's first line: user, nice, system, idle,
    iowait, irq, softirq, steal, ...), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None


def round_conditions(before: list[int] | None, probe_flops: float) -> dict:
    """What the machine was like over a timed round that started at `before` (cpu_times()):
    the share of CPU time busy and stolen by the hypervisor (a neighbour on a shared host
    slows every engine alike, but not every round), and a small matmul's FLOP/s just before."""
    after = cpu_times()
    out = {"probe_matmul_flops": probe_flops}
    if before and after:
        d = [b - a for a, b in zip(before, after)]
        total = sum(d[:8]) or 1
        out.update(busy_share=1 - (d[3] + d[4]) / total, steal_share=d[7] / total)
    return out


def probe_matmul_flops(n: int = 1024, repeats: int = 9) -> float:
    """A 1024² float32 matmul's median FLOP/s: the machine's speed now (a median, where
    `matmul_flops` keeps the best, because this is meant to see a slow moment)."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    return 2 * n**3 / statistics.median(_times(jax.jit(jnp.matmul), a, a, repeats=repeats))


def wait_for_huge_pages(timeout: float = 300) -> float:
    """Seconds waited for the worker's background collapse onto huge pages (platforms/
    huge_pages.py: seconds of CPU per GiB on a VM, a core taken from the steps beside it), so
    that timed runs measure the engine serving. Bounded: it is advice, and may starve."""
    start = time.perf_counter()
    for thread in [t for t in threading.enumerate() if t.name == "huge-pages"]:
        thread.join(timeout=max(0.0, timeout - (time.perf_counter() - start)))
    return time.perf_counter() - start


def anon_huge_pages_bytes() -> int | None:
    """This process's memory on transparent huge pages (the CPU platform asks for them for
    weights and KV cache: jaxvllm/platforms/huge_pages.py), or None off Linux."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
