"""Ablations: drafting (proposer x budget), execution mode; each writes its table and plot.

    .venv/bin/python experiments/ablate.py --out results/ablate [--what drafting,exec] [--limit 24]
        [--exec-limit 4 --exec-max-new-tokens 32] [--draft HEAD_DIR] [--model DIR]

drafting  ``--proposer eagle|suffix|hybrid`` x ``--budget fixed|adaptive`` (``DRAFTING``), plus EAGLE-only and
        hybrid at the sweet spot of the tree-budget sweep (8 nodes / depth 2 / top-k 4): which source to draft from,
        and whether a per-step budget beats a fixed one (variant names hold no '/': they name directories). Per
        variant also the share of accepted drafts that came from the suffix.

exec    ``reference`` (PyNative, cross-checks every step) vs ``performance`` (the same code compiled). Reference
        is 20-30x slower, so it runs on ``--exec-limit`` turns of ``--exec-max-new-tokens`` tokens (both modes).

Every variant is one ``mindspore-eagle eval`` configuration in ``OUT/<ablation>/<variant>/`` (resumable).
Writes ``OUT/ablate_<ablation>.md`` / ``.json`` / ``.png`` (speedup and tau per variant).

The draft context window ablation (``results/ablate/ablate_window.*``) went with the proposer's window; the last
commit that runs it is f1af45e (``git show f1af45e:scripts/ablate.py``); its command: docs/results.md, "Earlier
results".
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.variants import add_variant_flags, evaluate_variant, plot_bars, write_table  # noqa: E402
from mindspore_eagle.app.build import build  # noqa: E402
from mindspore_eagle.runtime import RuntimeConfig  # noqa: E402
from mindspore_eagle.drafting import DraftingConfig  # noqa: E402
from mindspore_eagle.evaluation.evaluate import load_items  # noqa: E402

COLUMNS = ("variant", "turns", "lossless_turns", "tau", "speedup_mean", "speedup_p50", "speedup_p90",
           "speedup_p99", "tok_s_greedy", "tok_s_spec", "suffix_share")
TITLES = {"drafting": "drafting: proposer x budget", "exec": "execution mode"}
DRAFTING = (("eagle-fixed", "eagle", "fixed", None), ("eagle-fixed-8-2-4", "eagle", "fixed", (8, 2, 4)),
            ("suffix-fixed", "suffix", "fixed", None), ("suffix-adaptive", "suffix", "adaptive", None),
            ("hybrid-fixed", "hybrid", "fixed", None), ("hybrid-fixed-8-2-4", "hybrid", "fixed", (8, 2, 4)),
            ("hybrid-adaptive", "hybrid", "adaptive", None), ("hybrid-adaptive-8-2-4", "hybrid", "adaptive", (8, 2, 4)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_variant_flags(ap)
    ap.add_argument("--what", default="drafting", help="comma list of: drafting, exec")
    ap.add_argument("--exec-limit", type=int, default=4)
    ap.add_argument("--exec-max-new-tokens", type=int, default=32)
    ap.add_argument("--max-nodes", type=int, default=16)
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--top-k", type=int, default=4)
    args = ap.parse_args(argv)
    what = [w for w in args.what.split(",") if w]
    unknown = sorted(set(what) - set(TITLES))
    if unknown:
        ap.error(f"--what: unknown ablation(s) {unknown}; choose from {sorted(TITLES)}")

    items = load_items(args.eval_set, args.subset)
    base = DraftingConfig(proposer="eagle", budget="fixed", max_nodes=args.max_nodes, depth=args.depth,
                          top_k=args.top_k, head=args.draft)
    runtime = RuntimeConfig(max_cache_len=args.max_cache_len, dtype=args.dtype)
    stack = build(args.model, runtime, base)
    common = dict(spread=args.sample == "spread", log=lambda s: None)
    for ablation in what:
        variants = []  # (label, stack, evaluate_variant keyword arguments)
        if ablation == "drafting":
            for label, proposer, mode, sizes in DRAFTING:
                n, d, k = sizes or (base.max_nodes, base.depth, base.top_k)
                drafting = DraftingConfig(proposer=proposer, budget=mode, max_nodes=n, depth=d, top_k=k,
                                          head=None if proposer == "suffix" else args.draft)
                variants.append((label, stack.with_drafting(drafting), {}))
        else:
            ref = build(args.model, RuntimeConfig(max_cache_len=args.max_cache_len, exec_mode="reference",
                                                  dtype=args.dtype), base)
            short = {"limit": args.exec_limit, "max_new_tokens": args.exec_max_new_tokens}
            variants = [("performance", stack, short), ("reference", ref, short)]
        rows = []
        for label, variant, kw in variants:
            out = os.path.join(args.out, ablation, label)
            print(f"== {ablation}: {label} -> {out}", flush=True)
            kw = {"limit": args.limit, "max_new_tokens": args.max_new_tokens, **kw}
            m = evaluate_variant(variant, items, out, **common, **kw)
            share = m.get("accepted_by_source", {}).get("suffix_share")
            rows.append({"variant": label, **{c: m[c] for c in COLUMNS[1:-1]}, "suffix_share": share})
            print("   " + ", ".join(f"{c} {rows[-1][c]}" for c in COLUMNS[1:]), flush=True)
        stem = os.path.join(args.out, f"ablate_{ablation}")
        md, _ = write_table(rows, COLUMNS, stem)
        png = plot_bars(rows, "variant", stem + ".png", TITLES[ablation])
        print(f"table: {md}; plot: {png or 'skipped (matplotlib not installed)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
