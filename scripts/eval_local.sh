#!/usr/bin/env bash
# Plain multi-process evaluation (no msrun): N workers on this machine, then merge + report.
#
#   scripts/eval_local.sh N OUT_DIR [mindspore-eagle eval flags...]
#   scripts/eval_local.sh 2 results/run --limit 8 --max-new-tokens 64
#
# Worker r runs `mindspore-eagle eval --out OUT_DIR` with RANK_ID=r RANK_SIZE=N (the variables msrun sets),
# logging to OUT_DIR/logs/worker_r.log. Sharding, resume and merge are those of scripts/eval_msrun.sh: rerun
# the same command after an interruption and finished turns are skipped. Exit status: the first failing
# worker's, else the merge's.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 N OUT_DIR [mindspore-eagle eval flags...]" >&2
    exit 2
fi
N=$1
OUT=$2
shift 2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${VENV_BIN:-$ROOT/.venv/bin}
export PATH="$BIN:$PATH"
export GLOG_v=${GLOG_v:-3}
mkdir -p "$OUT/logs"

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap 'cleanup; exit 130' INT TERM

for ((r = 0; r < N; r++)); do
    RANK_ID=$r RANK_SIZE=$N "$BIN/mindspore-eagle" eval --out "$OUT" "$@" >"$OUT/logs/worker_$r.log" 2>&1 &
    pids+=($!)
done
status=0
for r in "${!pids[@]}"; do
    rc=0
    wait "${pids[$r]}" || rc=$?
    if [ $rc -ne 0 ]; then
        echo "worker $r failed (exit $rc); see $OUT/logs/worker_$r.log:" >&2
        tail -n 5 "$OUT/logs/worker_$r.log" >&2
        [ $status -eq 0 ] && status=$rc
    fi
done
trap - INT TERM
[ $status -ne 0 ] && exit $status
exec "$BIN/mindspore-eagle" eval --merge --out "$OUT" "$@"
