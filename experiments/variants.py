"""What the sweep and ablation experiments share (``sweep_budget.py``, ``ablate.py``): their common flags, one
configuration evaluated end to end, and their tables and plots. Not part of the package: the product evaluates one
configuration per ``mindspore-eagle eval`` run."""

from __future__ import annotations

import json
import os
from typing import Callable, Sequence

import numpy as np

from mindspore_eagle.evaluation.evalset import EvalItem
from mindspore_eagle.evaluation.evaluate import RunConfig, merge, run_shard
from mindspore_eagle.evaluation.report import _pyplot, jsonable, load, metrics


def add_variant_flags(ap) -> None:
    """The flags every sweep/ablation experiment shares."""
    ap.add_argument("--out", required=True)
    ap.add_argument("--limit", type=int, default=24, help="turns per variant (default 24)")
    ap.add_argument("--sample", choices=["spread", "first"], default="spread",
                    help="spread: first turns of LIMIT conversations spread over the set (default); "
                         "first: the first LIMIT turns by id")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--draft", default=None, help="head directory (default: the shipped head) or 'oracle'")
    ap.add_argument("--model", default=None)
    ap.add_argument("--subset", default="all", choices=["all", "mtbench", "humaneval"])
    ap.add_argument("--eval-set", default=None)
    ap.add_argument("--max-cache-len", type=int, default=1024)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")


def evaluate_variant(stack, items: Sequence[EvalItem], out_dir: str, *, max_new_tokens: int = 256,
                     limit: int | None = None, spread: bool = False, log: Callable[[str], None] = print) -> dict:
    """One configuration end to end (run or resume in ``out_dir``, merge, metrics). ``stack`` carries the drafting
    (``Stack.with_drafting``)."""
    config = RunConfig.for_stack(stack, items, max_new_tokens)
    run_shard(stack, items, config, out_dir, limit=limit, spread=spread, log=log)
    loaded = load([merge(out_dir).path])
    return metrics(loaded.turns, loaded.steps)


def plot_heatmaps(rows: Sequence[dict], path: str) -> str | None:
    """Budget sweep: one panel per (metric, top_k), max_nodes x depth cells. ``rows`` have max_nodes, depth,
    top_k, speedup_mean and tau. None when matplotlib is missing."""
    plt = _pyplot()
    if plt is None:
        return None
    ks = sorted({r["top_k"] for r in rows})
    nodes = sorted({r["max_nodes"] for r in rows})
    depths = sorted({r["depth"] for r in rows})
    fig, axes = plt.subplots(2, len(ks), figsize=(3.6 * len(ks) + 1, 6.5), squeeze=False)
    for row, metric in enumerate(("speedup_mean", "tau")):
        for col, k in enumerate(ks):
            grid = np.full((len(nodes), len(depths)), np.nan)
            for r in rows:
                if r["top_k"] == k:
                    grid[nodes.index(r["max_nodes"]), depths.index(r["depth"])] = r[metric]
            ax = axes[row][col]
            im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis")
            for i in range(len(nodes)):
                for j in range(len(depths)):
                    if np.isfinite(grid[i, j]):
                        ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7, color="w")
            ax.set_xticks(range(len(depths)), depths)
            ax.set_yticks(range(len(nodes)), nodes)
            ax.set(xlabel="depth", ylabel="max nodes", title=f"{metric} (top-k {k})")
            fig.colorbar(im, ax=ax, fraction=0.046)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_bars(rows: Sequence[dict], label_key: str, path: str, title: str) -> str | None:
    """Ablation: speedup (mean, with p50 marks) and tau per variant. None when matplotlib is missing."""
    plt = _pyplot()
    if plt is None:
        return None
    labels = [str(r[label_key]) for r in rows]
    x = np.arange(len(rows))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(max(6, 1.3 * len(rows) + 3), 3.5))
    a1.bar(x, [r["speedup_mean"] for r in rows])
    a1.scatter(x, [r["speedup_p50"] for r in rows], color="k", marker="_", s=200, label="p50", zorder=3)
    a1.axhline(1.0, color="grey", lw=0.8, ls="--")
    a1.set_xticks(x, labels, rotation=20)
    a1.set(ylabel="speedup (mean)", title=title)
    a1.legend(fontsize=8)
    a2.bar(x, [r["tau"] for r in rows], color="tab:orange")
    a2.set_xticks(x, labels, rotation=20)
    a2.set(ylabel="tau (tokens per cycle)")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_table(rows: Sequence[dict], columns: Sequence[str], path_stem: str) -> tuple[str, str]:
    """``path_stem.md`` (a markdown table) and ``path_stem.json`` (the rows)."""
    os.makedirs(os.path.dirname(os.path.abspath(path_stem)), exist_ok=True)
    md = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    md += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
    with open(path_stem + ".md", "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")
    with open(path_stem + ".json", "w", encoding="utf-8") as f:
        json.dump(jsonable(list(rows)), f, indent=1)
    return path_stem + ".md", path_stem + ".json"
