"""Does the online suffix calibration (``draft.online_calibration``) recover what a wrong acceptance table costs?

Offline, over an evaluation trace's greedy outputs (no teacher runs; ``draft.replay``): suffix-only drafting with
the adaptive budget, one proposer carried across the turns in id order (as a server would: what it learns
persists across requests), priced with a verification cost model (``draft.budget.VerifyCosts``; ``--costs`` as
in ``scripts/replay_suffix.py``). A teacher the table was not fitted on is emulated by a wrong table: every
entry's odds multiplied by ``s`` (``s`` < 1: the table under-estimates acceptance, the teacher copies more than
SmolLM2; ``s`` > 1: over-estimates it). Each table runs twice, as shipped and corrected online. The printed
``recovered`` is the share of the wrong table's lost ms/token that learning wins back (1 = all of it).

    .venv/bin/python experiments/replay_calibration.py [--trace results/eval-fp32-hybrid-860k/merged.jsonl.gz]
        [--scales 0.25,1,4] [--out results/suffix-calibration]

Last stdout line: the JSON of every row.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mindspore_eagle.draft.budget import VerifyCosts  # noqa: E402
from mindspore_eagle.draft.hybrid import HybridProposer  # noqa: E402
from mindspore_eagle.draft.replay import replay  # noqa: E402
from mindspore_eagle.draft.calibration import SuffixCalibration, default_calibration  # noqa: E402
from mindspore_eagle.drafting import DraftingConfig  # noqa: E402
from scripts.replay_suffix import load_turns  # noqa: E402


def odds_scaled(table: SuffixCalibration, s: float) -> SuffixCalibration:
    """``table`` with every probability's odds times ``s`` (0 and 1 stay where they are)."""
    q = np.asarray(table.table, np.float64)
    scaled = q * s / (q * s + (1.0 - q))
    return SuffixCalibration(table.match_edges, table.count_edges, scaled, source=f"{table.source} (odds x {s})")


def run(turns, calibration: SuffixCalibration, learn: bool, costs: VerifyCosts) -> dict:
    ms = dict(costs.bucket_ms)
    drafting = DraftingConfig(proposer="suffix", budget="adaptive", max_nodes=max(ms),
                              suffix_calibration="online" if learn else "shipped")
    prop = HybridProposer(drafting, buckets=list(ms), calibration=calibration, costs=costs, learn_costs=False)
    emitted = spent = steps = 0
    for t in turns:
        for st in replay(prop, t.prompt, t.output):
            emitted += st.emitted
            spent += ms[min(b for b in ms if b >= st.nodes)] + costs.suffix_ms
            steps += 1
    greedy_ms = ms[1]
    row = {"steps": steps, "tau": round(emitted / steps, 3), "ms_per_token": round(spent / emitted, 3),
           "est_speedup": round(greedy_ms * emitted / spent, 3)}
    if learn:
        row["ratio"] = [round(float(r), 3) for r in prop.learner.ratio]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="results/eval-fp32-hybrid-860k/merged.jsonl.gz")
    ap.add_argument("--scales", default="0.25,1,4", help="odds multipliers of the wrong tables (1 = as shipped)")
    ap.add_argument("--limit", type=int, default=None, help="first N turns in id order (default: all)")
    ap.add_argument("--costs", default=None, help='JSON {"bucket_ms": {"1": 72, ...}, "grow_ms": 30}')
    ap.add_argument("--out", default=None, help="directory for replay_calibration.{json,md}")
    args = ap.parse_args(argv)
    costs = VerifyCosts()
    if args.costs:
        d = json.loads(args.costs)
        costs = VerifyCosts.from_mapping({int(k): v for k, v in d["bucket_ms"].items()}, d.get("grow_ms", 30.0))
    scales = [float(s) for s in args.scales.split(",")]
    t0 = time.time()
    turns = load_turns(args.trace)[: args.limit]
    print(f"{len(turns)} turns from {args.trace} ({time.time() - t0:.1f} s)", flush=True)
    shipped = default_calibration()
    right = run(turns, shipped, False, costs)
    rows = []
    for s in scales:
        table = shipped if s == 1 else odds_scaled(shipped, s)
        fixed = right if s == 1 else run(turns, table, False, costs)
        learnt = run(turns, table, True, costs)
        lost = fixed["ms_per_token"] - right["ms_per_token"]
        rec = (fixed["ms_per_token"] - learnt["ms_per_token"]) / lost if abs(lost) > 1e-9 else None
        row = {"odds_scale": s, "shipped_table": fixed, "online": learnt,
               "recovered": None if rec is None else round(rec, 3)}
        rows.append(row)
        print(f"odds x {s:<5g} table: tau {fixed['tau']:.3f}, {fixed['ms_per_token']:.2f} ms/token, "
              f"est {fixed['est_speedup']:.3f}x | online: tau {learnt['tau']:.3f}, "
              f"{learnt['ms_per_token']:.2f} ms/token, est {learnt['est_speedup']:.3f}x"
              + ("" if rec is None else f" | recovered {rec:.2f}") + f"  ({time.time() - t0:.0f} s)", flush=True)
    result = {"trace": args.trace, "turns": len(turns), "costs": {"bucket_ms": dict(costs.bucket_ms)},
              "rows": rows}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "replay_calibration.json"), "w") as f:
            json.dump(result, f, indent=1)
        lines = ["| table (odds x) | tau as shipped | est. speedup | tau online | est. speedup | recovered |",
                 "|---|---|---|---|---|---|"]
        for r in rows:
            a, b = r["shipped_table"], r["online"]
            lines.append(f"| {r['odds_scale']:g} | {a['tau']} | {a['est_speedup']} | {b['tau']} | {b['est_speedup']} "
                         f"| {'-' if r['recovered'] is None else r['recovered']} |")
        with open(os.path.join(args.out, "replay_calibration.md"), "w") as f:
            f.write(f"Suffix-only adaptive replay over {len(turns)} turns of `{args.trace}`, "
                    "one proposer across turns (`experiments/replay_calibration.py`).\n\n" + "\n".join(lines) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
