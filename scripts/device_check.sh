#!/usr/bin/env bash
# One command for the first TPU or GPU machine: the Pallas kernels compiled for real against
# the naive oracle, then benchmarks/kernels.py (kernel vs the XLA kernel, bandwidth against
# the measured copy bandwidth) with a device trace of its first case (decode 64 x 2k: the
# kernel's own time against the XLA ops around it), then one decode step of the model traced
# (benchmarks/model_step.py: wall time against device busy time). The kernel table is last.
#   scripts/device_check.sh [OUT_DIR] [benchmark args, e.g. --sweep --iters 10]
#   (PYTHON=... chooses the interpreter; .venv/bin/python, else python3)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(test -x .venv/bin/python && echo .venv/bin/python || echo python3)}
OUT=${1:-.}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c 'import jax; print("jax", jax.__version__, jax.devices())'
echo "== kernel correctness on the device =="
"$PY" -m pytest -q -p no:cacheprovider tests/kernels/test_pallas_attention.py -k native 2>&1 \
  | tee "$OUT/device_tests.log" | tail -25
tests_rc=${PIPESTATUS[0]}
echo "== benchmark =="
"$PY" benchmarks/kernels.py --out "$OUT/kernels.json" --profile "$OUT/trace" "${@:2}" 2>&1 | grep -v '^[WI]0000\|^[WI][0-9]\{4\} ' \
  | tee "$OUT/kernels.log"
bench_rc=${PIPESTATUS[0]}
echo "== one decode step of the model (SmolLM2-135M shapes, 64 x 2k) =="
step_args=(); [[ " ${*:2} " == *" --smoke "* ]] && step_args=(--smoke)  # tiny shapes on a CPU
"$PY" benchmarks/model_step.py --profile "$OUT/model_trace" "${step_args[@]}" 2>&1 | grep -v '^[WI]0000\|^[WI][0-9]\{4\} ' \
  | tee "$OUT/model_step.log"
step_rc=${PIPESTATUS[0]}
echo
echo "== summary: device tests $(tail -1 "$OUT/device_tests.log") (rc=$tests_rc), benchmark rc=$bench_rc," \
     "model step rc=$step_rc =="
sed -n '/^model step: /,/^  \//p' "$OUT/model_step.log"
sed -n '/^profile: /,/^$/p' "$OUT/kernels.log"
sed -n '/^ragged paged attention, /,$p' "$OUT/kernels.log"
exit $(( tests_rc || bench_rc || step_rc ))
