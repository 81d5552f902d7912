"""``mindspore-eagle report``: metrics, per-category tables and plots from evaluation traces.

Definitions (the same as ``bench``):
  speedup   per turn, speculative tokens/s over greedy tokens/s, each over the whole request (prefill
            included); the mean and linear-interpolated percentiles are over turns.
  tau       tokens emitted per speculative cycle (accepted drafts + the bonus), over all cycles of the turns
            considered: sum(emitted) / sum(cycles). Per turn, emitted / cycles.
  lossless  the speculative output equals the greedy output token for token.
  corr      Pearson correlation of per-turn tau and speedup (turns with at least one cycle).

Plots (matplotlib, Agg backend; skipped with a note when matplotlib is missing): the per-turn speedup CDF,
a histogram of per-turn tau, and tau vs speedup.
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..app.bench import speedup_stats
from ..errors import ConfigError
from .trace import MERGED_NAME, SHARD_GLOB, TurnSummary, read_trace

PLOTS_SKIPPED = "plots skipped: matplotlib is not installed (pip install matplotlib)"


@dataclass
class Loaded:
    turns: list  # TurnSummary sorted by turn id, each id once
    steps: dict  # turn id -> list[StepTrace]
    configs: list  # distinct run configs found in the headers
    duplicates: int
    skipped: list = dataclasses.field(default_factory=list)  # SkippedTurn, sorted by turn id (not in ``turns``)
    missing: list = dataclasses.field(default_factory=list)  # selected by a run header, neither finished nor skipped
    torn: list = dataclasses.field(default_factory=list)  # files whose last line was cut off (an interrupted write)
    orphan_steps: int = 0  # step lines of interrupted turns, not counted

    def warnings(self) -> list[str]:
        """What a reader must know before trusting the numbers: turns missing, skipped, or cut off."""
        out = []
        if self.missing:
            out.append(f"WARNING: {len(self.missing)} selected turns have no result (first: "
                       f"{', '.join(self.missing[:5])}); rerun the eval command to finish them")
        if self.skipped:
            out.append(f"WARNING: {len(self.skipped)} turns were skipped and are not in these numbers (first: "
                       + "; ".join(f"{s.turn}: {s.reason}" for s in self.skipped[:3]) + ")")
        if self.torn or self.orphan_steps:
            out.append(f"note: {len(self.torn)} trace files end in a cut-off line and {self.orphan_steps} step lines "
                       "belong to interrupted turns; both are ignored")
        return out


def trace_paths(paths: Sequence[str]) -> list[str]:
    """Files as given; a directory stands for its merged.jsonl(.gz), or its shard files when not merged."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            merged = [m for m in (os.path.join(p, MERGED_NAME), os.path.join(p, MERGED_NAME + ".gz"))
                      if os.path.isfile(m)]
            found = merged[:1] or sorted(glob.glob(os.path.join(p, SHARD_GLOB)))
            if not found:
                raise ConfigError(f"{p}: no {MERGED_NAME} or {SHARD_GLOB} in this directory")
            for f in found:
                if not os.path.isfile(f):
                    raise ConfigError(f"{f}: is a directory, not a trace file (named like {SHARD_GLOB}); move it "
                                      "out of the way")
            out += found
        elif os.path.isfile(p):
            out.append(p)
        else:
            raise ConfigError(f"{p}: no such trace file or directory")
    return out


def load(paths: Sequence[str]) -> Loaded:
    """Every finished turn of the given traces (a turn id seen twice is counted once), and what is missing."""
    turns, steps, configs, dup, skipped, selected, torn, orphans = {}, {}, [], 0, {}, set(), [], 0
    for path in trace_paths(paths):
        tf = read_trace(path)
        for h in tf.headers:
            if h.get("config") not in configs:
                configs.append(h.get("config"))
            selected.update(t for t in h.get("selected") or () if isinstance(t, str))
        for s in tf.turns:
            if s.turn in turns:
                dup += 1
                continue
            turns[s.turn], steps[s.turn] = s, tf.steps.get(s.turn, [])
        for s in tf.skipped:
            skipped.setdefault(s.turn, s)
        if tf.torn:
            torn.append(path)
        orphans += tf.orphan_steps
    skipped = {t: s for t, s in skipped.items() if t not in turns}
    missing = sorted(selected - set(turns) - set(skipped))
    return Loaded([turns[t] for t in sorted(turns)], steps, configs, dup, [skipped[t] for t in sorted(skipped)],
                  missing, torn, orphans)


def _round(x: float, nd: int = 3) -> float:
    return round(float(x), nd) if math.isfinite(x) else float("nan")


def source_of(turn_id: str) -> str:
    """"mtbench-081-t2" -> "mtbench"."""
    return turn_id.split("-", 1)[0]


def metrics(turns: Sequence[TurnSummary], steps: dict | None = None) -> dict:
    """The headline numbers of a set of turns (see the module docstring for definitions)."""
    if not turns:
        raise ConfigError("no finished turns to report")
    speedups = [t.speedup for t in turns]
    cycles = sum(t.cycles for t in turns)
    emitted = sum(t.emitted for t in turns)
    spec_s = sum(t.spec_s for t in turns)
    with_cycles = [t for t in turns if t.cycles > 0]
    taus = np.array([t.emitted / t.cycles for t in with_cycles])
    sp = np.array([t.speedup for t in with_cycles])
    corr = float(np.corrcoef(taus, sp)[0, 1]) if len(taus) >= 2 and taus.std() > 0 and sp.std() > 0 else float("nan")
    out = {
        "turns": len(turns),
        "lossless_turns": sum(t.lossless for t in turns),
        "tau": _round(emitted / cycles) if cycles else float("nan"),
        **speedup_stats(speedups, (50, 90, 99)),
        "corr_tau_speedup": _round(corr),
        "tok_s_greedy": _round(sum(t.tokens for t in turns) / sum(t.greedy_s for t in turns)),
        "tok_s_spec": _round(sum(t.spec_tokens for t in turns) / spec_s),
        "overhead_share": _overhead_share(turns, spec_s),
        "tokens": sum(t.tokens for t in turns),
        "cycles": cycles,
    }
    recorded = [t for t in turns if t.accepted_eagle is not None]
    if recorded:
        by = {k: sum(getattr(t, f"accepted_{k}") for t in recorded) for k in ("eagle", "suffix", "both")}
        total = sum(by.values())
        out["accepted_by_source"] = {**by, "suffix_share": _round((by["suffix"] + by["both"]) / total) if total
                                     else float("nan")}
    all_steps = [s for t in turns for s in (steps or {}).get(t.turn, [])]
    if all_steps:
        out["step_ms"] = {k: _round(float(np.mean([getattr(s, f"{k}_ms") for s in all_steps])), 2)
                          for k in ("grow", "verify", "commit", "update", "host")}
        out["tree_nodes_mean"] = _round(float(np.mean([s.tree_nodes for s in all_steps])), 2)
    return out


def _overhead_share(turns: Sequence[TurnSummary], spec_s: float) -> float:
    """Host time of the steps over spec time. Legacy traces (no ``spec_host_s``) get the old definition: spec time
    outside teacher forwards and draft growth (it also counted the draft's catch-up and cache commits)."""
    if all(t.spec_host_s is not None for t in turns):
        return _round(sum(t.spec_host_s for t in turns) / spec_s, 4)
    return _round(max(0.0, spec_s - sum(t.spec_teacher_s + t.spec_draft_s for t in turns)) / spec_s, 4)


def breakdown(turns: Sequence[TurnSummary], key=lambda t: t.category) -> dict:
    """``{group: {turns, lossless_turns, tau, speedup_mean, speedup_p50, tok_s_greedy, tok_s_spec[,
    accepted_by_source]}}``."""
    groups: dict[str, list] = {}
    for t in turns:
        groups.setdefault(key(t), []).append(t)
    keep = ("turns", "lossless_turns", "tau", "speedup_mean", "speedup_p50", "tok_s_greedy", "tok_s_spec",
            "accepted_by_source")
    return {g: {k: v for k, v in metrics(ts).items() if k in keep} for g, ts in sorted(groups.items())}


def report(loaded: Loaded) -> dict:
    out = metrics(loaded.turns, loaded.steps)
    out["by_source"] = breakdown(loaded.turns, lambda t: source_of(t.turn))
    out["by_category"] = breakdown(loaded.turns)
    return out


def jsonable(obj):
    """``obj`` with NaN/inf floats replaced by None (strict JSON has no NaN)."""
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def format_report(r: dict) -> str:
    """A human-readable table of ``report``'s dict."""
    lines = [f"turns {r['turns']}, lossless {r['lossless_turns']}/{r['turns']}, tau {r['tau']}, "
             f"tokens {r['tokens']} over {r['cycles']} cycles",
             f"speedup mean {r['speedup_mean']}  p50 {r['speedup_p50']}  p90 {r['speedup_p90']}  "
             f"p99 {r['speedup_p99']}  (corr(tau, speedup) = {r['corr_tau_speedup']})",
             f"tok/s greedy {r['tok_s_greedy']}  spec {r['tok_s_spec']}  overhead share {r['overhead_share']}"]
    if "step_ms" in r:
        lines.append("mean ms per step: " + ", ".join(f"{k} {v}" for k, v in r["step_ms"].items())
                     + f"; mean tree nodes {r['tree_nodes_mean']}")
    if "accepted_by_source" in r:
        a = r["accepted_by_source"]
        lines.append(f"accepted drafts by source: eagle {a['eagle']}, suffix {a['suffix']}, both {a['both']} "
                     f"(suffix share {a['suffix_share']})")
    for title, key in (("source", "by_source"), ("category", "by_category")):
        lines.append("")
        lines.append(f"{title:<12} {'turns':>5} {'lossless':>8} {'tau':>6} {'speedup':>7} {'p50':>6} "
                     f"{'greedy tok/s':>12} {'spec tok/s':>10} {'suffix share':>12}")
        for g, m in r[key].items():
            share = m.get("accepted_by_source", {}).get("suffix_share", "")
            lines.append(f"{g:<12} {m['turns']:>5} {m['lossless_turns']:>8} {m['tau']:>6} {m['speedup_mean']:>7} "
                         f"{m['speedup_p50']:>6} {m['tok_s_greedy']:>12} {m['tok_s_spec']:>10} {share:>12}")
    return "\n".join(lines)


# ----- plots ---------------------------------------------------------------------------------------------------


def _pyplot():
    """matplotlib.pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def make_plots(turns: Sequence[TurnSummary], out_dir: str) -> list[str] | None:
    """speedup_cdf.png, tau_hist.png, tau_vs_speedup.png in ``out_dir``; None when matplotlib is missing."""
    plt = _pyplot()
    if plt is None:
        return None
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    sp = np.sort([t.speedup for t in turns])
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.step(sp, np.arange(1, len(sp) + 1) / len(sp), where="post")
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="speedup (spec tok/s / greedy tok/s)", ylabel="fraction of turns",
           title=f"Per-turn speedup CDF ({len(sp)} turns)")
    paths.append(_save(fig, plt, out_dir, "speedup_cdf.png"))
    with_cycles = [t for t in turns if t.cycles]
    taus = [t.emitted / t.cycles for t in with_cycles]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.hist(taus, bins=min(30, max(5, len(taus) // 4)))
    ax.set(xlabel="tau (tokens per cycle)", ylabel="turns", title="Per-turn tau")
    paths.append(_save(fig, plt, out_dir, "tau_hist.png"))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for src in sorted({source_of(t.turn) for t in with_cycles}):
        ts = [t for t in with_cycles if source_of(t.turn) == src]
        ax.scatter([t.emitted / t.cycles for t in ts], [t.speedup for t in ts], s=12, label=src)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="tau (tokens per cycle)", ylabel="speedup", title="tau vs speedup")
    ax.legend(fontsize=8)
    paths.append(_save(fig, plt, out_dir, "tau_vs_speedup.png"))
    return paths


def _save(fig, plt, out_dir: str, name: str) -> str:
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


__all__ = ["Loaded", "PLOTS_SKIPPED", "breakdown", "format_report", "jsonable", "load", "make_plots", "metrics",
           "report", "source_of", "trace_paths"]
