"""Training-data generation speed: answer tokens/s of ``train.batch_greedy`` per batch size, side by side with
the previous generator (static batches of 16, host-side numpy top-k) run from another source tree.

Each measurement is its own subprocess (one MindSpore process at a time), generating the same conversations of
the training prompt set for ``--seconds``. The new generator's rate counts answer tokens produced after
``--skip`` seconds (compile and the first fill of the slots excluded); the old one's counts the batches after
its first (which includes the compiles), at least one. ``--pairs B`` instead runs the old generator and the
new one at batch B *at the same time* (same machine conditions for both) and prints their ratio. The baseline runs before and after
the sweep; ratios are against their mean, so a machine shared with other jobs drifts both sides alike. First, an
interleaved step benchmark in one process: the old decode step (B=16, full logits to the host, numpy top-k),
its prefill chunk (16 x 64 rows) and the new step per batch size, round by round (rows/s of each).

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

STEPS = r'''
import json, os, sys, time
import numpy as np
os.environ.setdefault("GLOG_v", "3")
from mindspore_eagle.assets import default_model_dir
from mindspore_eagle.config import RuntimeConfig
from mindspore_eagle.teacher import Teacher
from mindspore_eagle.train.topk_teacher import GreedyTopK
from mindspore_eagle.tree.mask import additive_from_bool
rows_new, rows_old, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
batches = [int(b) for b in sys.argv[4].split(",")]
d = default_model_dir()
rng = np.random.default_rng(0)


def numpy_topk(logits, k=32):  # the previous generator's host-side top-k
    idx = np.argpartition(-logits, k - 1, axis=-1)[..., :k]
    vals = np.take_along_axis(logits, idx, -1)
    order = np.argsort(-vals, axis=-1, kind="stable")
    return np.take_along_axis(idx, order, -1), np.take_along_axis(vals, order, -1).astype(np.float16)


old = Teacher.load(d, RuntimeConfig(max_cache_len=rows_old, batch_size=16, buckets=(1, 64), prefill_chunk=64))
cols = np.arange(rows_old)


def old_step(t):
    r = np.full((16, t), rows_old // 2) + np.arange(t)[None]
    mask = additive_from_bool(cols[None, None, :] <= r[:, :, None])[:, None]
    out = old.forward(rng.integers(0, 49152, (16, t)), r, r, mask, t)
    numpy_topk(out.logits)
    out.aux_hidden.astype(np.float16)


new = {b: GreedyTopK(Teacher.load(d, RuntimeConfig(max_cache_len=rows_new, batch_size=b, buckets=(1,),
                                                   prefill_chunk=1)), 32) for b in batches}


def new_step(b):
    new[b].step(rng.integers(0, 49152, b), np.full(b, rows_new // 2))


calls = [("old_decode_B16", lambda: old_step(1), 16), ("old_prefill_B16x64", lambda: old_step(64), 1024)]
calls += [(f"new_B{b}", (lambda b=b: new_step(b)), b) for b in batches]
for _, f, _ in calls:
    f(); f()  # compile and warm up
times = {n: [] for n, _, _ in calls}
for _ in range(rounds):  # interleaved: every variant sees the same machine load on average
    for n, f, _ in calls:
        t0 = time.perf_counter(); f(); times[n].append(time.perf_counter() - t0)
res = {n: {"ms": round(1000 * float(np.median(times[n])), 1), "rows_per_s": round(r / float(np.median(times[n])), 1)}
       for n, _, r in calls}
print(json.dumps({"kind": "steps", "rounds": rounds, "cache_rows_new": rows_new, "cache_rows_old": rows_old, **res}))
'''


def steps_ab(args, batches: str) -> dict:
    """Per batch size one process running the old steps and the new one interleaved round by round: per-row cost
    ratios robust to a shared machine (one process per B keeps memory to two teachers)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows_new = args.max_prompt_tokens + args.max_new_tokens + 1
    out_all = {}
    for b in batches.split(","):
        cmd = [sys.executable, "-c", STEPS, str(rows_new), str(args.max_prompt_tokens + args.max_new_tokens + 64),
               str(args.rounds), b]
        out = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=here, GLOG_v="3"), capture_output=True, text=True,
                             cwd=here)
        if out.returncode != 0:
            raise SystemExit(f"step benchmark B={b} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
        rec = json.loads(out.stdout.strip().splitlines()[-1])
        rec["loadavg_1m"] = round(os.getloadavg()[0], 2)
        rec["new_over_old_decode_rows"] = round(rec[f"new_B{b}"]["rows_per_s"] / rec["old_decode_B16"]["rows_per_s"], 2)
        print(json.dumps(rec), flush=True)
        out_all[int(b)] = rec
    return out_all


def start(src: str, kind: str, batch: int, args, turns: int, conversations: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src), GLOG_v="3")
    cmd = [sys.executable, "-c", WORKER, kind, str(batch), str(args.seconds), str(args.skip), str(args.max_new_tokens),
           str(args.max_prompt_tokens), str(turns), conversations]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=os.path.abspath(src))


def finish(proc: subprocess.Popen, what: str, t0: float) -> dict:
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{stderr[-3000:]}")
    rec = json.loads(stdout.strip().splitlines()[-1])
    rec["wall_s"] = round(time.time() - t0, 1)
    rec["loadavg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(rec), flush=True)
    return rec


def run(src: str, kind: str, batch: int, args, turns: int, conversations: str) -> dict:
    return finish(start(src, kind, batch, args, turns, conversations), f"{kind} B={batch}", time.time())


def pair(args, batch: int, conversations: str) -> dict:
    """The old generator (B=16) and the new one (B=``batch``) at the same time: both see the same machine."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    t0 = time.time()
    procs = [start(args.baseline_src, "old", 16, args, 1, conversations), start(here, "new", batch, args, 1, conversations)]
    old, new = finish(procs[0], "old B=16 (pair)", t0), finish(procs[1], f"new B={batch} (pair)", t0)
    rec = {"kind": "pair", "batch": batch, "old_tok_s": old["answer_tok_s"], "new_tok_s": new["answer_tok_s"],
           "ratio": round(new["answer_tok_s"] / max(old["answer_tok_s"], 1e-9), 2)}
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
    ap.add_argument("--rounds", type=int, default=10, help="rounds of the interleaved step benchmark")
    ap.add_argument("--steps-only", action="store_true", help="only the interleaved step benchmark")
    ap.add_argument("--pairs", default="", help="batch sizes to run concurrently with the old generator, then stop")
    args = ap.parse_args()
    if args.pairs:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        sys.path.insert(0, here)
        from mindspore_eagle.train.prompts import build_conversations

        fd, conv_path = tempfile.mkstemp(suffix=".jsonl")
        with os.fdopen(fd, "w") as f:
            for c in build_conversations(seed=0):
                f.write(json.dumps(c) + "\n")
        recs = [pair(args, int(b), conv_path) for b in args.pairs.split(",")]
        os.remove(conv_path)
        print(json.dumps({"pairs": {r["batch"]: r["ratio"] for r in recs}, "machine_shared": True}))
        return 0
    steps = steps_ab(args, args.batch_sizes)
    if args.steps_only:
        return 0
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
               "step_new_over_old_decode_rows": {b: r["new_over_old_decode_rows"] for b, r in steps.items()},
               "machine_shared": True, "loadavg_1m_end": round(os.getloadavg()[0], 2)}
    os.remove(conv_path)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
