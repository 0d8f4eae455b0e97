"""The short table scripts/device_check.sh prints last: one line per step (exit status and
seconds against its budget) and the figures the device check exists for, read from the JSON
files its steps wrote. A step that failed or ran out of time shows as such, and its figures
as missing, instead of hiding the steps that did finish.

    python benchmarks/device_table.py OUT_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def step_lines(out: Path) -> list[str]:
    """steps.tsv: name, exit status, seconds, budget (written by device_check.sh)."""
    lines = []
    rows = (out / "steps.tsv").read_text().splitlines() if (out / "steps.tsv").exists() else []
    for row in rows:
        name, rc, secs, budget = row.split("\t")
        verdict = "ok" if rc == "0" else "TIMED OUT" if rc in ("124", "137") else f"FAILED (rc={rc})"
        lines.append(f"  {name:<22}{verdict:<16}{secs:>5} s of {budget} s")
    return lines


def figure_lines(out: Path) -> list[str]:
    lines = []
    kernels = _load(out / "kernels.json")
    if kernels and kernels.get("cases"):
        c = kernels["cases"][0]
        lines.append(f"  attention kernel      {c['case']} {c['seqs']} x {c['max_context']}: {c['kernel_ms']:.3f} ms, "
                     f"{c['pct_copy_bw']:.1f}% of copy bandwidth ({kernels['copy_gbps']:.0f} GB/s)")
    step = _load(out / "model_step.json")
    if step:
        lines.append(f"  model step            {step['shape']}, {step['dtype']}: copy {step['copy_gbps']:.0f} GB/s, "
                     f"matmul {step['matmul_tflops']:.3g} TFLOP/s ({step['matmul_source']})")
        for r in step["cases"]:
            against = (f"{r['pct_roofline']:5.1f}% of HBM roofline" if r["kind"] == "decode"
                       else f"MFU {r['mfu_pct']:5.1f}%")
            lines.append(f"    {r['case']:<20}{r['wall_us'] / 1e3:8.2f} ms/step  busy {r['busy_pct']:5.1f}% of wall  "
                         f"{against}")
    else:
        lines.append("  model step            no figures")
    latency = _load(out / "startup.json")
    s = latency and latency.get("startup")
    lines.append(f"  start-up to 1st token cold {s['cold_s']:.1f} s, warm {s['warm_s']:.1f} s ({s['speedup']:.1f}x)"
                 if s else "  start-up to 1st token no figures")
    tp = _load(out / "throughput.json")
    if tp:
        o, w = tp["jaxvllm"], tp["workload"]
        decode = (f"; decode at batch {o['decode_batch']}: {o['decode_tok_s']:.0f} tok/s, MFU "
                  f"{100 * o['decode_mfu']:.1f}%" if "decode_mfu" in o else "; no decode figures (out of time)")
        lines.append(f"  offline throughput    {w['num_requests']} requests ({tp['model']}, {o.get('dtype', '?')}): "
                     f"{o['output_tok_s']:.1f} output tok/s, {o['requests_s']:.2f} req/s{decode}")
    else:
        lines.append("  offline throughput    no figures")
    spec = _load(out / "spec_decode.json")
    if spec:
        for r in spec["rows"]:
            lines.append(f"  spec decode {r['method']:<10}batch {r['batch_size']}: {r['spec_tok_s']} tok/s "
                         f"against {r['off_tok_s']} ({r['speedup']}x), accepted length {r['mean_accepted_length']}, "
                         f"same tokens: {r['identical_tokens']}")
    else:
        lines.append("  spec decode           no figures")
    offload = _load(out / "kv_offload.json")
    if offload:
        lines.append(f"  kv offload            {offload['prefix_len']}-token prefix, TTFT reloaded from host "
                     f"{offload['ttft_median_s_offload']:.3f} s against computed "
                     f"{offload['ttft_median_s_recompute']:.3f} s "
                     f"({offload['ttft_median_speedup']:.1f}x), host hits {offload['host_tier_hit_tokens']} tokens, "
                     f"same tokens: {offload['identical_outputs']}")
    else:
        lines.append("  kv offload            no figures")
    return lines


def table(out: str | Path) -> str:
    out = Path(out)
    env = (out / "env.txt").read_text().strip() if (out / "env.txt").exists() else "?"
    return "\n".join([f"== device check: {env} ==", *step_lines(out), *figure_lines(out)])


if __name__ == "__main__":
    print(table(sys.argv[1] if len(sys.argv) > 1 else "."))
