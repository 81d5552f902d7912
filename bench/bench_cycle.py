"""What one speculative cycle costs on the default teacher, every part side by side in one run.

1. Teacher forward of T = 1, 4, 8, 16, 32, 64 tokens at committed context 128 / 512 / 1024, for MindSpore's
   MatMul (the primitive reference graph), the fused custom path in fp32 (dense weights, and the GGUF's native
   blocks: ``native_fp32``) and in bf16; the ratio of each
   forward to the decode step (T = 1) at the same context; for the custom paths the kernels' own wall clock
   (linear kernels, attention kernel) and the rest (MindSpore dispatch, graph launch, host conversion).
2. Commit of an accepted path whose rows move (bucket 16, path [0, 2, 4, 6, 8]): in-place row mover vs
   MindSpore's gather + scatter (whole-buffer copies), on the teacher's 60 cache buffers, waiting for the
   graph to finish (the engine's own ``commit_ms`` does not wait: the work lands in the next forward).
3. Host work of a cycle on a 16-node tree at context 1024: tree checks, the inputs (mask), greedy and sampling
   acceptance on real logits, and the logits' transfer to numpy.
4. Draft (the shipped EAGLE-3 head): the growth graph for depth 2, 4 and 6 (top-k 8) -> ms per growth level,
   tree selection on the host, and the draft's update with 4 accepted entries.

Each timing is the median of interleaved repetitions (variants alternate inside every repetition, so a
neighbour's load on a shared machine hits all of them alike). Last stdout line: one JSON object.

    [MSE_KERNEL_THREADS=2] GLOG_v=3 python bench/bench_cycle.py [--reps 7] [--contexts 128,512,1024]
        [--tokens 1,4,8,16,32,64] [--skip-mindspore] [--skip-draft] [--output logits|greedy]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("GLOG_v", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VOCAB = 49152
BUSHY_PARENTS = [0, 0, 0, 2, 2, 4, 4, 6, 6, 0, 1, 3, 5, 7, 8, 8]  # 16 nodes; accepted path [0, 2, 4, 6, 8]
PATH = [0, 2, 4, 6, 8]


def timed(fns: dict, reps: int) -> dict:
    """name -> median ms of ``fn()`` over ``reps`` interleaved repetitions (after two warm-up calls each)."""
    for fn in fns.values():
        fn()
        fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t) * 1e3)
    return {name: statistics.median(v) for name, v in times.items()}


class KernelClock:
    """Wall clock spent inside the linear and attention kernels (their own counters in the library)."""

    def __init__(self):
        from mindspore_eagle.kernels.build import load

        self.lib = ctypes.CDLL(load().library.path)
        self.lib.MseKernelStats.restype = ctypes.c_int64
        self.lib.MseAttentionStats.restype = ctypes.c_int64
        self.threads = int(self.lib.MseKernelThreads())

    def read(self) -> tuple[float, float]:
        """(linear ms, attention ms) since the last read."""
        sec = ctypes.c_double()
        self.lib.MseKernelStats(ctypes.byref(sec), 1)
        lin = sec.value * 1e3
        self.lib.MseAttentionStats(ctypes.byref(sec), 1)
        return lin, sec.value * 1e3


def load_teachers(model_dir: str, max_len: int, tokens: tuple[int, ...], skip_mindspore: bool) -> dict:
    from mindspore_eagle.compute import ComputeChoice
    from mindspore_eagle.runtime import RuntimeConfig
    from mindspore_eagle.kernels import MatmulChoice
    from mindspore_eagle.teacher import Teacher

    def runtime(weights: str) -> RuntimeConfig:
        return RuntimeConfig(max_cache_len=max_len, buckets=tokens, prefill_chunk=max(tokens), weights=weights)

    # custom_fp32: the dense fp32 weights; native_fp32: the GGUF's own blocks, the same teacher bit for bit
    variants = {"custom_fp32": (MatmulChoice("custom", "float32"), "dense"),
                "native_fp32": (MatmulChoice("custom", "float32"), "native"),
                "custom_bf16": (MatmulChoice("custom", "bfloat16"), "dense")}
    if not skip_mindspore:
        variants = {"mindspore": (MatmulChoice(), "dense"), **variants}
    return {name: Teacher.load(model_dir, runtime(weights), ComputeChoice(matmul=choice))
            for name, (choice, weights) in variants.items()}


def chain_inputs(ids, start: int, bucket: int, max_len: int):
    from mindspore_eagle.tree import ForwardInputs, TreeLayout

    return ForwardInputs.for_tree(TreeLayout.chain([int(t) for t in ids]), start, bucket, max_len)


def bench_forwards(teachers: dict, contexts, tokens, reps: int, clock: KernelClock, kind: dict) -> dict:
    """``kind``: teacher name -> the output its forwards return (``Teacher.forward``'s ``output``)."""
    rng = np.random.default_rng(0)
    max_len = next(iter(teachers.values())).max_len
    prefix = rng.integers(0, VOCAB, max(contexts))
    chunk = max(tokens)
    for teacher in teachers.values():  # rows [0, max context) hold a real prefix for every context below
        for off in range(0, len(prefix), chunk):
            ids = prefix[off:off + chunk]
            teacher.forward(chain_inputs(ids, off, teacher.runtime.buckets.fit(len(ids)), max_len))
    out = {}
    print("\nteacher forward of T tokens at committed context L (median ms; x = ratio to T=1 at the same L)")
    for ctx in contexts:
        print(f"  L={ctx}: " + " | ".join(f"{n:>22s}" for n in teachers))
        base = {}
        for t in tokens:
            inputs = chain_inputs(rng.integers(0, VOCAB, t), ctx, t, max_len)
            res = timed({n: (lambda te=te, k=kind[n]: te.forward(inputs, k)) for n, te in teachers.items()}, reps)
            if t == 1:
                base = dict(res)
            row = {n: {"ms": round(v, 2), "x_decode": round(v / base[n], 3)} for n, v in res.items()}
            for name, teacher in teachers.items():  # where the custom forwards' time goes
                if name == "mindspore":
                    continue
                split = []
                for _ in range(max(3, reps // 2)):
                    clock.read()
                    start = time.perf_counter()
                    teacher.forward(inputs, kind[name])
                    total = (time.perf_counter() - start) * 1e3
                    lin, att = clock.read()
                    split.append((total, lin, att))
                total, lin, att = sorted(split)[len(split) // 2]
                row[name].update(linear_ms=round(lin, 2), attention_ms=round(att, 2),
                                 rest_ms=round(total - lin - att, 2))
            out.setdefault(str(ctx), {})[str(t)] = row
            print(f"    T={t:3d}: " + " | ".join(f"{v:8.2f} ms {v / base[n]:5.2f}x" + " " * 4
                                             for n, v in res.items()))
    return out


def bench_commit(teacher, reps: int) -> dict:
    from mindspore.runtime import synchronize

    from mindspore_eagle.cache import BranchableKVCache

    pairs = teacher.cell.cache_parameters()
    caches = {"inplace": BranchableKVCache(pairs, teacher.runtime.exec_mode, inplace=True),
              "scatter": BranchableKVCache(pairs, teacher.runtime.exec_mode, inplace=False)}
    L = min(512, teacher.max_len - 16)  # the cache holds max(--contexts) + max(--tokens) rows, maybe fewer than 528
    for cache in caches.values():
        cache.state.committed_len = L

    def commit(cache):
        cache.begin_round(16)
        cache.commit(PATH, BUSHY_PARENTS)
        cache.rollback(L)
        synchronize()  # the commit's graph runs asynchronously: wait for it

    res = timed({n: (lambda c=c: commit(c)) for n, c in caches.items()}, reps)
    print(f"\ncommit of path {PATH} (4 rows move) in bucket 16, {len(pairs)} layers: "
          + ", ".join(f"{n} {v:.2f} ms" for n, v in res.items()))
    return {n: round(v, 3) for n, v in res.items()}


def bench_host(teacher, reps: int) -> dict:
    from mindspore_eagle.tree import ForwardInputs, TreeLayout, check_tree
    from mindspore_eagle.verify import PositionNoise, SamplingParams, accept_greedy, accept_sampling

    rng = np.random.default_rng(1)
    layout = TreeLayout.from_parents([int(t) for t in rng.integers(0, VOCAB, 16)], BUSHY_PARENTS)
    max_len = teacher.max_len
    L = max_len - 16
    out = teacher.forward(ForwardInputs.for_tree(layout, L, 16, max_len))
    logits = out.logits[0]
    argmax = np.argmax(logits, -1)  # what the greedy verification forward returns (output="argmax")
    sampling = SamplingParams(temperature=0.7, top_p=0.9)
    import mindspore as ms

    raw = ms.Tensor(np.zeros((1, 16, VOCAB), np.float32))
    fns = {"check_tree": lambda: check_tree(layout, VOCAB),
           "inputs_and_mask": lambda: ForwardInputs.for_tree(layout, L, 16, max_len),
           "accept_greedy": lambda: accept_greedy(layout, argmax),
           "accept_sampling": lambda: accept_sampling(layout, logits, sampling, PositionNoise(0), L + 1),
           "logits_to_numpy": lambda: raw.asnumpy()[:, :16]}
    res = {n: round(v, 3) for n, v in timed(fns, reps).items()}
    print("\nhost work of one cycle (16-node tree, context 1024, ms): " + ", ".join(f"{n} {v}" for n, v in res.items()))
    return res


def bench_draft(teacher, reps: int) -> dict:
    from mindspore_eagle.draft import load_proposer
    from mindspore_eagle.draft.grow import select_tree
    from mindspore_eagle.draft_config import TreeBudget
    from mindspore_eagle.verify import Acceptance

    rng = np.random.default_rng(2)
    prompt = [int(t) for t in rng.integers(0, VOCAB, 200)]
    out = {}
    for depth in (2, 4, 6):
        proposer = load_proposer(None, teacher, TreeBudget(max_nodes=16, depth=depth, top_k=8))
        aux = rng.standard_normal((len(prompt), proposer.head.cfg.target_hidden_size * 3)).astype(np.float32)
        proposer.begin(prompt, aux, 7)
        grown = proposer.candidates()
        acc = Acceptance((0, 1, 2, 3), (11, 12, 13, 14), 14)
        feats = rng.standard_normal((4, aux.shape[1])).astype(np.float32)

        def update():
            L = proposer.committed_len
            proposer.accept(acc, feats)
            proposer.cache.rollback(L)

        res = timed({"growth": proposer.candidates, "select": lambda: select_tree(7, *grown, 16),
                     "update": update}, reps)
        out[str(depth)] = {n: round(v, 3) for n, v in res.items()}
    per_level = (out["6"]["growth"] - out["2"]["growth"]) / 4
    out["growth_ms_per_level"] = round(per_level, 3)
    print("\ndraft (shipped head, top-k 8, 16 nodes): " + "; ".join(
        f"depth {d}: growth {out[d]['growth']:.2f} ms, select {out[d]['select']:.2f}, update {out[d]['update']:.2f}"
        for d in ("2", "4", "6")) + f"; {per_level:.2f} ms per growth level")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--contexts", default="128,512,1024")
    ap.add_argument("--tokens", default="1,4,8,16,32,64")
    ap.add_argument("--skip-mindspore", action="store_true")
    ap.add_argument("--skip-draft", action="store_true")
    ap.add_argument("--output", choices=("logits", "greedy"), default="logits",
                    help="what each forward returns: the logits (sampling's verification), or what greedy "
                         "verification reads (each teacher's greedy_output: the greedy Q8 head's token where it runs)")
    args = ap.parse_args()
    contexts = tuple(int(c) for c in args.contexts.split(","))
    tokens = tuple(int(t) for t in args.tokens.split(","))

    from mindspore_eagle.storage.assets import require_default_model
    from mindspore_eagle.kernels import kernel_status

    for dtype in ("float32", "bfloat16"):
        if kernel_status(dtype).library is None:
            raise SystemExit(f"custom {dtype} kernels unavailable: {kernel_status(dtype).reason}")
    clock = KernelClock()
    print(f"kernel threads {clock.threads} (MSE_KERNEL_THREADS), os.cpu_count() {os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    start = time.perf_counter()
    teachers = load_teachers(require_default_model(), max(contexts) + max(tokens), tokens, args.skip_mindspore)
    result = {"kernel_threads": clock.threads, "reps": args.reps, "load_average": round(os.getloadavg()[0], 2)}
    result["output"] = {n: ("logits" if args.output == "logits" else te.greedy_output) for n, te in teachers.items()}
    result["forward"] = bench_forwards(teachers, contexts, tokens, args.reps, clock, result["output"])
    result["commit_ms"] = bench_commit(teachers["custom_fp32"], args.reps)
    result["host_ms"] = bench_host(teachers["custom_bf16"], args.reps)
    if not args.skip_draft:
        result["draft_ms"] = {d: bench_draft(teachers[f"custom_{d}"], args.reps) for d in ("fp32", "bf16")}
    ref = str(512 if 512 in contexts else contexts[0])
    result["verify_x_decode_at_512"] = {n: {t: result["forward"][ref][t][n]["x_decode"] for t in ("16", "64")
                                            if t in result["forward"][ref]} for n in teachers}
    result["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
