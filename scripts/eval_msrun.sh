#!/usr/bin/env bash
# Evaluation over N workers launched by MindSpore's msrun, then merge + report.
#
#   scripts/eval_msrun.sh N OUT_DIR [mindspore-eagle eval flags...]
#   scripts/eval_msrun.sh 4 results/run --max-new-tokens 256
#
# msrun starts N workers (RANK_ID / RANK_SIZE set) and a scheduler process; `mindspore-eagle eval` returns at
# once in the scheduler (MS_ROLE=MS_SCHED) and each worker runs range(rank, n, N) of the conversations sorted
# by id, writing OUT_DIR/shard-RRR.jsonl. Worker logs: OUT_DIR/msrun_logs/. Rerun the same command after an
# interruption: finished turns are skipped. On the CPU backend the workers share the machine's cores, so this
# exercises the launcher rather than buying speed; scripts/eval_local.sh is the same without msrun.
# MASTER_PORT (default 8118) must be free.
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
export PATH="$BIN:$PATH"  # msrun starts the `python` found first on PATH
export GLOG_v=${GLOG_v:-3}
if ! command -v msrun >/dev/null; then
    echo "msrun not found in $BIN or on PATH; use scripts/eval_local.sh $N $OUT ..." >&2
    exit 127
fi
mkdir -p "$OUT"
msrun --worker_num="$N" --local_worker_num="$N" --master_port="${MASTER_PORT:-8118}" \
    --log_dir="$OUT/msrun_logs" --join=True "$BIN/mindspore-eagle" eval --out "$OUT" "$@"
exec "$BIN/mindspore-eagle" eval --merge --out "$OUT" "$@"
