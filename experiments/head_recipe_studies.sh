#!/usr/bin/env bash
# The studies behind the default head's recipe (docs/head-training.md), on the recipe's data (DATA, made by
# scripts/train_default_head.sh data). Every run is mindspore-eagle train-draft with TrainConfig's defaults (the
# recipe of the 544k head: TTT 3, vocabulary rebuilt from the data, peak LR 2e-3) from the head of INIT_COMMIT.
#
#   experiments/head_recipe_studies.sh [baseline|ab|report|scaling|scaling-report]
#
# baseline  the head of INIT_COMMIT (f1af45e: the head before the chat data, 167k doc/code tokens) with its own
#           vocabulary, evaluated on the data's held-out sample (0 steps)
# ab        TTT_A vs TTT_B training-time-test steps, AB_STEPS optimizer steps each (matched steps: a time budget would
#           depend on whatever else the machine runs); evaluations at the start and the end only
# report    REPORT (results/head-training): baseline, ab and, with MAIN=RUN_DIR, a recipe run side by side
# scaling   one run per SCALE_POINTS training-set size (answer tokens of the first conversations of the data), each
#           SCALE_STEPS steps at most, held-out every 100 steps, stop on plateau; plus 0-step evaluations of
#           INIT_COMMIT's head and of the shipped head (reference rows). Needs the data at 2.2M answer tokens:
#           python -m mindspore_eagle.train.data --config configs/train/smollm2-head.json --out DATA \
#               --max-answer-tokens 2200000
#           SCALE_TAG=-1869 SCALE_STEPS=1869 SCALE_POINTS=167000: the same at the 544k head's step count
# scaling-report  results/data-scaling: table, JSON lines and plot of the scaling runs
set -euo pipefail
cd "$(dirname "$0")/.."
export GLOG_v=3 MSE_KERNEL_THREADS=${MSE_KERNEL_THREADS:-2}
HOME_DIR=${MINDSPORE_EAGLE_HOME:-$HOME/.cache/mindspore_eagle}
DATA=${DATA:-$HOME_DIR/recipes/smollm2-head/data}
RUNS=${RUNS:-$HOME_DIR/recipes/studies}
INIT_COMMIT=${INIT_COMMIT:-f1af45e}
INIT=$RUNS/init-$INIT_COMMIT
AB_STEPS=${AB_STEPS:-120} TTT_A=${TTT_A:-7} TTT_B=${TTT_B:-3} PATIENCE=${PATIENCE:-4}
REPORT=${REPORT:-results/head-training}
SCALE_POINTS=${SCALE_POINTS:-167000,500000,1000000,2000000} SCALE_STEPS=${SCALE_STEPS:-800} SCALE_TAG=${SCALE_TAG:-}

train() {  # train NAME INIT_HEAD [trainer flags...]
  local name=$1 init=$2
  shift 2
  .venv/bin/mindspore-eagle train-draft --data "$DATA" --run-dir "$RUNS/$name" --out "$RUNS/$name-head" \
    --init-head "$init" "$@"
}
fetch_init() {  # the head as committed at INIT_COMMIT (needs this git checkout)
  if [ ! -f "$INIT/config.json" ]; then
    rm -rf "$INIT.tmp"; mkdir -p "$INIT.tmp"
    git archive "$INIT_COMMIT" assets/heads/smollm2-135m-eagle3 | tar -x -C "$INIT.tmp"
    mv "$INIT.tmp/assets/heads/smollm2-135m-eagle3" "$INIT"; rm -rf "$INIT.tmp"
  fi
}

case "${1:-}" in
  baseline) fetch_init; train baseline "$INIT" --ttt-steps 7 --vocab-from-head --max-steps 0 ;;
  ab) fetch_init; for steps in "$TTT_A" "$TTT_B"; do
        train "ab-ttt$steps" "$INIT" --ttt-steps "$steps" --max-steps "$AB_STEPS" --eval-every 100000 --ckpt-every 50
      done ;;
  report)
    runs=()
    for r in baseline "ab-ttt$TTT_A" "ab-ttt$TTT_B"; do [ -f "$RUNS/$r/state.json" ] && runs+=("$r=$RUNS/$r"); done
    [ -z "${MAIN:-}" ] || runs+=("main=$MAIN")
    .venv/bin/python scripts/head_runs_report.py "$REPORT" "${runs[@]}" ;;
  scaling)
    fetch_init
    train scale-ref-init "$INIT" --vocab-from-head --max-steps 0
    train scale-ref-shipped assets/heads/smollm2-135m-eagle3 --vocab-from-head --max-steps 0
    for n in ${SCALE_POINTS//,/ }; do
      train "scale-$n$SCALE_TAG" "$INIT" --max-answer-tokens "$n" --max-steps "$SCALE_STEPS" --eval-every 100 \
        --ckpt-every 50 --patience "$PATIENCE"
    done ;;
  scaling-report)
    runs=()
    for n in ${SCALE_POINTS//,/ }; do
      [ -f "$RUNS/scale-$n$SCALE_TAG/state.json" ] && runs+=("scale-$n$SCALE_TAG=$RUNS/scale-$n$SCALE_TAG")
    done
    .venv/bin/python scripts/head_runs_report.py "results/data-scaling${SCALE_TAG:+/steps$SCALE_TAG}" "${runs[@]}" \
      --scaling --reference "init=$RUNS/scale-ref-init" --reference "shipped=$RUNS/scale-ref-shipped"
    .venv/bin/python scripts/head_runs_report.py results/data-scaling/references \
      "init=$RUNS/scale-ref-init" "shipped=$RUNS/scale-ref-shipped" ;;
  *) echo "usage: experiments/head_recipe_studies.sh baseline|ab|report|scaling|scaling-report" >&2; exit 2 ;;
esac
