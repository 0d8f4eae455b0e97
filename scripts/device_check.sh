#!/usr/bin/env bash
# The device check, in one go, for the first TPU or GPU machine (under 8 minutes on an H200:
# each step has a time budget, and the steps' budgets add up to 575 s):
#   1. env          jax, its devices, and whether the engine imports (missing packages: see below)
#   2. kernel tests the Pallas kernels compiled for real against the naive reference
#   3. model step   benchmarks/model_step.py, Llama-3-8B shapes, random weights: decode at
#                   64 x 2k and 256 x 1k against the HBM roofline, prefill MFU against the
#                   bf16 matmul measured in the same run, wall time against device busy time
#   4. kernels      benchmarks/kernels.py: the attention kernel against the XLA reference,
#                   with a trace of its decode 64 x 2k case
#   5. weights      benchmarks/random_weights.py: random Llama-3-8B weights drawn on the
#                   device, saved once as the engine's checkpoint (kept in $RANDOM_WEIGHTS_DIR)
#   6. start-up     benchmarks/latency.py: engine start to first token, cold (empty caches)
#                   then warm, each a fresh process; the caches it fills serve step 7
#   7. throughput   benchmarks/throughput.py --random-weights llama3-8b: 256 requests offline
#   8. spec decode  benchmarks/spec_decode.py on those weights: n-gram drafts (k=4) against plain
#                   decoding at batch 1 and 64, repeated-id prompts
#   9. offload      benchmarks/kv_offload.py on those weights: a 32k-token prefix reloaded from the
#                   OffloadingConnector's host tier against computed again (TTFT)
# then the short table (benchmarks/device_table.py). A step that fails or runs out of time
# is reported in the table; the others still run. The exit status is non-zero if any failed.
#
#   scripts/device_check.sh [--smoke] [OUT_DIR] [kernel benchmark args, e.g. --iters 10]
#     --smoke   every step with tiny shapes on a CPU (what tests/scripts runs)
#     OUT_DIR   gets table.txt, the steps' JSON figures and logs.tgz (the logs); at most 8
#               files, as a device session's $OUT takes. Default: ./device_check_out
#   PYTHON=...  the interpreter (default .venv/bin/python, else python3)
#   .whl/*.whl  wheels installed first with pip --no-index into a scratch folder: the engine's
#               packages a device image lacks (scripts/device_wheels.sh downloads them)
#   SCRATCH (default /tmp/jaxvllm-device-check: logs, traces, caches; emptied first),
#   RANDOM_WEIGHTS_DIR, B_<STEP> (a step's budget in seconds) may be set.
set -uo pipefail
cd "$(dirname "$0")/.."

SMOKE=0 OUT="" KARGS=()
for arg in "$@"; do
  if [[ $arg == --smoke ]]; then SMOKE=1
  elif [[ -z $OUT && $arg != -* ]]; then OUT=$arg
  else KARGS+=("$arg"); fi
done
OUT=${OUT:-device_check_out}
PY=${PYTHON:-$(test -x .venv/bin/python && echo .venv/bin/python || echo python3)}
SCRATCH=${SCRATCH:-/tmp/jaxvllm-device-check}
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH" "$OUT" || exit 2
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SCRATCH/site" .whl/*.whl && export PYTHONPATH="$PYTHONPATH:$SCRATCH/site"
fi

if (( SMOKE )); then
  # Tiny shapes on a CPU: the budgets only stop a hung step.
  : "${B_ENV:=120}" "${B_TESTS:=300}" "${B_MODEL:=300}" "${B_KERNELS:=300}" "${B_WEIGHTS:=300}" \
    "${B_STARTUP:=400}" "${B_THROUGHPUT:=300}" "${B_SPEC:=300}" "${B_OFFLOAD:=300}"
  SHAPE=tiny DTYPE=float32 RANDOM_WEIGHTS_DIR=${RANDOM_WEIGHTS_DIR:-$SCRATCH/random-tiny}
  MODEL_ARGS=(--smoke) KERNEL_ARGS=(--smoke)
  ENGINE_ARGS=(--max-num-seqs 2 --max-model-len 64 --max-num-batched-tokens 16)
  WORKLOAD_ARGS=(--num-requests 8 --input-len 4 16 --output-len 2 8)
  SPEC_ARGS=(--methods ngram --batch-sizes 1 2 --output-len 8 --prompt-len 16 --repeats 1)
  OFFLOAD_ARGS=(--num-prefixes 2 --prefix-len 40 --tail 4 --output-len 2 --num-gpu-blocks 5 --max-model-len 64
                --skip-warmup)
  TEST_PLATFORMS=cpu
else
  # An H200, 575 s in all (12-04: model step 44 s, kernels 41 s, weights 44 s; start-up did
  # not finish in 120 s, spec decode took 134 s uncached). The start-up step compiles every
  # bucket of the 8B model once; whatever it compiled stays in the XLA cache for the
  # throughput and spec-decode steps (the same engine sizes) even if it runs out. The
  # offload step has a pool of its own (one 32k-token request), so compiles its own.
  : "${B_ENV:=15}" "${B_TESTS:=20}" "${B_MODEL:=60}" "${B_KERNELS:=50}" "${B_WEIGHTS:=50}" \
    "${B_STARTUP:=130}" "${B_THROUGHPUT:=100}" "${B_SPEC:=90}" "${B_OFFLOAD:=60}"
  SHAPE=llama3-8b DTYPE=bfloat16 RANDOM_WEIGHTS_DIR=${RANDOM_WEIGHTS_DIR:-/tmp/jaxvllm-random-llama3-8b}
  MODEL_ARGS=(--shape llama3-8b) KERNEL_ARGS=(--iters 10)
  ENGINE_ARGS=(--max-num-seqs 256 --max-model-len 1024 --max-num-batched-tokens 2048)
  WORKLOAD_ARGS=(--num-requests 256)
  SPEC_ARGS=(--methods ngram --batch-sizes 1 64 --output-len 64 --prompt-len 256 --repeats 2)
  OFFLOAD_ARGS=(--num-prefixes 2 --prefix-len 32768 --output-len 1 --num-gpu-blocks 2100 --max-model-len 33024
                --max-num-batched-tokens 4096)
  TEST_PLATFORMS=""  # tests/conftest.py would set cpu: the kernel tests are for the device
fi

# run_step NAME BUDGET LOG COMMAND...: the command under its budget, its log (absl's
# lines left out) in $SCRATCH/LOG, its status and seconds in steps.tsv.
run_step() {
  local name=$1 budget=$2 log=$3 start=$SECONDS
  shift 3
  echo "== $name (budget ${budget} s) =="
  timeout --kill-after=10 "$budget" "$@" 2>&1 | grep --line-buffered -v '^[WI][0-9]\{4\} ' \
    | tee "$SCRATCH/$log"
  local rc=${PIPESTATUS[0]}
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" "$budget" >> "$SCRATCH/steps.tsv"
  return "$rc"
}

run_step env "$B_ENV" env.log "$PY" -c '
import jax
print("jax", jax.__version__, jax.devices())
from pathlib import Path
Path("'"$SCRATCH"'/env.txt").write_text(f"{jax.devices()[0].device_kind}, jax {jax.__version__}")
try:
    import jaxvllm.entrypoints.llm  # noqa: F401  (the engine: needs gguf, pyzmq, ...)
except ImportError as e:
    raise SystemExit(f"the engine does not import: {e}; carry wheels in .whl (scripts/device_wheels.sh)")
'
run_step "kernel tests" "$B_TESTS" device_tests.log env JAX_PLATFORMS="$TEST_PLATFORMS" "$PY" -m pytest -q -p no:cacheprovider \
  tests/kernels/test_pallas_attention.py -k native
run_step "model step" "$B_MODEL" model_step.log "$PY" benchmarks/model_step.py "${MODEL_ARGS[@]}" \
  --profile "$SCRATCH/model_trace" --json "$SCRATCH/model_step.json"
run_step kernels "$B_KERNELS" kernels.log "$PY" benchmarks/kernels.py "${KERNEL_ARGS[@]}" "${KARGS[@]}" \
  --out "$SCRATCH/kernels.json" --profile "$SCRATCH/kernel_trace"
run_step weights "$B_WEIGHTS" weights.log "$PY" benchmarks/random_weights.py "$SHAPE" "$RANDOM_WEIGHTS_DIR" \
  --dtype "$DTYPE"
run_step start-up "$B_STARTUP" startup.log "$PY" benchmarks/latency.py --model "$RANDOM_WEIGHTS_DIR" \
  --skip-latency "${ENGINE_ARGS[@]}" --cache-dir "$SCRATCH/caches" --json "$SCRATCH/startup.json"
run_step throughput "$B_THROUGHPUT" throughput.log \
  env JAXVLLM_XLA_CACHE="$SCRATCH/caches/xla" JAXVLLM_MODEL_CACHE="$SCRATCH/caches/models" "$PY" benchmarks/throughput.py \
  --random-weights "$SHAPE" --random-weights-dir "$RANDOM_WEIGHTS_DIR" "${ENGINE_ARGS[@]}" "${WORKLOAD_ARGS[@]}" \
  --json "$SCRATCH/throughput.json"
run_step "spec decode" "$B_SPEC" spec_decode.log \
  env JAXVLLM_XLA_CACHE="$SCRATCH/caches/xla" JAXVLLM_MODEL_CACHE="$SCRATCH/caches/models" "$PY" benchmarks/spec_decode.py \
  --model "$RANDOM_WEIGHTS_DIR" "${ENGINE_ARGS[@]}" "${SPEC_ARGS[@]}" --json "$SCRATCH/spec_decode.json"
run_step offload "$B_OFFLOAD" kv_offload.log \
  env JAXVLLM_XLA_CACHE="$SCRATCH/caches/xla" JAXVLLM_MODEL_CACHE="$SCRATCH/caches/models" "$PY" benchmarks/kv_offload.py \
  --model "$RANDOM_WEIGHTS_DIR" --asks 2 --order round-robin "${OFFLOAD_ARGS[@]}" --json "$SCRATCH/kv_offload.json"

echo
"$PY" benchmarks/device_table.py "$SCRATCH" | tee "$SCRATCH/table.txt"
cp "$SCRATCH"/table.txt "$OUT"/
for f in model_step kernels startup throughput spec_decode kv_offload; do
  [[ -f $SCRATCH/$f.json ]] && cp "$SCRATCH/$f.json" "$OUT"/
done
tar -czf "$OUT/logs.tgz" -C "$SCRATCH" steps.tsv $(cd "$SCRATCH" && ls ./*.log ./*.txt 2>/dev/null)
# Non-zero if any step failed or ran out of time.
! cut -f2 "$SCRATCH/steps.tsv" | grep -qv '^0$'
