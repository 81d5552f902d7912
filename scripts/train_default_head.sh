#!/usr/bin/env bash
# Recipe for the shipped default draft head (SmolLM2-135M-Instruct teacher). Resumable: rerun the same command
# after an interruption and each stage continues where it stopped (data: manifest of finished prompts;
# training: latest checkpoint). Runs in the background; follow the log with `tail -f $LOGDIR/*.log`.
#
#   scripts/train_default_head.sh [data|train|export|all]      (default: all, in order)
#
# Data (issue 17): the nine-category prompt set of mindspore_eagle.train.prompts (PER_CATEGORY conversations per
# category, about half with a second turn asked after the teacher's own first answer), answered by the
# continuous-batching generator (train.batch_greedy, top-k in the graph) at DATA_BATCH slots. The full set
# (9 x 2500 conversations, 21,947 within MAX_PROMPT_TOKENS=160) is an estimated ~4M answer tokens (at ~140 per
# answer); stop earlier with NUM_CONVERSATIONS or DATA_TIME_LIMIT, rerun to resume (a kill loses only the
# conversations in flight). Disk: 3.66 KB per stored position, ~1.4 stored positions per answer token (estimated):
# ~10 GB for 2M answer tokens. Memory (estimated): two teachers, caches of 353 and 609
# rows x DATA_BATCH slots: ~7.5 GB at 128, ~4 GB at 64.
#
# Knobs (environment): PER_CATEGORY, NUM_CONVERSATIONS, DATA_BATCH, MAX_NEW_TOKENS, MAX_PROMPT_TOKENS,
# DATA_TIME_LIMIT (s, empty: none), TRAIN_MINUTES, MAX_STEPS, DRAFT_VOCAB, TTT_STEPS, TRAIN_BUCKETS, OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
export GLOG_v=3
PY=${PY:-.venv/bin/python}
HOME_DIR=${MINDSPORE_EAGLE_HOME:-$HOME/.cache/mindspore_eagle}
DATA=${DATA:-$HOME_DIR/train_data/smollm2-135m-chat}  # issue 17 data; the earlier set lives in .../smollm2-135m
RUN=${RUN:-$HOME_DIR/train_runs/smollm2-135m-eagle3}
OUT=${OUT:-assets/heads/smollm2-135m-eagle3}
LOGDIR=${LOGDIR:-$HOME_DIR/train_logs}
PER_CATEGORY=${PER_CATEGORY:-2500}
NUM_CONVERSATIONS=${NUM_CONVERSATIONS:-}
DATA_BATCH=${DATA_BATCH:-128}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-192}
MAX_PROMPT_TOKENS=${MAX_PROMPT_TOKENS:-160}
DATA_TIME_LIMIT=${DATA_TIME_LIMIT:-}
TRAIN_BUCKETS=${TRAIN_BUCKETS:-128,192,256}
TRAIN_MINUTES=${TRAIN_MINUTES:-35}
DRAFT_VOCAB=${DRAFT_VOCAB:-6144}
TTT_STEPS=${TTT_STEPS:-7}
MAX_STEPS=${MAX_STEPS:-400}
STAGE=${1:-all}
mkdir -p "$LOGDIR"

run_stage() {
  case "$1" in
    data)
      "$PY" -m mindspore_eagle.train.data --out "$DATA" --per-category "$PER_CATEGORY" \
        ${NUM_CONVERSATIONS:+--num-conversations "$NUM_CONVERSATIONS"} --batch-size "$DATA_BATCH" \
        --max-new-tokens "$MAX_NEW_TOKENS" --max-prompt-tokens "$MAX_PROMPT_TOKENS" \
        ${DATA_TIME_LIMIT:+--time-limit "$DATA_TIME_LIMIT"} ;;
    train)
      "$PY" -m mindspore_eagle.train.trainer --data "$DATA" --run-dir "$RUN" --out "$OUT" \
        --draft-vocab "$DRAFT_VOCAB" --ttt-steps "$TTT_STEPS" --time-limit-min "$TRAIN_MINUTES" \
        --max-steps "$MAX_STEPS" --buckets "$TRAIN_BUCKETS" --prompt-loss --eval-every 50 --ckpt-every 25 ;;
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
