"""Cost of one suffix drafting step (extend the index with the committed tokens + propose a scored, selected tree)
at a given context length, on real conversation tokens and on adversarial repetitive ones.

Contexts: ``real`` concatenates prompts and greedy outputs of the committed evaluation trace (rebuilt as in
``replay_suffix.py``) up to the context length, then steps through the following tokens; ``loop`` is one token
repeated (the deepest, densest trie); ``binary`` random tokens from {0, 1} (many occurrences of every suffix).
A step extends by the tokens a step commits (3 by default, about tau) and runs what ``HybridProposer`` runs in
suffix mode: ``suffix_candidates`` -> ``union`` -> ``select`` (16 nodes) and the adaptive ``plan_budget``.

    python experiments/bench_suffix.py [--context 4096] [--steps 300]

Last stdout line: JSON with per-step median / p90 / p99 milliseconds per context kind (target: < 1 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mindspore_eagle.draft.budget import VerifyCosts, plan_budget  # noqa: E402
from mindspore_eagle.draft.merge import select, union  # noqa: E402
from mindspore_eagle.draft.calibration import default_calibration  # noqa: E402
from mindspore_eagle.draft.suffix import SuffixConfig, SuffixIndex, suffix_candidates  # noqa: E402


def real_tokens(n: int) -> list[int]:
    from scripts.replay_suffix import load_turns

    out: list[int] = []
    for t in load_turns("results/eval-default/merged.jsonl.gz"):
        out += t.prompt + t.output
        if len(out) >= n:
            break
    return out


def time_steps(tokens: list[int], context: int, steps: int, per_step: int, cfg: SuffixConfig) -> dict:
    cal = default_calibration()
    costs = VerifyCosts()
    t0 = time.perf_counter()
    index = SuffixIndex(cfg.max_match)
    index.extend(tokens[:context])
    build_ms = (time.perf_counter() - t0) * 1000
    times, nodes, pos = [], [], context
    for _ in range(steps):
        new = tokens[pos:pos + per_step]
        pos += per_step
        t1 = time.perf_counter()
        index.extend(new)
        cands = union(None, suffix_candidates(index, cfg, cal))
        tree = select(cands, 16)
        plan_budget(cands.sorted_probs(), costs, costs.suffix_ms)
        times.append((time.perf_counter() - t1) * 1000)
        nodes.append(tree.layout.num_nodes)
    a = np.asarray(times)
    return {"context": context, "steps": steps, "build_ms": round(build_ms, 2),
            "step_ms_median": round(float(np.median(a)), 4), "step_ms_p90": round(float(np.percentile(a, 90)), 4),
            "step_ms_p99": round(float(np.percentile(a, 99)), 4), "mean_nodes": round(float(np.mean(nodes)), 1),
            "trie_nodes": index.num_nodes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--tokens-per-step", type=int, default=3)
    args = ap.parse_args(argv)
    cfg = SuffixConfig()
    need = args.context + args.steps * args.tokens_per_step
    rng = np.random.default_rng(0)
    kinds = {"real": real_tokens(need), "loop": [7] * need, "binary": rng.integers(0, 2, need).tolist()}
    out = {}
    for name, tokens in kinds.items():
        if len(tokens) < need:
            raise SystemExit(f"{name}: only {len(tokens)} tokens available, need {need}")
        r = time_steps(tokens, args.context, args.steps, args.tokens_per_step, cfg)
        out[name] = r
        print(f"{name:<7} context {r['context']}: build {r['build_ms']:.1f} ms, step median {r['step_ms_median']:.3f} "
              f"ms, p90 {r['step_ms_p90']:.3f}, p99 {r['step_ms_p99']:.3f} ({r['mean_nodes']} nodes proposed, "
              f"{r['trie_nodes']} trie nodes)")
    print(json.dumps({"target_ms": 1.0, "tokens_per_step": args.tokens_per_step, **out}, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
