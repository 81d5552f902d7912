"""Tree-budget sweep: speedup and tau over a grid of max nodes x depth x top-k, and the sweet spot on this machine.

    .venv/bin/python experiments/sweep_budget.py --out results/sweep_budget [--limit 24 --max-new-tokens 128]
        [--max-nodes 8,16,32,64 --depths 2,4,6,8 --top-ks 4,8] [--proposer eagle|suffix|hybrid]
        [--budget fixed|adaptive] [--dtype float32|bfloat16] [--draft HEAD_DIR|oracle] [--model DIR]

Every grid point is one ``mindspore-eagle eval`` configuration run in this process (one teacher, compiled
once) on ``--limit`` turns (by default the first turns of conversations spread over the set), its traces in
``OUT/n{nodes}-d{depth}-k{topk}/`` (resumable: rerun the same command after an interruption and finished points
and turns are skipped). Points whose growth yields fewer candidates than the tree needs (``top_k + (depth-1) * top_k**2 < max_nodes - 1``) are skipped.
Writes ``OUT/sweep_budget.md`` / ``.json`` (one row per point) and ``OUT/sweep_budget.png`` (speedup and tau
heatmaps, one panel per top-k); prints the sweet spot (the best mean speedup).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.variants import add_variant_flags, evaluate_variant, plot_heatmaps, write_table  # noqa: E402
from mindspore_eagle.app.build import build  # noqa: E402
from mindspore_eagle.runtime import RuntimeConfig  # noqa: E402
from mindspore_eagle.drafting import BudgetMode, DraftingConfig, Proposer  # noqa: E402
from mindspore_eagle.evaluation.evaluate import load_items  # noqa: E402

COLUMNS = ("max_nodes", "depth", "top_k", "turns", "lossless_turns", "tau", "speedup_mean", "speedup_p50",
           "speedup_p90", "speedup_p99", "tok_s_greedy", "tok_s_spec")


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_variant_flags(ap)
    ap.add_argument("--max-nodes", default="8,16,32,64")
    ap.add_argument("--depths", default="2,4,6,8")
    ap.add_argument("--top-ks", default="4,8")
    default = DraftingConfig().proposer.value
    ap.add_argument("--proposer", choices=[p.value for p in Proposer], default=default,
                    help=f"drafting at every point (default {default}, the CLI's)")
    ap.add_argument("--budget", dest="budget_mode", choices=[b.value for b in BudgetMode], default="fixed",
                    help="fixed (default): every step verifies the point's max nodes; adaptive: each step picks at "
                         "most the point's max nodes")
    args = ap.parse_args(argv)

    items = load_items(args.eval_set, args.subset)
    teacher_only = build(args.model, RuntimeConfig(max_cache_len=args.max_cache_len, dtype=args.dtype), None)
    rows = []
    for n, d, k in itertools.product(ints(args.max_nodes), ints(args.depths), ints(args.top_ks)):
        drafting = DraftingConfig(proposer=args.proposer, budget=args.budget_mode, max_nodes=n, depth=d, top_k=k,
                                  head=args.draft)
        budget = drafting.tree_budget()
        if budget.num_candidates < n - 1:
            print(f"skip n={n} d={d} k={k}: growth yields {budget.num_candidates} candidates < {n - 1} drafts")
            continue
        out = os.path.join(args.out, f"n{n}-d{d}-k{k}")
        print(f"== max_nodes={n} depth={d} top_k={k} -> {out}", flush=True)
        stack = teacher_only.with_drafting(drafting)
        m = evaluate_variant(stack, items, out, max_new_tokens=args.max_new_tokens, limit=args.limit,
                             spread=args.sample == "spread", log=lambda s: None)
        rows.append({"max_nodes": n, "depth": d, "top_k": k, **{c: m[c] for c in COLUMNS[3:]}})
        print("   " + ", ".join(f"{c} {rows[-1][c]}" for c in COLUMNS[3:]), flush=True)
    if not rows:
        print("no grid point to run", file=sys.stderr)
        return 2
    stem = os.path.join(args.out, "sweep_budget")
    md, _ = write_table(rows, COLUMNS, stem)
    png = plot_heatmaps(rows, stem + ".png")
    best = max(rows, key=lambda r: r["speedup_mean"])
    print(f"table: {md}; plot: {png or 'skipped (matplotlib not installed)'}")
    print(f"sweet spot: max_nodes={best['max_nodes']} depth={best['depth']} top_k={best['top_k']} "
          f"(speedup mean {best['speedup_mean']}, tau {best['tau']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
