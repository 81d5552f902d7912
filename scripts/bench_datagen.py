"""Training-data generation speed: answer tokens/s of ``train.batch_greedy`` per batch size, side by side with
the previous generator (static batches of 16, host-side numpy top-k) run from another source tree.

Each measurement is its own subprocess (one MindSpore process at a time), generating the same conversations of
the training prompt set for ``--seconds``. The new generator's rate counts answer tokens produced after
``--skip`` seconds (compile and the first fill of the slots excluded); the old one's counts the batches after
its first (which includes the compiles), at least one. The baseline runs before and after
the sweep; ratios are against their mean, so a machine shared with other jobs drifts both sides alike.

    PYTHONPATH=$PWD python scripts/bench_datagen.py --baseline-src /tmp/base   # base: `git archive <commit>`

Prints one JSON line per run and a summary JSON line last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

WORKER = r'''
import json, os, sys, time
os.environ.setdefault("GLOG_v", "3")
kind, batch, seconds, skip, new, max_prompt, turns = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
from mindspore_eagle.assets import default_model_dir
from mindspore_eagle.config import RuntimeConfig
from mindspore_eagle.teacher import Teacher
from mindspore_eagle.tokenizer import load_tokenizer
d = default_model_dir()
tok = load_tokenizer(d)
with open(sys.argv[8]) as f:
    convs = [c for c in map(json.loads, f) if len(c["turns"]) == turns]
prompts = [(c, tok.encode_chat([{"role": "user", "content": c["turns"][0]}])) for c in convs]
prompts = [(c, p) for c, p in prompts if len(p) <= max_prompt][:4000]
events = []  # (time, answer tokens) of every finished unit of work
t0 = time.perf_counter()
if kind == "new":
    from mindspore_eagle.evalset import EvalItem
    from mindspore_eagle.train.batch_greedy import BatchGreedyGenerator
    rows = max_prompt + new + 1 + (new + 64 if turns == 2 else 0)
    teacher = Teacher.load(d, RuntimeConfig(max_cache_len=rows, batch_size=batch, buckets=(1,), prefill_chunk=1))
    gen = BatchGreedyGenerator(teacher, new, tok.eos_token_ids, 32, tok)
    items = [EvalItem(c["id"], c["category"], tuple(c["turns"])) for c, _ in prompts]
    t0 = time.perf_counter()
    marks = []  # (time, answer tokens so far) after every step: a continuous count, unfinished answers included
    stats = gen.run(items, lambda f: None, should_stop=lambda s: time.perf_counter() - t0 > seconds,
                    on_step=lambda s: marks.append((time.perf_counter() - t0, s.answer_tokens)))
    events = [(t, n1 - n0) for (_, n0), (t, n1) in zip(marks, marks[1:])]
    extra = {"cache_rows": rows, "step_ms": round(1000 * stats.seconds / max(stats.steps, 1), 1), **stats.as_dict()}
else:
    from mindspore_eagle.train.data import generate_batch
    teacher = Teacher.load(d, RuntimeConfig(max_cache_len=max_prompt + new + 64, batch_size=batch,
                                            buckets=(1, 8, 16, 32, 64), prefill_chunk=64))
    ids = sorted((p for _, p in prompts), key=len)  # as the old generate_dataset did: similar lengths per batch
    t0 = time.perf_counter()
    for k in range(0, len(ids), batch):
        outs = generate_batch(teacher, ids[k:k + batch], new, tok.eos_token_ids, 32)
        events.append((time.perf_counter() - t0, sum(len(t) - len(p) for t, p in zip((o[0] for o in outs), ids[k:k + batch]))))
        if time.perf_counter() - t0 > seconds and len(events) >= 2:
            break
    extra = {"cache_rows": max_prompt + new + 64}
if kind == "old":
    skip = events[0][0]  # the first batch includes the compiles; count the batches after it
late = [(t, n) for t, n in events if t > skip]
start = max([t for t, _ in events if t <= skip], default=0.0)
span = (late[-1][0] - start) if late else 0.0
rate = sum(n for _, n in late) / span if span > 0 else 0.0
print(json.dumps({"kind": kind, "batch": batch, "turns": turns, "max_new_tokens": new, "answer_tok_s": round(rate, 1),
                  "finished_units": len(events), "window_s": round(span, 1), **extra}))
'''

def run(src: str, kind: str, batch: int, args, turns: int, conversations: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src), GLOG_v="3")
    cmd = [sys.executable, "-c", WORKER, kind, str(batch), str(args.seconds), str(args.skip), str(args.max_new_tokens),
           str(args.max_prompt_tokens), str(turns), conversations]
    t0 = time.time()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=os.path.abspath(src))
    if out.returncode != 0:
        raise SystemExit(f"{kind} B={batch} failed:\n{out.stderr[-3000:]}")
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    rec["wall_s"] = round(time.time() - t0, 1)
    rec["loadavg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(rec), flush=True)
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-src", required=True, help="source tree of the previous generator (git archive)")
    ap.add_argument("--batch-sizes", default="16,32,64,96,128")
    ap.add_argument("--two-turn-batch", type=int, default=64, help="also measure two-turn conversations at this B "
                    "(0: skip)")
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--skip", type=float, default=50.0)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--max-prompt-tokens", type=int, default=160)
    args = ap.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, here)
    from mindspore_eagle.train.prompts import build_conversations

    fd, conv_path = tempfile.mkstemp(suffix=".jsonl")
    with os.fdopen(fd, "w") as f:  # the same conversations, in the same order, for every run
        for c in build_conversations(seed=0):
            f.write(json.dumps(c) + "\n")
    base = [run(args.baseline_src, "old", 16, args, 1, conv_path)]
    sweep = [run(here, "new", int(b), args, 1, conv_path) for b in args.batch_sizes.split(",")]
    two = [run(here, "new", args.two_turn_batch, args, 2, conv_path)] if args.two_turn_batch else []
    base.append(run(args.baseline_src, "old", 16, args, 1, conv_path))
    ref = sum(r["answer_tok_s"] for r in base) / len(base)
    summary = {"baseline_old_B16_tok_s": [r["answer_tok_s"] for r in base],
               "new_tok_s": {r["batch"]: r["answer_tok_s"] for r in sweep},
               "ratio_vs_old_B16": {r["batch"]: round(r["answer_tok_s"] / ref, 2) for r in sweep},
               "two_turn": {r["batch"]: r["answer_tok_s"] for r in two},
               "best_batch": max(sweep, key=lambda r: r["answer_tok_s"])["batch"],
               "machine_shared": True, "loadavg_1m_end": round(os.getloadavg()[0], 2)}
    os.remove(conv_path)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
