#!/usr/bin/env bash
# Recipe for the shipped default draft head (SmolLM2-135M-Instruct teacher). Resumable: rerun the same command
# after an interruption and each stage continues where it stopped (data: manifest of finished prompts;
# training: latest checkpoint). Runs in the background; follow the log with `tail -f $LOGDIR/*.log`.
#
#   scripts/train_default_head.sh [data|train|export|all]      (default: all, in order)
#
# Knobs (environment): NUM_PROMPTS, DATA_TIME_LIMIT (s), TRAIN_MINUTES, MAX_STEPS, DRAFT_VOCAB, TTT_STEPS, OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
export GLOG_v=3
PY=${PY:-.venv/bin/python}
HOME_DIR=${MINDSPORE_EAGLE_HOME:-$HOME/.cache/mindspore_eagle}
DATA=${DATA:-$HOME_DIR/train_data/smollm2-135m}
RUN=${RUN:-$HOME_DIR/train_runs/smollm2-135m-eagle3}
OUT=${OUT:-assets/heads/smollm2-135m-eagle3}
LOGDIR=${LOGDIR:-$HOME_DIR/train_logs}
NUM_PROMPTS=${NUM_PROMPTS:-1200}
DATA_TIME_LIMIT=${DATA_TIME_LIMIT:-2100}
TRAIN_MINUTES=${TRAIN_MINUTES:-35}
DRAFT_VOCAB=${DRAFT_VOCAB:-6144}
TTT_STEPS=${TTT_STEPS:-7}
MAX_STEPS=${MAX_STEPS:-400}
STAGE=${1:-all}
mkdir -p "$LOGDIR"

run_stage() {
  case "$1" in
    data)
      "$PY" -m mindspore_eagle.train.data --out "$DATA" --num-prompts "$NUM_PROMPTS" --batch-size 16 \
        --max-new-tokens 128 --max-prompt-tokens 128 --time-limit "$DATA_TIME_LIMIT" ;;
    train)
      "$PY" -m mindspore_eagle.train.trainer --data "$DATA" --run-dir "$RUN" --out "$OUT" \
        --draft-vocab "$DRAFT_VOCAB" --ttt-steps "$TTT_STEPS" --time-limit-min "$TRAIN_MINUTES" \
        --max-steps "$MAX_STEPS" --prompt-loss --eval-every 50 --ckpt-every 25 ;;
    export)
      "$PY" -m mindspore_eagle.train.trainer --data "$DATA" --run-dir "$RUN" --out "$OUT" --export-only ;;
  esac
}

main() {
  if [ "$STAGE" = all ]; then
    for s in data train; do run_stage "$s"; done
  else
    run_stage "$STAGE"
  fi
}

if [ -z "${FOREGROUND:-}" ]; then
  log="$LOGDIR/$STAGE-$(date +%Y%m%d-%H%M%S).log"
  FOREGROUND=1 nohup "$0" "$STAGE" > "$log" 2>&1 &
  echo "started stage '$STAGE' in the background (pid $!); log: $log"
else
  main
fi
