"""Where a traced call's device time goes: a summary of a jax.profiler trace.

benchmarks/kernels.py --profile traces a few calls of one case; this reads the Perfetto JSON
that `jax.profiler.trace(..., create_perfetto_trace=True)` writes and lists, per device
timeline (a GPU stream, a TPU core's XLA ops), the events that took the most time. It tells
the attention kernel's own time from the small XLA ops around it (page table, work list,
query layout), which a wall-clock time per call lumps together.

    python benchmarks/trace_summary.py TRACE_DIR [--calls N] [--top K]
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
from pathlib import Path


def load_events(trace_dir: str | Path) -> list[dict]:
    """Complete ('X') events of the newest perfetto_trace.json.gz under trace_dir, each with
    its process and thread names added as '_proc' and '_thread'."""
    files = sorted(Path(trace_dir).rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {trace_dir}")
    with gzip.open(files[-1]) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    procs, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[e["pid"], e["tid"]] = e["args"]["name"]
    return [dict(e, _proc=procs.get(e.get("pid"), "?"), _thread=threads.get((e.get("pid"), e.get("tid")), "?"))
            for e in events if e.get("ph") == "X" and "dur" in e]


def summarize(events: list[dict], calls: int = 1, top: int = 8) -> list[dict]:
    """Per device timeline, its `top` costliest events: total and per-call microseconds.
    Device timelines are processes named /device:...; with none (a CPU run) the host's."""
    device = [e for e in events if e["_proc"].startswith("/device:")] or events
    total = collections.defaultdict(float)
    count = collections.Counter()
    for e in device:
        key = (e["_proc"], e["_thread"], e["name"])
        total[key] += float(e["dur"])
        count[key] += 1
    rows = []
    for timeline in sorted({k[:2] for k in total}):
        keys = sorted((k for k in total if k[:2] == timeline), key=total.get, reverse=True)
        busy = sum(total[k] for k in keys)
        for k in keys[:top]:
            rows.append(dict(timeline=" / ".join(timeline), name=k[2], count=count[k],
                             us_per_call=total[k] / calls, share=total[k] / busy if busy else 0.0))
    return rows


def format_rows(rows: list[dict]) -> str:
    lines, last = [], None
    for r in rows:
        if r["timeline"] != last:
            lines.append(f"  {r['timeline']}")
            last = r["timeline"]
        lines.append(f"    {r['us_per_call']:9.1f} us/call {100 * r['share']:5.1f}%  x{r['count']:<4d} {r['name'][:70]}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace_dir")
    ap.add_argument("--calls", type=int, default=1, help="calls the trace holds (divides the times)")
    ap.add_argument("--top", type=int, default=8)
    a = ap.parse_args(argv)
    print(format_rows(summarize(load_events(a.trace_dir), a.calls, a.top)))


if __name__ == "__main__":
    main()
