"""Greedy vs EAGLE-only vs suffix-only vs hybrid (fixed and adaptive budgets) on the default model, side by side.

Every variant runs on every prompt in one process, interleaved prompt by prompt (so a change of load on a
shared machine hits all variants alike), after an untimed warm-up that compiles every graph. Speed is new
tokens per second over the whole request (prefill included, as ``bench``); ``speedup`` is the per-prompt
ratio over greedy, averaged. Losslessness: every variant's tokens equal greedy's. The adaptive variants use
verification costs measured at start-up in the same process (``draft.budget.measure_costs``), or the default
table with ``--default-costs``.

On a shared machine single wall-clock runs are noisy (two variants doing identical work differed by 20%), so
a second, load-normalised figure is reported: ``est_speedup`` prices every variant's steps with one cost
table pooled over all runs of this process (median verification ms per bucket over every variant's steps,
plus each variant's own median draft and commit ms per step, plus the prompt's median prefill), so variants
differ only by what they do (steps, buckets, growths), not by when they ran.

    PYTHONPATH=. python scripts/bench_hybrid.py [--prompts 8] [--max-new-tokens 128] [--variants ...]

Last stdout line: JSON {"variants": {name: {tau, tok_s, speedup_mean, lossless_turns, ...}}, "costs": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = ("greedy", "eagle-16", "eagle-8", "suffix-fixed", "suffix-adaptive", "hybrid-fixed", "hybrid-adaptive")


def build(teacher, names, eagle16, costs):
    """name -> a proposer factory (None for greedy). eagle-16: the evaluation's budget 16/5/4; eagle-8: the
    sweep's sweet spot 8/2/4 (same head); hybrid grows with 16/5/4 (68 candidates) and merges under 16 (fixed)
    or the adaptive rule (up to 64)."""
    from mindspore_eagle.draft import Eagle3Proposer
    from mindspore_eagle.draft.hybrid import HybridProposer
    from mindspore_eagle.draft_config import TreeBudget

    eagle8 = Eagle3Proposer(eagle16.head, eagle16.embed_table, TreeBudget(max_nodes=8, depth=2, top_k=4))
    b = teacher.runtime.buckets
    make = {
        "greedy": lambda: None,
        "eagle-16": lambda: eagle16,
        "eagle-8": lambda: eagle8,
        "suffix-fixed": lambda: HybridProposer("suffix", "fixed", max_nodes=16, costs=costs, buckets=b),
        "suffix-adaptive": lambda: HybridProposer("suffix", "adaptive", max_nodes=64, costs=costs, buckets=b),
        "hybrid-fixed": lambda: HybridProposer("hybrid", "fixed", eagle=eagle16, max_nodes=16, costs=costs, buckets=b),
        "hybrid-adaptive": lambda: HybridProposer("hybrid", "adaptive", eagle=eagle16, max_nodes=64, costs=costs,
                                                  buckets=b),
    }
    return {n: make[n] for n in names}


def pooled_estimate(rows: dict) -> dict:
    """Per variant, mean over prompts of (estimated tok/s / greedy's estimated tok/s), every run priced with
    one pooled table (module docstring)."""
    verify: dict = {}
    for rs in rows.values():
        for r in rs:
            for b, ms in zip(r["buckets"], r["verify"]):
                verify.setdefault(b, []).append(ms)
    verify_ms = {b: float(np.median(v)) for b, v in verify.items()}
    host_ms = {}  # (variant, grew) -> median host ms of such steps (draft + commit + checks and mask)
    for n, rs in rows.items():
        for grew in (False, True):
            v = [h for r in rs for h, g in zip(r["host"], r["grew_steps"]) if g == grew]
            host_ms[n, grew] = float(np.median(v)) if v else 0.0
    prompts = sorted({r["prompt"] for rs in rows.values() for r in rs})
    ttft = {i: float(np.median([r["ttft"] for rs in rows.values() for r in rs if r["prompt"] == i])) for i in prompts}

    def tok_s(n, r):
        steps_ms = sum(verify_ms[b] + host_ms[n, g] for b, g in zip(r["buckets"], r["grew_steps"]))
        seconds = ttft[r["prompt"]] + steps_ms / 1000
        return r["tokens"] / seconds

    greedy = {r["prompt"]: tok_s("greedy", r) for r in rows["greedy"]}
    return {n: round(float(np.mean([tok_s(n, r) / greedy[r["prompt"]] for r in rs])), 3) for n, rs in rows.items()}


def main(argv=None) -> int:
    from mindspore_eagle.assets import default_model_dir
    from mindspore_eagle.bench import evalset_prompts
    from mindspore_eagle.config import RuntimeConfig
    from mindspore_eagle.draft import load_proposer
    from mindspore_eagle.draft.budget import VerifyCosts, measure_costs
    from mindspore_eagle.draft_config import TreeBudget
    from mindspore_eagle.engine import SpeculativeEngine
    from mindspore_eagle.teacher import Teacher
    from mindspore_eagle.tokenizer import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8, help="first turns of N conversations spread over the set")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--default-costs", action="store_true", help="use the default cost table, do not measure")
    args = ap.parse_args(argv)
    t0 = time.time()
    model = default_model_dir()
    teacher = Teacher.load(model, RuntimeConfig(max_cache_len=1024))
    tok = load_tokenizer(model)
    eos = tuple(dict.fromkeys(tuple(teacher.cfg.eos_token_ids) + tuple(tok.eos_token_ids)))
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in evalset_prompts(args.prompts)]
    names = ["greedy"] + [v for v in args.variants if v != "greedy"]
    eagle16 = load_proposer(None, teacher, TreeBudget(max_nodes=16, depth=5, top_k=4))
    if args.default_costs:
        costs = VerifyCosts()
    else:
        costs = measure_costs(teacher, prompts[0], eagle=eagle16)
    makers = build(teacher, names, eagle16, costs)
    print(f"costs: {dict(costs.bucket_ms)} ms per bucket, growth {costs.grow_ms:.1f} ms ({time.time() - t0:.0f} s)")
    engines = {n: SpeculativeEngine(teacher, makers[n]()) for n in names}
    # Warm-up: every prefill bucket and every variant's graphs, untimed.
    warm = list(prompts[0])
    for n in sorted(set(teacher.runtime.buckets) | {len(warm)}):
        if n <= teacher.max_len // 2:
            ids = (warm * (n // len(warm) + 1))[:n]
            for e in engines.values():
                e.generate(ids, 16, eos)
    print(f"warm-up done ({time.time() - t0:.0f} s)")
    rows = {n: [] for n in names}
    print(f"{'#':>2} {'variant':<16} {'tokens':>6} {'tok/s':>7} {'tau':>5} {'speedup':>7} lossless")
    for i, ids in enumerate(prompts):
        greedy = None
        for n in names:
            gen = engines[n].generate(ids, args.max_new_tokens, eos)
            greedy = gen if n == "greedy" else greedy
            prop = engines[n].proposer
            extra = {"grew_steps": [n.startswith("eagle")] * gen.cycles}
            if hasattr(prop, "log"):
                extra = {"grew": sum(s.grew for s in prop.log), "grew_steps": [s.grew for s in prop.log],
                         **prop.accepted_by_source()}
            rows[n].append({"tokens": len(gen.tokens), "tok_s": gen.tok_s, "cycles": gen.cycles,
                            "emitted": sum(s.emitted for s in gen.steps), "lossless": gen.tokens == greedy.tokens,
                            "speedup": gen.tok_s / greedy.tok_s, "prompt": i, "ttft": gen.ttft_s,
                            "buckets": [s.bucket for s in gen.steps], "verify": [s.teacher_ms for s in gen.steps],
                            "host": [s.draft_ms + s.commit_ms + s.verify_ms - s.teacher_ms for s in gen.steps],
                            **extra})
            r = rows[n][-1]
            print(f"{i:>2} {n:<16} {r['tokens']:>6} {r['tok_s']:>7.2f} {gen.tau:>5.2f} {r['speedup']:>7.2f} "
                  f"{'yes' if r['lossless'] else 'NO'}", flush=True)
    estimate = pooled_estimate(rows)
    summary = {}
    for n, rs in rows.items():
        cycles = sum(r["cycles"] for r in rs)
        s = {"turns": len(rs), "lossless_turns": sum(r["lossless"] for r in rs),
             "tau": round(sum(r["emitted"] for r in rs) / cycles, 3) if cycles else None,
             "tok_s": round(float(np.mean([r["tok_s"] for r in rs])), 3),
             "speedup_mean": round(float(np.mean([r["speedup"] for r in rs])), 3),
             "speedup_p50": round(float(np.median([r["speedup"] for r in rs])), 3),
             "est_speedup": estimate[n]}
        if "grew" in rs[0]:
            s["grow_share"] = round(sum(r["grew"] for r in rs) / max(cycles, 1), 3)
            s["accepted_by_source"] = {k: sum(r[k] for r in rs) for k in ("eagle", "suffix", "both")}
        summary[n] = s
    print(f"\n{'variant':<16} {'tau':>6} {'tok/s':>7} {'speedup':>8} {'est.':>7} lossless")
    for n, s in summary.items():
        print(f"{n:<16} {s['tau'] or 1.0:>6.3f} {s['tok_s']:>7.2f} {s['speedup_mean']:>7.3f}x "
              f"{s['est_speedup']:>6.3f}x {s['lossless_turns']}/{s['turns']}")
    print(json.dumps({"variants": summary, "costs": {"bucket_ms": {str(b): round(ms, 1) for b, ms in costs.bucket_ms},
                      "grow_ms": round(costs.grow_ms, 1)}, "prompts": len(prompts),
                      "max_new_tokens": args.max_new_tokens, "seconds": round(time.time() - t0, 1)},
                     separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
