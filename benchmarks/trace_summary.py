"""Where a traced call's device time goes: a summary of a jax.profiler trace.

benchmarks/kernels.py --profile traces a few calls of one case; this reads the trace's XSpace
(`jax.profiler.ProfileData`, as notebooks/profiling.ipynb does) and lists, per device
timeline (a GPU stream, a TPU core's XLA ops; on a CPU, XLA's host threads), the events that
took the most time. It tells the attention kernel's own time from the small XLA ops around
it (page table, work list, query layout), which a wall-clock time per call lumps together.

    python benchmarks/trace_summary.py TRACE_DIR [--calls N] [--top K]
"""
from __future__ import annotations

import argparse
import collections
from pathlib import Path
from typing import Iterable, NamedTuple

from jax.profiler import ProfileData


class Event(NamedTuple):
    plane: str     # "/device:GPU:0", "/host:CPU"
    line: str      # "XLA Ops", "Stream #13(Compute)", a host thread
    name: str
    duration_ns: float
    start_ns: float = 0.0


# Lines that span whole programs or steps rather than the work in them: a program's span
# includes the time its device waits on the host, so they never count as busy time.
SPAN_LINES = ("XLA Modules", "Steps", "XLA TraceMe", "Launch Stats", "Source code")


def load_events(trace_dir: str | Path) -> list[Event]:
    """Every event of the newest .xplane.pb under trace_dir."""
    files = sorted(Path(trace_dir).rglob("*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise FileNotFoundError(f"no .xplane.pb under {trace_dir}")
    profile = ProfileData.from_file(str(files[-1]))
    return [Event(plane.name, line.name, e.name, e.duration_ns, e.start_ns)
            for plane in profile.planes for line in plane.lines for e in line.events]


def device_events(events: Iterable[Event]) -> list[Event]:
    """Events of the /device: planes; with none (a CPU run), of the host threads XLA runs on."""
    events = list(events)
    return [e for e in events if e.plane.startswith("/device:")] or [
        e for e in events if e.plane == "/host:CPU" and e.line.startswith("tf_XLA")]


def timeline_busy(events: Iterable[Event], calls: int = 1) -> dict[str, float]:
    """Microseconds per call that each device timeline spends in its events (their sum:
    events on one line do not overlap, except nested ones on a CPU thread)."""
    busy = collections.defaultdict(float)
    for e in device_events(events):
        busy[f"{e.plane} / {e.line}"] += e.duration_ns / 1e3 / calls
    return dict(sorted(busy.items()))


def timeline_busy_union(events: Iterable[Event], calls: int = 1) -> dict[str, float]:
    """Microseconds per call that each device timeline is busy: the union of its events'
    intervals, so nested events (a CPU thread's thunks inside their executor) count once.
    Lines that span whole programs (SPAN_LINES) are left out."""
    spans = collections.defaultdict(list)
    for e in device_events(events):
        if e.line not in SPAN_LINES:
            spans[f"{e.plane} / {e.line}"].append((e.start_ns, e.start_ns + e.duration_ns))
    busy = {}
    for timeline, intervals in sorted(spans.items()):
        total, end = 0.0, float("-inf")
        for lo, hi in sorted(intervals):
            if hi > end:
                total += hi - max(lo, end)
                end = hi
        busy[timeline] = total / 1e3 / calls
    return busy


def summarize(events: Iterable[Event], calls: int = 1, top: int = 8) -> list[dict]:
    """Per device timeline, its `top` costliest events: per-call microseconds, count and
    share of the timeline's busy time."""
    device = device_events(events)
    total = collections.defaultdict(float)
    count = collections.Counter()
    for e in device:
        key = (e.plane, e.line, e.name)
        total[key] += e.duration_ns
        count[key] += 1
    rows = []
    for timeline in sorted({k[:2] for k in total}):
        keys = sorted((k for k in total if k[:2] == timeline), key=total.get, reverse=True)
        busy = sum(total[k] for k in keys)
        for k in keys[:top]:
            rows.append(dict(timeline=" / ".join(timeline), name=k[2], count=count[k],
                             us_per_call=total[k] / 1e3 / calls, share=total[k] / busy if busy else 0.0))
    return rows


def format_rows(rows: list[dict]) -> str:
    lines, last = [], None
    for r in rows:
        if r["timeline"] != last:
            lines.append(f"  {r['timeline']}")
            last = r["timeline"]
        lines.append(f"    {r['us_per_call']:9.1f} us/call {100 * r['share']:5.1f}%  x{r['count']:<4d} "
                     f"{r['name'][:70]}")
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
