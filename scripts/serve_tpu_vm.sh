#!/usr/bin/env bash
# Serve jaxvllm on a Cloud TPU VM slice: copy the preset to every host, install jaxvllm[tpu],
# start `jaxvllm serve` on each host with its jax.distributed settings (one process per host,
# host 0 coordinates and serves HTTP), then wait until host 0 answers /health.
#
#   scripts/serve_tpu_vm.sh --tpu NAME --zone ZONE --config configs/tpu-v5e-8.yaml \
#       [--model PATH] [--project P] [--port 8000] [--package 'jaxvllm[tpu]'] \
#       [--hosts IP0,IP1,...] [--timeout 1800] [--ray] [--dry-run]
#
# --hosts skips the `gcloud ... describe` lookup of the slice's host IPs; --dry-run prints
# the command for each host instead of running anything (without --hosts: the lookup, and a
# plan for one placeholder host). --ray starts a Ray cluster over the hosts (head on host 0)
# and one engine on host 0 with the Ray executor, one worker actor per host.
set -euo pipefail

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

TPU="" ZONE="" PROJECT="" CONFIG="" MODEL="" PORT=8000 PACKAGE="jaxvllm[tpu]" HOSTS=""
TIMEOUT=1800 DRY_RUN=0 COORD_PORT=29501 RAY=0 RAY_PORT=6379
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tpu) TPU="$2"; shift 2 ;;
    --zone) ZONE="$2"; shift 2 ;;
    --project) PROJECT="$2"; shift 2 ;;
    --config) CONFIG="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --package) PACKAGE="$2"; shift 2 ;;
    --hosts) HOSTS="$2"; shift 2 ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    --ray) RAY=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "error: unknown argument $1" >&2; usage 2 ;;
  esac
done
for required in TPU ZONE CONFIG; do
  if [[ -z "${!required}" ]]; then
    echo "error: --${required,,} is required" >&2; exit 2
  fi
done
[[ -f "$CONFIG" ]] || { echo "error: config file $CONFIG not found" >&2; exit 2; }

GCLOUD=(gcloud compute tpus tpu-vm)
LOC=(--zone "$ZONE")
[[ -n "$PROJECT" ]] && LOC+=(--project "$PROJECT")

show() {  # one command as a shell would take it, single-quoting words that need it
  local out="" a
  for a in "$@"; do
    if [[ "$a" =~ [^][A-Za-z0-9_./:=,@%+-] ]]; then out+=" '${a//\'/\'\\\'\'}'"; else out+=" $a"; fi
  done
  echo "${out# }"
}
run() {  # print (dry run) or execute one command
  if [[ $DRY_RUN == 1 ]]; then show "$@"; else "$@"; fi
}

DESCRIBE=("${GCLOUD[@]}" describe "$TPU" "${LOC[@]}" --format='value(networkEndpoints[].ipAddress)')
if [[ -z "$HOSTS" && $DRY_RUN == 1 ]]; then  # a dry run calls nothing: one placeholder host
  echo "# the slice's host IPs (pass --hosts to plan for several hosts):"
  show "${DESCRIBE[@]}"
  HOSTS="HOST0_IP"
elif [[ -z "$HOSTS" ]]; then
  HOSTS=$("${DESCRIBE[@]}")
fi
IFS=',; ' read -r -a HOST_IPS <<< "$HOSTS"
N=${#HOST_IPS[@]}
(( N >= 1 )) || { echo "error: no hosts found for TPU $TPU" >&2; exit 2; }
COORD=${HOST_IPS[0]}
REMOTE_CONFIG="jaxvllm-$(basename "$CONFIG")"

echo "# TPU $TPU: $N host(s), coordinator $COORD:$COORD_PORT, HTTP on host 0 port $PORT"
echo "# copy the preset to every host"
run "${GCLOUD[@]}" scp "$CONFIG" "$TPU:$REMOTE_CONFIG" "${LOC[@]}" --worker=all
[[ $RAY == 1 && $PACKAGE == "jaxvllm[tpu]" ]] && PACKAGE="jaxvllm[tpu,ray]"
for ((i = 0; i < N; i++)); do
  SERVE=(jaxvllm serve --config "$REMOTE_CONFIG" --host 0.0.0.0 --port "$PORT")
  [[ -n "$MODEL" ]] && SERVE+=(--model "$MODEL")
  INSTALL="pip install -q $(printf '%q' "$PACKAGE")"
  if [[ $RAY == 1 ]]; then  # a Ray cluster; host 0's engine places one worker per host on it
    if (( i == 0 )); then RAY_START=(ray start --head --port "$RAY_PORT")
    else RAY_START=(ray start --address "$COORD:$RAY_PORT"); fi
    REMOTE="$INSTALL && $(show "${RAY_START[@]}")"
    if (( i == 0 )); then
      SERVE+=(--distributed-executor-backend ray --ray-workers "$N")
      REMOTE+=" && RAY_ADDRESS=auto nohup $(show "${SERVE[@]}") > jaxvllm-serve.log 2>&1 < /dev/null &"
    fi
  else
    if (( N > 1 )); then  # jax.distributed: one process per host, one global mesh
      SERVE+=(--nnodes "$N" --node-rank "$i" --master-addr "$COORD" --master-port "$COORD_PORT")
    fi
    REMOTE="$INSTALL && nohup $(show "${SERVE[@]}") > jaxvllm-serve.log 2>&1 < /dev/null &"
  fi
  echo "# host $i (${HOST_IPS[$i]})"
  run "${GCLOUD[@]}" ssh "$TPU" "${LOC[@]}" --worker="$i" --command "$REMOTE"
done

HEALTH="curl -sf http://localhost:$PORT/health"
echo "# wait for /health on host 0 (up to $TIMEOUT s)"
if [[ $DRY_RUN == 1 ]]; then
  run "${GCLOUD[@]}" ssh "$TPU" "${LOC[@]}" --worker=0 --command "$HEALTH"
  exit 0
fi
deadline=$((SECONDS + TIMEOUT))
until "${GCLOUD[@]}" ssh "$TPU" "${LOC[@]}" --worker=0 --command "$HEALTH" > /dev/null 2>&1; do
  if (( SECONDS >= deadline )); then
    echo "error: no /health after $TIMEOUT s; see jaxvllm-serve.log on the hosts" >&2; exit 1
  fi
  sleep 10
done
echo "jaxvllm is serving on $TPU host 0 (${COORD}:$PORT)."
