"""Ablations: draft context window, execution mode, cache commit mode; each writes its table and plot.

    .venv/bin/python scripts/ablate.py --out results/ablate [--what window,exec,commit] [--limit 24]
        [--windows 16,32,64,128] [--exec-limit 4 --exec-max-new-tokens 32] [--draft HEAD_DIR] [--model DIR]

window  the draft attends to its last W context entries only (``Eagle3Proposer(window=W)``) vs the full
        context. The claim under test: truncating the draft's context hurts acceptance (tau) and speed.
exec    ``reference`` (PyNative, cross-checks every step) vs ``performance`` (the same code compiled). Reference
        is 20-30x slower, so it runs on ``--exec-limit`` turns of ``--exec-max-new-tokens`` tokens (both modes).
commit  ``auto`` (LENGTH when the accepted path is already in place, else PATH_INDEX), ``length`` (the same
        rule: LENGTH cannot commit a path that is not in place) and ``path_index`` (always reorder rows).

Every variant is one ``mindspore-eagle eval`` configuration in ``OUT/<ablation>/<variant>/`` (resumable).
Writes ``OUT/ablate_<ablation>.md`` / ``.json`` / ``.png`` (speedup and tau per variant).
"""

from __future__ import annotations

import argparse
import os
import sys

from mindspore_eagle.draft_config import TreeBudget
from mindspore_eagle.evaluate import evaluate_variant, load_setup
from mindspore_eagle.report import plot_bars, write_table

COLUMNS = ("variant", "turns", "lossless_turns", "tau", "speedup_mean", "speedup_p50", "speedup_p90",
           "speedup_p99", "tok_s_greedy", "tok_s_spec")
TITLES = {"window": "draft context window", "exec": "execution mode", "commit": "cache commit mode"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--what", default="window,exec,commit", help="comma list of: window, exec, commit")
    ap.add_argument("--limit", type=int, default=24, help="turns per variant (default 24)")
    ap.add_argument("--sample", choices=["spread", "first"], default="spread",
                    help="spread: first turns of LIMIT conversations spread over the set (default); "
                         "first: the first LIMIT turns by id")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--windows", default="16,32,64,128")
    ap.add_argument("--exec-limit", type=int, default=4)
    ap.add_argument("--exec-max-new-tokens", type=int, default=32)
    ap.add_argument("--draft", default=None, help="head directory (default: the shipped head)")
    ap.add_argument("--max-nodes", type=int, default=32)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--model", default=None)
    ap.add_argument("--subset", default="all", choices=["all", "mtbench", "humaneval"])
    ap.add_argument("--eval-set", default=None)
    ap.add_argument("--max-cache-len", type=int, default=1024)
    args = ap.parse_args(argv)
    what = [w for w in args.what.split(",") if w]
    unknown = sorted(set(what) - set(TITLES))
    if unknown:
        ap.error(f"--what: unknown ablation(s) {unknown}; choose from {sorted(TITLES)}")

    setup = load_setup(args.model, max_cache_len=args.max_cache_len, eval_set=args.eval_set, subset=args.subset)
    budget = TreeBudget(max_nodes=args.max_nodes, depth=args.depth, top_k=args.top_k)
    common = dict(draft=args.draft, budget=budget, spread=args.sample == "spread", log=lambda s: None)
    for ablation in what:
        variants = []  # (label, evaluate_variant keyword arguments)
        if ablation == "window":
            variants = [("full", {})] + [(f"W={w}", {"window": int(w)}) for w in args.windows.split(",") if w]
        elif ablation == "commit":
            variants = [(c, {"commit": c}) for c in ("auto", "length", "path_index")]
        else:
            ref = load_setup(args.model, max_cache_len=args.max_cache_len, exec_mode="reference",
                             eval_set=args.eval_set, subset=args.subset).teacher
            short = {"limit": args.exec_limit, "max_new_tokens": args.exec_max_new_tokens}
            variants = [("performance", short), ("reference", {**short, "teacher": ref})]
        rows = []
        for label, kw in variants:
            out = os.path.join(args.out, ablation, label.replace("=", ""))
            print(f"== {ablation}: {label} -> {out}", flush=True)
            kw = {"limit": args.limit, "max_new_tokens": args.max_new_tokens, **kw}
            m = evaluate_variant(setup, out, **common, **kw)
            rows.append({"variant": label, **{c: m[c] for c in COLUMNS[1:]}})
            print("   " + ", ".join(f"{c} {rows[-1][c]}" for c in COLUMNS[1:]), flush=True)
        stem = os.path.join(args.out, f"ablate_{ablation}")
        md, _ = write_table(rows, COLUMNS, stem)
        png = plot_bars(rows, "variant", stem + ".png", TITLES[ablation])
        print(f"table: {md}; plot: {png or 'skipped (matplotlib not installed)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
