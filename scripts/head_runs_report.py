"""Table, JSON lines and plot of draft-head training runs (their ``state.json``), side by side.

    python scripts/head_runs_report.py OUT_DIR NAME=RUN_DIR [NAME=RUN_DIR ...] [--tokens-per-batch 1024] [--scaling]

For each run: training data (sequences, answer tokens, draft vocabulary, held-out coverage), steps, training
minutes, peak RSS, the best held-out evaluation (simulated tau, acc_0..acc_6, and the tau over the depth every
run was trained for, so runs of different TTT lengths compare) and the whole held-out curve.
Writes ``OUT_DIR/runs.jsonl`` (one line per run, also printed), ``OUT_DIR/table.md`` and ``OUT_DIR/curve.png``
(held-out tau over the common depth against training entries seen = steps x tokens per batch). ``--scaling``
(runs that differ in their training data only): also ``OUT_DIR/scaling.md`` and ``OUT_DIR/scaling.png``, the best
held-out tau and acc_k against the training set's answer tokens, with each run's passes over its data and why it
stopped (a point that did not reach its plateau is a lower bound). Reads only; the runs are the trainer's
(``mindspore-eagle train-draft``)."""

from __future__ import annotations

import argparse
import json
import os
import sys


def summarise(name: str, run_dir: str) -> dict:
    path = os.path.join(run_dir, "state.json")
    if not os.path.isfile(path):
        raise SystemExit(f"{name}: {path} does not exist (not a training run directory?)")
    with open(path) as f:
        state = json.load(f)
    hist = state.get("history", [])
    if not hist:
        raise SystemExit(f"{name}: {path} has no held-out evaluation yet")
    best = max(hist, key=lambda h: h["tau"])
    positions = state.get("data", {}).get("train_positions")
    return {"run": name, **state.get("data", {}), "steps": state["step"], "stopped_by": state.get("stopped_by"),
            "train_minutes": round(state.get("train_seconds", 0.0) / 60, 1),
            "peak_rss_gb": max(h.get("peak_rss_gb", 0.0) for h in hist),
            "best_step": best["step"], "best_tau": best["tau"], "best_acc": best["acc"],
            "first_tau": hist[0]["tau"], "last_tau": hist[-1]["tau"],
            "curve": [[h["step"], h["tau"], h["acc"]] for h in hist], "positions": positions,
            # --train-eval-max runs: the fixed training sample at the best step, and its curve (the gap)
            "best_train_acc": best.get("train", {}).get("acc"),
            "train_curve": [[h["step"], h["train"]["acc"]] for h in hist if "train" in h]}


def add_passes(rows: list[dict], tokens_per_batch: int) -> None:
    """Passes over the training set = entries seen / the positions it holds (None when the run predates
    ``train_positions``)."""
    for r in rows:
        p = r.pop("positions")
        r["passes"] = round(r["steps"] * tokens_per_batch / p, 2) if p else None


def tau_over(acc: list[float], depth: int) -> float:
    """Simulated tau of a chain of ``depth`` drafts: ``1 + sum_k prod_{i<=k} acc_i`` over the first ``depth``."""
    tau, run = 1.0, 1.0
    for a in acc[:depth]:
        run *= a
        tau += run
    return round(tau, 4)


def add_common_depth(rows: list[dict]) -> int:
    """Runs with different TTT lengths are compared on the depth all of them were trained for."""
    depth = min(len(r["best_acc"]) for r in rows)
    for r in rows:
        r["common_depth"], r["tau_common"] = depth, tau_over(r["best_acc"], depth)
    return depth


def table(rows: list[dict]) -> str:
    k = max(len(r["best_acc"]) for r in rows)
    depth = rows[0]["common_depth"]
    head = ("| run | answer tokens | draft vocab | held-out coverage | steps | minutes | peak RSS GB | best step | "
            f"tau | tau (depth {depth}) | " + " | ".join(f"acc_{i}" for i in range(k)) + " |")
    lines = [head, "|" + "---|" * (10 + k)]
    for r in rows:
        accs = " | ".join([f"{a:.3f}" for a in r["best_acc"]] + [""] * (k - len(r["best_acc"]))) + " |"
        lines.append(f"| {r['run']} | {r.get('train_answer_tokens', '?')} | {r.get('draft_vocab', '?')} | "
                     f"{r.get('heldout_coverage', '?')} | {r['steps']} | {r['train_minutes']} | {r['peak_rss_gb']} | "
                     f"{r['best_step']} | {r['best_tau']:.3f} | {r['tau_common']:.3f} | {accs}")
    return "\n".join(lines) + "\n"


def scaling_table(rows: list[dict]) -> str:
    depth = rows[0]["common_depth"]
    k = max(len(r["best_acc"]) for r in rows)
    lines = ["| run | training answer tokens | draft vocab | held-out coverage | steps | passes | stopped by | "
             f"best step | tau (depth {depth}) | " + " | ".join(f"acc_{i}" for i in range(k)) + " |",
             "|" + "---|" * (9 + k)]
    for r in sorted(rows, key=lambda r: r.get("train_answer_tokens", 0)):
        accs = " | ".join([f"{a:.3f}" for a in r["best_acc"]] + [""] * (k - len(r["best_acc"]))) + " |"
        lines.append(f"| {r['run']} | {r.get('train_answer_tokens', '?'):,} | {r.get('draft_vocab', '?')} | "
                     f"{r.get('heldout_coverage', '?')} | {r['steps']} | {r['passes']} | {r['stopped_by'] or '?'} | "
                     f"{r['best_step']} | {r['tau_common']:.3f} | {accs}")
    return "\n".join(lines) + "\n"


def plot_scaling(rows: list[dict], path: str, references: list[dict] = ()) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot skipped: matplotlib is not installed", file=sys.stderr)
        return False
    rows = sorted(rows, key=lambda r: r["train_answer_tokens"])
    xs = [r["train_answer_tokens"] for r in rows]
    depth = rows[0]["common_depth"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(xs, [r["tau_common"] for r in rows], marker="o")
    for x, r in zip(xs, rows):  # open markers: stopped before a plateau (a lower bound)
        if r["stopped_by"] != "plateau":
            left.plot([x], [r["tau_common"]], marker="o", mfc="white", color="C0")
    ref_taus = [tau_over(ref["best_acc"], depth) for ref in references]
    for i, (ref, tau) in enumerate(zip(references, ref_taus)):  # other heads on the same held-out sample
        left.axhline(tau, color=f"C{i + 1}", ls="--", lw=1)
        left.annotate(f"{ref['run']} {tau:.3f}", (xs[0], tau), xytext=(0, 3), textcoords="offset points", fontsize=8)
    left.set_ylim(1.0, max([r["tau_common"] for r in rows] + ref_taus) + 0.15)
    left.set_ylabel(f"best held-out simulated tau, depth {depth}")
    for i in range(min(len(r["best_acc"]) for r in rows)):
        right.plot(xs, [r["best_acc"][i] for r in rows], marker="o", label=f"acc_{i}")
    right.set_ylabel("held-out acceptance at TTT step k")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xticks(xs, [f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}k" for x in xs])
        ax.minorticks_off()
        ax.set_xlabel("training answer tokens")
        ax.grid(alpha=0.3, which="both")
    fig.suptitle("data scaling (open marker: stopped before a plateau)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def plot(rows: list[dict], path: str, tokens_per_batch: int) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot skipped: matplotlib is not installed", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    depth = rows[0]["common_depth"]
    for r in rows:
        xs = [s * tokens_per_batch / 1e3 for s, _, _ in r["curve"]]
        line, = ax.plot(xs, [tau_over(acc, depth) for _, _, acc in r["curve"]], marker=".", label=f"{r['run']}")
        if r["train_curve"]:
            ax.plot([s * tokens_per_batch / 1e3 for s, _ in r["train_curve"]],
                    [tau_over(acc, depth) for _, acc in r["train_curve"]], linestyle="--", color=line.get_color(),
                    label=f"{r['run']} (training sample)")
    ax.set_xlabel("training entries seen (thousands)")
    gap = any(r["train_curve"] for r in rows)
    ax.set_ylabel(f"simulated tau, depth {depth}: held-out" + (" (dashed: training sample)" if gap else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def _name_and_dir(spec: str) -> tuple[str, str]:
    """A NAME=RUN_DIR argument (runs and references alike), refused before any file is read."""
    if "=" not in spec:
        raise SystemExit(f"{spec!r}: expected NAME=RUN_DIR")
    name, run_dir = spec.split("=", 1)
    return name, run_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("runs", nargs="+", help="NAME=RUN_DIR")
    ap.add_argument("--tokens-per-batch", type=int, default=1024)
    ap.add_argument("--scaling", action="store_true", help="also the data-scaling table and plot")
    ap.add_argument("--reference", action="append", default=[], metavar="NAME=RUN_DIR",
                    help="with --scaling: a head evaluated on the same held-out sample, drawn as a line")
    a = ap.parse_args(argv)
    if a.reference and not a.scaling:
        raise SystemExit("--reference: only the --scaling plot draws references; add --scaling")
    rows = [summarise(*_name_and_dir(spec)) for spec in a.runs]
    refs = [summarise(*_name_and_dir(spec)) for spec in a.reference]
    add_common_depth(rows)
    add_passes(rows, a.tokens_per_batch)
    if a.scaling and any("train_answer_tokens" not in r for r in rows):
        raise SystemExit("--scaling: every run needs its data summary (train_answer_tokens) in state.json")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "runs.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
            print(json.dumps({k: v for k, v in r.items() if k not in ("curve", "train_curve")}))
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(table(rows))
    plot(rows, os.path.join(a.out, "curve.png"), a.tokens_per_batch)
    print(table(rows))
    if a.scaling:
        with open(os.path.join(a.out, "scaling.md"), "w") as f:
            f.write(scaling_table(rows))
        plot_scaling(rows, os.path.join(a.out, "scaling.png"), refs)
        print(scaling_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
