"""`jaxvllm compile MODEL --target TARGET [engine flags] [--json FILE]` and `--list-targets`:
the command line of jaxvllm/aot_compile.py, a table per program and the plan, and the
whole report as JSON."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

MiB = 2**20
HEADER = (f"{'program':44s} {'ok':>3s} {'compile s':>9s} {'args MiB':>9s} {'temp MiB':>9s} "
          f"{'alias MiB':>9s} {'GFLOP':>8s} {'predicted ms':>12s}")


def add_parser(sub, add_engine_flags) -> None:
    p = sub.add_parser("compile", help="Compile every program the engine warms up for a TPU slice "
                                       "(compile-only devices: no TPU needed) and report memory and cost.")
    p.add_argument("model_arg", nargs="?", metavar="MODEL",
                   help="Checkpoint directory, hub id in the local cache, or a directory with only config.json.")
    p.add_argument("--target", help="A TPU slice, e.g. tpu-v5e-8 (--list-targets).")
    p.add_argument("--list-targets", action="store_true", help="Print the known targets and exit.")
    p.add_argument("--json", help="Write the report here.")
    p.add_argument("--programs", nargs="+", default=None,
                   help="Only programs whose names start with these (forward, sample, ...).")
    p.add_argument("--context", type=int, default=None,
                   help="Tokens of KV each sequence reads in a forward's roofline (default: 2048 or max_model_len).")
    p.add_argument("--compile-threads", type=int, default=None,
                   help="Programs compiled at once (default: the TPU platform's warm-up threads).")
    add_engine_flags(p)


def _engine_kwargs(ns: argparse.Namespace) -> dict:
    """The engine flags given, over the --config preset's values (whatever is not given keeps
    the engine's default; tensor_parallel_size: the slice's chips)."""
    import yaml

    from jaxvllm.config import EngineArgs
    names = {f.name for f in dataclasses.fields(EngineArgs)} - {"seed", "model"}
    given = {}
    if ns.config:
        EngineArgs.from_file(ns.config)  # checks the preset
        with open(ns.config) as f:
            given = {k: v for k, v in (yaml.safe_load(f) or {}).items() if k in names}
    return {**given, **{k: getattr(ns, k) for k in names if getattr(ns, k, None) is not None}}


def run(ns: argparse.Namespace) -> int:
    from jaxvllm.platforms.tpu_targets import TARGETS
    if ns.list_targets:
        for t in TARGETS.values():
            print(f"{t.name:12s} {t.num_chips:2d} x {t.chip.device_kind} ({t.chip.hbm_bytes / 2**30:g} GiB HBM)")
        return 0
    model = ns.model_arg or ns.model
    if not (model and ns.target):
        print("error: jaxvllm compile needs MODEL and --target (see --list-targets).", file=sys.stderr)
        return 2
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile-only devices: no TPU backend wanted
    from jaxvllm.aot_compile import compile_for_target
    printed = []

    def on_program(row: dict) -> None:  # the header with the first row: a refused plan prints its error alone
        if not printed:
            print(HEADER)
        printed.append(row)
        _print_row(row)

    try:
        report = compile_for_target(model, ns.target, programs=ns.programs, on_program=on_program,
                                    context=ns.context, compile_threads=ns.compile_threads, **_engine_kwargs(ns))
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{report['target']} (TP {report['tensor_parallel_size']}): fits={report['fits']}, weights "
          f"{report['weights_bytes'] / MiB:.1f} MiB/chip, {report['kv_blocks']} KV blocks "
          f"({report['kv_cache_bytes'] / MiB:.1f} MiB/chip), max_concurrency {report['max_concurrency']} at "
          f"max_model_len {report['max_model_len']}, max_num_seqs {report['max_num_seqs']}; "
          f"{len(report['programs'])} programs compiled in {report['compile_wall_s']:.1f} s on "
          f"{report['compile_threads']} threads ({report['compile_s']:.1f} s of compiles; {report['wall_s']:.0f} s "
          f"in all). predicted ms: the chip's roofline at {report['roofline_context']} tokens of context per "
          "sequence, not a measurement.")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if report["fits"] else 1


def _print_row(r: dict) -> None:
    if not r["compiled"]:
        print(f"{r['program']:44s} {'NO':>3s} {r['compile_s']:9.1f}  {r['error']}", flush=True)
        return
    print(f"{r['program']:44s} {'yes':>3s} {r['compile_s']:9.1f} {r['argument_bytes'] / MiB:9.1f} "
          f"{r['temp_bytes'] / MiB:9.1f} {r['alias_bytes'] / MiB:9.1f} {r['flops'] / 1e9:8.2f} "
          f"{r['predicted_s'] * 1e3:12.3f}", flush=True)
