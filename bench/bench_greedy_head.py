"""The greedy Q8 head on vs off, side by side in one run: the default teacher and drafting built twice through the
one builder, ``greedy_output="auto"`` (the token from kernels/argmax.cc where the head is fast: every SIMD path;
``MSE_KERNEL_ISA=avx2`` selects the AVX2 path on an AVX-512 machine, ``--no-vnni`` the AVX512-BW blocks a processor
without AVX512-VNNI takes) and ``"logits"`` (every logit, ``np.argmax`` on the host), each prompt run greedy and
speculative on both, the order alternating from prompt to prompt. Both must give the same tokens (the head is
exact); the ratios say what it buys. With ``--concurrency C`` the same for the batch engine (``serving``): every
prompt through two batch stacks (the serving drafting), C requests in flight, speculation off and on, the stacks
alternating per round. Last stdout line: one JSON object.

    GLOG_v=3 python bench/bench_greedy_head.py [--prompts FILE|evalset:N] [--max-new-tokens 128]
        [--concurrency C --rounds R] [--no-vnni] [--weights auto|native|dense] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys

from mindspore_eagle.app.bench import load_prompts, summarize
from mindspore_eagle.app.build import build
from mindspore_eagle.app.harness import compare, warm_up
from mindspore_eagle.kernels import build as kernel_build
from mindspore_eagle.kernels import greedy_head
from mindspore_eagle.runtime import RuntimeConfig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="evalset:12")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-cache-len", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=0, help="batch engine with C requests in flight (0: single)")
    ap.add_argument("--rounds", type=int, default=2, help="batch mode: rounds, each stack once per round and mode")
    ap.add_argument("--no-vnni", action="store_true",
                    help="the AVX-512 paths' AVX512-BW blocks instead of their VNNI ones (as on Skylake-SP)")
    ap.add_argument("--weights", default="auto", choices=("auto", "native", "dense"),
                    help="the teacher's weights (dense: the head through its Q8 copy)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = ap.parse_args(argv)
    if args.no_vnni:
        kernel_build.approx_vnni(False)
    if args.concurrency:
        return batch_ab(args)
    stacks = {kind: build(None, RuntimeConfig(max_cache_len=args.max_cache_len, greedy_output=kind,
                                              weights=args.weights, dtype=args.dtype))
              for kind in ("auto", "logits")}
    if stacks["auto"].teacher.greedy_output != "argmax":
        print(f"no greedy Q8 head here (kernel path {kernel_build.current_isa()}, fast: {greedy_head.fast_here()}): "
              "both runs would be the logits path", file=sys.stderr)
        return 1
    prompts = load_prompts(args.prompts)
    ids = [stacks["auto"].tokenizer.encode_chat([{"role": "user", "content": p}]) for p in prompts]
    for s in stacks.values():
        warm_up(s.engine, s.proposer_for, ids[0], args.max_new_tokens, s.eos)
    results = {kind: [] for kind in stacks}
    same = 0
    for i, p in enumerate(ids):
        order = ("auto", "logits") if i % 2 == 0 else ("logits", "auto")
        for kind in order:
            s = stacks[kind]
            results[kind].append(compare(s.engine, p, s.proposer_for, args.max_new_tokens, s.eos))
        a, b = results["auto"][-1], results["logits"][-1]
        same += list(a.greedy.tokens) == list(b.greedy.tokens) == list(a.spec.tokens) == list(b.spec.tokens)
        print(f"{i:>3} greedy {a.greedy.tok_s:7.2f} / {b.greedy.tok_s:7.2f} tok/s, spec {a.spec.tok_s:7.2f} / "
              f"{b.spec.tok_s:7.2f} (head / logits)", file=sys.stderr, flush=True)
    summary = {kind: summarize(r) for kind, r in results.items()}
    out = {"name": "greedy_q8_head_ab", "machine": platform.processor() or platform.machine(),
           "weights": stacks["auto"].teacher.weights, "dtype": args.dtype, "kernel_path": kernel_build.current_isa(),
           "vnni_blocks": kernel_build.approx_vnni(),
           "prompts": len(ids), "max_new_tokens": args.max_new_tokens, "same_tokens_all_four": f"{same}/{len(ids)}",
           "greedy_tok_s": {k: v["tok_s_greedy"] for k, v in summary.items()},
           "spec_tok_s": {k: v["tok_s_spec"] for k, v in summary.items()},
           "tau": {k: v["tau"] for k, v in summary.items()},
           "verify_ms": {k: v["step_ms"]["verify"] for k, v in summary.items()},
           "greedy_ratio": round(summary["auto"]["tok_s_greedy"] / summary["logits"]["tok_s_greedy"], 3),
           "spec_ratio": round(summary["auto"]["tok_s_spec"] / summary["logits"]["tok_s_spec"], 3),
           "head_stats": greedy_head.stats()}
    print(json.dumps(out))
    return 0 if same == len(ids) else 2


def batch_ab(args) -> int:
    from mindspore_eagle.serving.bench import run_load
    from mindspore_eagle.serving.stack import build_batch

    c = args.concurrency
    stacks = {kind: build_batch(None, c, args.max_cache_len,
                                RuntimeConfig(greedy_output=kind, weights=args.weights, dtype=args.dtype))
              for kind in ("auto", "logits")}
    if stacks["auto"].engine.teacher.greedy_output != "argmax":
        print("no greedy Q8 head here: both runs would be the logits path", file=sys.stderr)
        return 1
    prompts = load_prompts(args.prompts)
    ids = [stacks["auto"].tokenizer.encode_chat([{"role": "user", "content": p}]) for p in prompts]
    for s in stacks.values():
        s.engine.warm_up(sampling=False)
        for spec in (False, True):
            run_load(s.engine, ids[:c], c, 8, s.eos, spec)
    tok_s = {(k, spec): [] for k in stacks for spec in (False, True)}
    tokens = {}
    for r in range(args.rounds):
        for spec in (False, True):
            for kind in (("auto", "logits") if r % 2 == 0 else ("logits", "auto")):
                out = run_load(stacks[kind].engine, ids, c, args.max_new_tokens, stacks[kind].eos, spec)
                tokens.setdefault((kind, spec), out.pop("_tokens"))
                tok_s[(kind, spec)].append(out["tok_s"])
                print(f"round {r} spec {spec} {kind}: {out['tok_s']:.1f} tok/s", file=sys.stderr, flush=True)
    ref = tokens[("logits", False)]
    same = {f"{k}_{'spec' if spec else 'off'}": sum(a == b for a, b in zip(t, ref)) for (k, spec), t in tokens.items()}
    med = {f"{k}_{'spec' if spec else 'off'}": round(statistics.median(v), 2) for (k, spec), v in tok_s.items()}
    out = {"name": "greedy_q8_head_batch_ab", "weights": stacks["auto"].engine.teacher.weights, "dtype": args.dtype,
           "kernel_path": kernel_build.current_isa(),
           "vnni_blocks": kernel_build.approx_vnni(), "prompts": len(ids),
           "concurrency": c, "rounds": args.rounds, "max_new_tokens": args.max_new_tokens, "tok_s_median": med,
           "same_tokens_as_logits_off": same,
           "off_ratio": round(med["auto_off"] / med["logits_off"], 3),
           "spec_ratio": round(med["auto_spec"] / med["logits_spec"], 3), "head_stats": greedy_head.stats()}
    print(json.dumps(out))
    return 0 if all(v == len(ids) for v in same.values()) else 2


if __name__ == "__main__":
    sys.exit(main())
