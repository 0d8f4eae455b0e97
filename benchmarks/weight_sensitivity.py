"""Where 8-bit weights cost perplexity, on the default model: the held-out text of
benchmarks/quality.py scored with chosen weights replaced by their quantize-dequantize round
trip (numpy, float32 scales), one engine for every variant (`LLM.update_weights`).

Variants: every linear in fp8 (e4m3, a scale per output channel, as `quantization="fp8"`), then
one projection kind at a time, one group of layers at a time, the scale granularities (per
tensor, per channel, 128 x 128 blocks as in DeepSeek-V3 fp8 checkpoints) and per-channel
scales chosen by llm-compressor's `mse` observer instead of the absolute maximum; int8 per
channel both ways for comparison. Each change comes with a 95% interval from
a paired bootstrap over the text's tokens (how much of it the text's length alone explains).

    python benchmarks/weight_sensitivity.py [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.quality import TEXT  # noqa: E402
from jaxvllm import LLM, SamplingParams  # noqa: E402
from jaxvllm.models.loader import load_weights  # noqa: E402
from jaxvllm.transformers_utils.model_path import resolve_model  # noqa: E402
from jaxvllm.transformers_utils.tokenizer import load_tokenizer  # noqa: E402

PROJECTIONS = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
               "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}
QMAX = {"fp8": float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max), "int8": 127.0}


def round_trip(w: np.ndarray, fmt: str, granularity: str) -> np.ndarray:
    """w [out, in] quantized and dequantized: scales per tensor, per output channel, or per
    128 x 128 block (the absmax of each maps to the format's largest value)."""
    if granularity == "block":
        out, cols = w.shape
        pad = np.pad(w, ((0, -out % 128), (0, -cols % 128)))
        blocks = pad.reshape(pad.shape[0] // 128, 128, pad.shape[1] // 128, 128)
        return round_trip_scaled(blocks, fmt, (1, 3)).reshape(pad.shape)[:out, :cols]
    if granularity == "channel-mse":
        return mse_round_trip(w, fmt)
    return round_trip_scaled(w, fmt, (0, 1) if granularity == "tensor" else (1,))


def round_trip_scaled(w: np.ndarray, fmt: str, axes: tuple[int, ...], absmax=None) -> np.ndarray:
    """Scales from the absolute maximum over axes (or the absmax given)."""
    absmax = np.abs(w).max(axis=axes, keepdims=True) if absmax is None else absmax
    scale = absmax.astype(np.float32) / np.float32(QMAX[fmt])
    scale = np.where(scale == 0, 1, scale)
    x = np.clip(w / scale, -QMAX[fmt], QMAX[fmt])
    q = x.astype(ml_dtypes.float8_e4m3fn) if fmt == "fp8" else np.round(x).astype(np.int8)
    return q.astype(np.float32) * scale


def mse_round_trip(w: np.ndarray, fmt: str, grid: float = 100, maxshrink: float = 0.2, norm: float = 2.4,
                   patience: int = 5) -> np.ndarray:
    """llm-compressor's `mse` observer, per output channel: the absmax shrunk by 1 - i / grid
    (i < maxshrink * grid) whose round trip has the least sum of |error| ** norm; it stops
    after `patience` shrinks that improve no channel."""
    absmax = np.abs(w).max(axis=1, keepdims=True)
    best, best_err, stale = w, np.full(absmax.shape, np.inf, np.float32), 0
    for i in range(int(maxshrink * grid)):
        trip = round_trip_scaled(w, fmt, (1,), absmax * np.float32(1 - i / grid))
        err = (np.abs(trip - w) ** norm).sum(axis=1, keepdims=True)
        better = err < best_err
        if not better.any():
            stale += 1
            if stale >= patience:
                break
            continue
        best, best_err, stale = np.where(better, trip, best), np.minimum(err, best_err), 0
    return best


_RNG = np.random.default_rng(0)  # one stream for every interval of a run


def interval(logprobs: np.ndarray, base: np.ndarray, rng=_RNG) -> tuple[float, float]:
    """95% paired bootstrap interval of the perplexity change over the text's tokens."""
    picks = rng.integers(0, len(base), (1000, len(base)))
    changes = np.exp((base[picks] - logprobs[picks]).mean(axis=1)) - 1
    return float(np.percentile(changes, 2.5)), float(np.percentile(changes, 97.5))


def variants(num_layers: int):
    every = [(i, p) for i in range(num_layers) for p in PROJECTIONS]
    yield "fp8, every linear", "fp8", "channel", every
    for p in PROJECTIONS:
        yield f"fp8, {p} only", "fp8", "channel", [(i, p) for i in range(num_layers)]
    for start in range(0, num_layers, 5):
        yield (f"fp8, layers {start}-{min(start + 5, num_layers) - 1} only", "fp8", "channel",
               [(i, p) for i in range(start, min(start + 5, num_layers)) for p in PROJECTIONS])
    yield "fp8, per tensor", "fp8", "tensor", every
    yield "fp8, 128x128 blocks", "fp8", "block", every
    yield "fp8, per channel, mse scales", "fp8", "channel-mse", every
    yield "int8, every linear", "int8", "channel", every
    yield "int8, per channel, mse scales", "int8", "channel-mse", every


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    model = resolve_model(None)
    text_ids = load_tokenizer(model).encode(TEXT.read_text())
    weights = load_weights(model)
    num_layers = 1 + max(int(k.split(".")[2]) for k in weights if k.startswith("model.layers."))
    llm = LLM(None, dtype="float32", max_model_len=1024, skip_warmup=True, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0.0)

    def logprobs() -> np.ndarray:
        scored = llm.generate([{"prompt_token_ids": text_ids}], params, use_tqdm=False)[0]
        return np.array([e[t].logprob for t, e in zip(text_ids[1:], scored.prompt_logprobs[1:])])

    base = logprobs()
    rows = [dict(variant="float32", perplexity=math.exp(-base.mean()), change=0.0)]
    print(f"{len(text_ids)} held-out tokens\n| weights | perplexity | vs float32 | 95% interval |\n|---|---|---|---|\n"
          f"| float32 | {rows[0]['perplexity']:.3f} | | |", flush=True)
    for label, fmt, granularity, chosen in variants(num_layers):
        names = [f"model.layers.{i}.{part}.weight" for i, p in chosen for part in PROJECTIONS[p]]
        llm.update_weights({n: round_trip(weights[n], fmt, granularity) for n in names})
        lp = logprobs()
        change, (low, high) = math.exp((base - lp).mean()) - 1, interval(lp, base)
        rows.append(dict(variant=label, perplexity=math.exp(-lp.mean()), change=change, interval=[low, high]))
        print(f"| {label} | {rows[-1]['perplexity']:.3f} | {100 * change:+.2f}% | "
              f"{100 * low:+.2f}% to {100 * high:+.2f}% |", flush=True)
        llm.update_weights({n: weights[n] for n in names})
    if ns.json:
        Path(ns.json).write_text(json.dumps(dict(tokens=len(text_ids), rows=rows), indent=1))


if __name__ == "__main__":
    main()
