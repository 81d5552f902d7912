#!/usr/bin/env bash
# Multi-worker generation / benchmark over msrun: N workers, worker r takes prompts r, r+N, ...; then merge.
#
#   scripts/msrun_generate.sh WORKERS OUT_DIR [multi_generate.py flags...]
#   scripts/msrun_generate.sh 2 out/gen --mode bench --max-new-tokens 64                       # default model
#   scripts/msrun_generate.sh 2 out/gen --model DIR --draft HEAD --prompts p.jsonl --mode spec
#   scripts/msrun_generate.sh 8 out/gen --device Ascend --max-nodes 16 --buckets 1,8,16,64     # one NPU per rank
#
# Writes OUT_DIR/rank{r}.jsonl per worker, then OUT_DIR/generations.jsonl and OUT_DIR/summary.json; msrun's
# logs go to OUT_DIR/msrun/. Env: MASTER_PORT (default: a free port), PYTHON (default: .venv/bin/python).
# The venv's bin goes first on PATH because msrun starts its workers with the `python` found there.
set -euo pipefail
if [ "$#" -lt 2 ]; then
    sed -n '2,12p' "$0" >&2
    exit 64
fi
WORKERS="$1"; OUT="$2"; shift 2
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
VENV_BIN="$(cd "$(dirname "$PYTHON")" && pwd)"
export PATH="$VENV_BIN:$PATH"
export GLOG_v="${GLOG_v:-3}"
PORT="${MASTER_PORT:-$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
mkdir -p "$OUT"
rm -f "$OUT"/rank*.jsonl
"$VENV_BIN/msrun" --worker_num="$WORKERS" --local_worker_num="$WORKERS" --master_port="$PORT" \
    --log_dir="$OUT/msrun" --join=True "$ROOT/scripts/multi_generate.py" --out "$OUT" "$@"
"$PYTHON" "$ROOT/scripts/multi_generate.py" --merge-only --out "$OUT"
