"""The engine's host path per step: what the Python side costs around a model that costs
next to nothing (a tiny random Llama: 2 layers, hidden 64), at 64, 256 and 1024 running
decode requests and for mixed prefill + decode steps; and, with a real model (the default
one), the step period against the device's forward + sample time, async scheduling on and off.

Host path: the real LLMEngine runs in process with synchronous steps; each part of a step is
timed where it is called: `schedule` (Scheduler.schedule), `prepare` (the runner's host work:
persistent-batch updates, input arrays, sampling metadata, reading the tokens back), `device`
(the forward and the sampler, each waited for where it is called), `update`
(Scheduler.update_from_output) and `output` (OutputProcessor.process_outputs:
detokenization, stop strings). Host time per step is everything but `device`. On an
accelerator the device time of a small model's decode step is one to a few milliseconds, so
this is the figure to keep below it (issue 21). The requests ask FINAL_ONLY outputs, as
`LLM.generate` does; `--output-kind DELTA` builds a RequestOutput per request per step, as a
streaming server request does.

Step period: `--period-batch` decoding requests; the period is the wall time per engine step
with nothing timed inside it, the device time the forward and sampler calls waited for one by
one, over as many steps, in alternating windows (the context grows by one token per step).
With async scheduling the host's work hides behind the device's, so the period approaches
the device time.

    python benchmarks/host_overhead.py [--batches 64 256 1024] [--steps 50] [--cpu-time]
        [--period-batch 64] [--period-steps 30] [--period-model PATH|tiny]
        [--output-kind FINAL_ONLY|DELTA|CUMULATIVE] [--json PATH]
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

PARTS = ("schedule", "prepare", "device", "update", "output")


class StepTimer:
    """Wraps the engine's methods (on the instances, for this run only) with timers."""

    def __init__(self, llm, clock=time.perf_counter):
        self.clock = clock
        self.enabled = True  # off: the methods run as they are, nothing waits
        self.totals: dict[str, float] = defaultdict(float)
        core = llm.llm_engine.engine_core_client.engine_core
        runner = core.model_executor.driver_worker.model_runner
        self._wrap(core.scheduler, "schedule", "schedule")
        self._wrap(core.scheduler, "update_from_output", "update")
        self._wrap(llm.llm_engine.output_processor, "process_outputs", "output")
        self._wrap(runner, "execute_model", "execute")  # dispatch and the tokens' read-back
        for name in ("_forward", "_sample", "_sample_extended"):
            self._wrap(runner, name, "device", block=True)

    def _wrap(self, obj, method: str, part: str, block: bool = False) -> None:
        """block: wait for the device inside the timer (else the wait for the sampled ids
        would count as the host's, where the runner reads them)."""
        import jax
        inner = getattr(obj, method)

        def timed(*args, **kwargs):
            if not self.enabled:
                return inner(*args, **kwargs)
            start = self.clock()
            try:
                out = inner(*args, **kwargs)
                return jax.block_until_ready(out) if block else out
            finally:
                self.totals[part] += self.clock() - start
        setattr(obj, method, timed)

    def reset(self) -> None:
        self.totals.clear()

    def parts(self) -> dict[str, float]:
        """Seconds per part; `prepare` is execute_model's time outside the device calls."""
        t = dict(self.totals)
        t["prepare"] = t.pop("execute", 0.0) - t.get("device", 0.0)
        return {p: t.get(p, 0.0) for p in PARTS}


def tiny_model(path: Path, vocab_size: int | None = None) -> Path:
    """A random Llama with the default model's tokenizer, so detokenization is real.
    vocab_size: its LM head's rows, the tokenizer's first ids (default: all of them)."""
    from conftest import write_tiny_llama

    from jaxvllm.transformers_utils.model_path import default_model_path
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(default_model_path())
    write_tiny_llama(path, vocab_size=vocab_size or len(tokenizer))
    tokenizer.save_pretrained(path)
    return path


@contextlib.contextmanager
def frozen_heap():
    """The engine core process freezes the heap it built at start-up (engine/engine_core_proc.py), so
    the collector's oldest generation never walks it between two steps. Measured in process,
    the engine's host path runs under the same condition; unfrozen after, so that the engine
    dropped next is collected."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def measure(model: Path, batch: int, steps: int, mixed: bool, clock=time.perf_counter,
            output_kind: str = "FINAL_ONLY") -> dict:
    """Per-step seconds of each part over `steps` steps with `batch` requests running; with
    `mixed`, a new request's prompt is prefilled beside the decodes in every step.
    output_kind: FINAL_ONLY as `LLM.generate` and a non-streaming server request ask, DELTA
    as a streaming one (a RequestOutput per request per step), or CUMULATIVE."""
    from jaxvllm import LLM, SamplingParams
    from jaxvllm.sampling_params import RequestOutputKind

    llm = LLM(str(model), max_num_seqs=batch + 8, max_num_batched_tokens=max(512, batch + 64),
              max_model_len=512, num_gpu_blocks_override=(batch + 8) * 32 + 1, skip_warmup=True,
              enable_prefix_caching=False, async_scheduling=False)
    engine = llm.llm_engine
    long = SamplingParams(max_tokens=400, ignore_eos=True, temperature=0.0,
                          output_kind=RequestOutputKind[output_kind])
    for i in range(batch):
        engine.add_request(f"d{i}", {"prompt_token_ids": [5 + i % 50] * 16}, long)
    while engine.engine_core_client.engine_core.scheduler.waiting:  # all prefilled: decoding
        engine.step()
    for _ in range(3):  # programs of these shapes compiled and warm
        engine.step()
    timer = StepTimer(llm, clock)
    timer.reset()
    with frozen_heap():
        start = time.perf_counter()
        for step in range(steps):
            if mixed:  # one new 48-token prompt per step, decoding beside the others
                engine.add_request(f"m{step}", {"prompt_token_ids": [7] * 48},
                                   SamplingParams(max_tokens=2, ignore_eos=True, temperature=0.0,
                                                  output_kind=RequestOutputKind[output_kind]))
            engine.step()
        wall = (time.perf_counter() - start) / steps
    parts = {p: s / steps for p, s in timer.parts().items()}
    host = sum(s for p, s in parts.items() if p != "device")
    engine.abort_request([f"d{i}" for i in range(batch)])
    return {"batch": batch, "mixed": mixed, "wall_us": wall * 1e6, "host_us": host * 1e6,
            "host_us_per_request": host * 1e6 / batch,
            **{f"{p}_us": s * 1e6 for p, s in parts.items()}}


def step_period(model: str | None, batch: int, steps: int, async_scheduling: bool,
                window: int = 5) -> dict:
    """Milliseconds per decode step at `batch` requests: the engine's period, and the device's
    forward + sample time (None for `model`: the default model). Each is measured over `steps`
    steps, in windows of `window` that alternate ABBA: every step reads a longer context than
    the one before, so whichever went second would read more KV."""
    from jaxvllm import LLM, SamplingParams

    llm = LLM(model, max_num_seqs=batch, max_num_batched_tokens=max(256, batch), max_model_len=512,
              skip_warmup=True, enable_prefix_caching=False, async_scheduling=async_scheduling)
    engine = llm.llm_engine
    long = SamplingParams(max_tokens=500 - 16, ignore_eos=True, temperature=0.0)
    for i in range(batch):
        engine.add_request(f"p{i}", {"prompt_token_ids": [5 + i % 50] * 16}, long)
    while engine.engine_core_client.engine_core.scheduler.waiting:
        engine.step()
    for _ in range(3):
        engine.step()
    timer = StepTimer(llm)  # when on, waits for the device at each call: steps no longer overlap
    rounds, period, device = -(-steps // window), 0.0, 0.0
    with frozen_heap():
        for k in range(rounds):
            for timed in ((False, True) if k % 2 == 0 else (True, False)):
                timer.enabled = timed
                engine.step()  # the first step after a switch overlaps with nothing: not counted
                start, before = time.perf_counter(), timer.totals["device"]
                for _ in range(window):
                    engine.step()
                if timed:
                    device += timer.totals["device"] - before
                else:
                    period += time.perf_counter() - start
    n = rounds * window
    engine.abort_request([f"p{i}" for i in range(batch)])
    return {"step_ms": period / n * 1e3, "device_ms": device / n * 1e3}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--period-batch", type=int, default=64)
    ap.add_argument("--period-steps", type=int, default=30)
    ap.add_argument("--period-model", default=None, help="the model of the step period (default: "
                    "the default model); `tiny`: the host path's tiny random one")
    ap.add_argument("--cpu-time", action="store_true", help="time the host path's parts by this "
                    "thread's CPU time, not wall time: on a shared machine, waiting for a core does "
                    "not count (`device` is then the CPU time of its calls on this thread)")
    ap.add_argument("--output-kind", default="FINAL_ONLY", choices=["FINAL_ONLY", "DELTA", "CUMULATIVE"],
                    help="the decoding requests' output_kind (FINAL_ONLY: LLM.generate's; DELTA: a "
                    "streaming server request's)")
    ap.add_argument("--vocab-size", type=int, default=None, help="the tiny model's vocabulary (default: "
                    "the tokenizer's 49152). On this CPU the device's work runs on the host's own cores "
                    "and caches (a full-width LM head over 256 rows makes ~50 MB of logits a step), and "
                    "host code right after it runs several times slower than the same code run "
                    "again; a smaller LM head shows the host path closer to how it runs beside an "
                    "accelerator")
    ap.add_argument("--json", default=None)
    ns = ap.parse_args(argv)
    rows, periods = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model(Path(tmp) / "tiny", ns.vocab_size)
        for batch in ns.batches:
            for mixed in (False, True):
                rows.append(measure(model, batch, ns.steps, mixed,
                                    time.thread_time if ns.cpu_time else time.perf_counter, ns.output_kind))
        period_model = str(model) if ns.period_model == "tiny" else ns.period_model
        for mode in ("async", "sync"):
            periods[mode] = step_period(period_model, ns.period_batch, ns.period_steps, mode == "async")
    print(f"\n{'step':>16} {'host us':>9} {'us/req':>7} " + " ".join(f"{p:>9}" for p in PARTS)
          + f" {'wall us':>9}")
    for r in rows:
        kind = f"{r['batch']} decode" + (" +prefill" if r["mixed"] else "")
        print(f"{kind:>16} {r['host_us']:9.0f} {r['host_us_per_request']:7.1f} "
              + " ".join(f"{r[p + '_us']:9.0f}" for p in PARTS) + f" {r['wall_us']:9.0f}")
    for mode, p in periods.items():
        print(f"{mode:>5} scheduling, decode batch {ns.period_batch}: step {p['step_ms']:.2f} ms, "
              f"device forward+sample {p['device_ms']:.2f} ms ({p['step_ms'] / p['device_ms']:.3f}x)")
    result = {"host_us_per_step": {str(r["batch"]): r["host_us"] for r in rows if not r["mixed"]},
              "mixed_host_us_per_step": {str(r["batch"]): r["host_us"] for r in rows if r["mixed"]},
              "clock": "thread CPU time" if ns.cpu_time else "wall", "output_kind": ns.output_kind,
              "vocab_size": ns.vocab_size,
              "rows": rows, **periods}
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
