"""Small-M linear cost, MindSpore MatMul vs the custom kernels (fp32, bf16), side by side in one run.

1. Microbenchmark: 20 independent ``[M, 576] x [576, 1536]`` Linears (20 distinct weights, 70 MB in fp32: more
   than the L3 cache, like a model's weights) and the tied LM head ``[M, 576] x [49152, 576]^T``, each in one
   ``ms.jit`` graph, for M = 1, 4, 8, 16, 32, 64, 128.
2. The default teacher (SmolLM2-135M): one forward of T = 1, 8, 16, 64 tokens after a 256-token prefix, with
   each MatmulChoice (``--skip-teacher`` to leave it out).
3. Batch invariance of the whole teacher: logits of 16 chained tokens from one T = 16 forward vs 16 T = 1
   decodes of the same tokens (bit-identical rows counted), and of its parts in isolation (MatMul, attention
   core, RMSNorm: row 0 of a T = 1 call vs a T = 16 call).

Timings are medians (and minima) of interleaved repetitions: backends alternate inside every repetition, so a
neighbour's load on a shared machine hits all of them alike. Last stdout line: one JSON object.

    [MSE_KERNEL_THREADS=2] GLOG_v=3 python scripts/bench_linear.py [--reps 15] [--skip-teacher] [--skip-micro]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("GLOG_v", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROWS = (1, 4, 8, 16, 32, 64, 128)
TOKENS = (1, 8, 16, 64)
PREFIX = 256
HIDDEN, INTER, VOCAB = 576, 1536, 49152


def choices():
    from mindspore_eagle.kernels import MatmulChoice

    return {"mindspore": MatmulChoice(), "custom_fp32": MatmulChoice("custom", "float32"),
            "custom_bf16": MatmulChoice("custom", "bfloat16")}


def timed(fns: dict, reps: int) -> dict:
    """name -> (median ms, min ms) of ``fn()`` over ``reps`` interleaved repetitions (after one warm-up each)."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t) * 1e3)
    return {name: (statistics.median(v), min(v)) for name, v in times.items()}


def linear_cells(choice, rng):
    from mindspore import Tensor, nn, ops

    from mindspore_eagle.kernels import LinearKernel, pack_weights
    from mindspore_eagle.models.layers import Linear

    class Twenty(nn.Cell):
        def __init__(self):
            super().__init__()
            self.lins = nn.CellList([Linear(HIDDEN, INTER, matmul=choice) for _ in range(20)])
            for lin in self.lins:
                lin.weight.set_data(Tensor((rng.standard_normal((HIDDEN, INTER)) * 0.04).astype(np.float32)))
            pack_weights(self)

        def construct(self, x):
            out = ()
            for lin in self.lins:
                out = out + (lin(x),)
            return out

    class Head(nn.Cell):
        def __init__(self, table):
            super().__init__()
            self.custom = choice.custom
            if self.custom:
                self.kernel = LinearKernel(HIDDEN, VOCAB, choice.dtype, transposed=True)
                self.kernel.pack(table)
            else:
                from mindspore import Parameter

                self.table = Parameter(Tensor(table), name="table", requires_grad=False)
                self.mm = ops.MatMul(transpose_b=True)

        def construct(self, x):
            if self.custom:
                return self.kernel(x, None)
            return self.mm(x, self.table)

    return Twenty(), Head


def bench_microbench(reps: int) -> dict:
    import mindspore as ms
    from mindspore import Tensor

    rng = np.random.default_rng(0)
    table = (rng.standard_normal((VOCAB, HIDDEN)) * 0.04).astype(np.float32)
    cells = {}
    for name, choice in choices().items():
        twenty, head_cls = linear_cells(choice, rng)
        cells[name] = (ms.jit(twenty), ms.jit(head_cls(table)))
    out = {"linear20": {}, "lm_head": {}}
    print(f"\n20 x [M,{HIDDEN}]x[{HIDDEN},{INTER}] in one graph, and the LM head [M,{HIDDEN}]x[{VOCAB},{HIDDEN}]^T "
          "(median ms, min in brackets)")
    print(f"{'M':>4s} | " + " | ".join(f"{n + ' 20x':>22s}" for n in cells) + " | "
          + " | ".join(f"{n + ' head':>22s}" for n in cells))
    for m in ROWS:
        x = Tensor(rng.standard_normal((m, HIDDEN)).astype(np.float32))
        lin = timed({n: (lambda f=c[0]: f(x)[-1].asnumpy()) for n, c in cells.items()}, reps)
        head = timed({n: (lambda f=c[1]: f(x).asnumpy()) for n, c in cells.items()}, reps)
        out["linear20"][m] = {n: round(v[0], 3) for n, v in lin.items()}
        out["lm_head"][m] = {n: round(v[0], 3) for n, v in head.items()}
        print(f"{m:4d} | " + " | ".join(f"{v[0]:12.2f} [{v[1]:7.2f}]" for v in lin.values()) + " | "
              + " | ".join(f"{v[0]:12.2f} [{v[1]:7.2f}]" for v in head.values()))
    return out


def chain_forward(teacher, ids, start):
    from mindspore_eagle.tree import ForwardInputs, TreeLayout

    bucket = teacher.runtime.buckets.fit(len(ids))
    return teacher.forward(ForwardInputs.for_tree(TreeLayout.chain(list(ids)), start, bucket, teacher.max_len))


def load_teachers(model_dir: str) -> dict:
    from mindspore_eagle.config import RuntimeConfig
    from mindspore_eagle.teacher import Teacher

    runtime = RuntimeConfig(max_cache_len=512, buckets=TOKENS, prefill_chunk=64)
    return {name: Teacher.load(model_dir, runtime, matmul=choice) for name, choice in choices().items()}


def bench_teacher(teachers: dict, reps: int, prefix: np.ndarray) -> dict:
    for teacher in teachers.values():
        for off in range(0, PREFIX, 64):
            chain_forward(teacher, prefix[off:off + 64], off)
    out = {}
    print(f"\nteacher forward of T tokens after a {PREFIX}-token prefix (median ms, min in brackets; ratio to T=1)")
    print(f"{'T':>4s} | " + " | ".join(f"{n:>28s}" for n in teachers))
    base = {}
    rng = np.random.default_rng(1)
    for t in TOKENS:
        ids = rng.integers(0, VOCAB, t)
        res = timed({n: (lambda tt=te: chain_forward(tt, ids, PREFIX)) for n, te in teachers.items()}, reps)
        if t == 1:
            base = {n: v[0] for n, v in res.items()}
        out[t] = {n: round(v[0], 2) for n, v in res.items()}
        print(f"{t:4d} | " + " | ".join(f"{v[0]:9.2f} [{v[1]:7.2f}] {v[0] / base[n]:5.2f}x" for n, v in res.items()))
    out["ratio_to_decode"] = {t: {n: round(out[t][n] / base[n], 3) for n in teachers} for t in TOKENS}
    out["linear_share"] = linear_share(teachers, reps)
    return out


def linear_share(teachers: dict, reps: int) -> dict:
    """Per custom teacher and T: median forward ms and the ms spent inside the kernels' entry points (their own
    wall clock, MseKernelStats), i.e. where a forward's time goes: linears vs everything MindSpore runs."""
    import ctypes

    from mindspore_eagle.kernels.build import load

    lib = ctypes.CDLL(load().library.path)
    lib.MseKernelStats.restype = ctypes.c_int64
    sec = ctypes.c_double()
    out = {}
    print("\nwhere a custom teacher's forward goes (median over reps): total ms = linear kernels + the rest")
    rng = np.random.default_rng(5)
    for t in TOKENS:
        ids = rng.integers(0, VOCAB, t)
        for name, teacher in teachers.items():
            if name == "mindspore":
                continue
            pairs = []
            for _ in range(reps):
                lib.MseKernelStats(ctypes.byref(sec), 1)
                start = time.perf_counter()
                chain_forward(teacher, ids, PREFIX)
                total = (time.perf_counter() - start) * 1e3
                calls = lib.MseKernelStats(ctypes.byref(sec), 1)
                pairs.append((total, sec.value * 1e3))
            total, lin = sorted(pairs)[len(pairs) // 2]
            out.setdefault(t, {})[name] = {"forward_ms": round(total, 2), "linear_ms": round(lin, 2), "calls": calls}
            print(f"  T={t:3d} {name:12s} {total:8.2f} ms = {lin:7.2f} linear ({calls} calls) + {total - lin:7.2f} rest")
    return out


def teacher_invariance(teachers: dict, prefix: np.ndarray) -> dict:
    """Row i of a T=16 chained forward vs the i-th of 16 T=1 decodes (same tokens, same rows)."""
    ids = np.random.default_rng(2).integers(0, VOCAB, 16)
    out = {}
    print("\nteacher logits, one T=16 forward vs 16 T=1 decodes of the same tokens after the prefix:")
    for name, teacher in teachers.items():
        for off in range(0, PREFIX, 64):  # the same committed prefix for everyone
            chain_forward(teacher, prefix[off:off + 64], off)
        block = chain_forward(teacher, ids, PREFIX).logits[0]  # [16, V]
        single = np.stack([chain_forward(teacher, ids[i:i + 1], PREFIX + i).logits[0, 0] for i in range(16)])
        same = [bool(np.array_equal(block[i].view(np.uint32), single[i].view(np.uint32))) for i in range(16)]
        argmax_same = int((block.argmax(-1) == single.argmax(-1)).sum())
        diff = float(np.abs(block - single).max())
        out[name] = {"identical_rows": int(sum(same)), "row0_identical": same[0], "max_abs_diff": diff,
                     "argmax_agree": argmax_same}
        print(f"  {name:12s} bit-identical rows {sum(same):2d}/16 (row 0: {same[0]}), max |diff| {diff:.3g}, "
              f"argmax agrees {argmax_same}/16")
    return out


def part_invariance() -> dict:
    """Row 0 of a 1-row call vs a 16-row call, for each MindSpore op the teacher runs on rows."""
    import mindspore as ms
    from mindspore import Tensor, ops

    from mindspore_eagle.attention import ReferenceAttention
    from mindspore_eagle.models.layers import RMSNorm

    rng = np.random.default_rng(3)
    x16 = rng.standard_normal((16, HIDDEN)).astype(np.float32)
    w = (rng.standard_normal((HIDDEN, INTER)) * 0.04).astype(np.float32)
    matmul = ops.MatMul()

    def mm_fn(a, b):
        return matmul(a, b)

    mm = ms.jit(mm_fn)
    norm = RMSNorm(HIDDEN, 1e-5)
    fnorm = ms.jit(norm)
    att = ReferenceAttention(9, 3, 64)
    fatt = ms.jit(att)
    s = 512
    k = Tensor(rng.standard_normal((1, 3, s, 64)).astype(np.float32))
    v = Tensor(rng.standard_normal((1, 3, s, 64)).astype(np.float32))
    q16 = rng.standard_normal((1, 9, 16, 64)).astype(np.float32)
    mask16 = np.where(np.arange(s)[None, :] <= PREFIX + np.arange(16)[:, None], 0.0, -1e9).astype(np.float32)

    def row0(fn, full, one):
        a = fn(*full).asnumpy()
        b = fn(*one).asnumpy()
        return a, b

    res = {}
    a, b = row0(mm, (Tensor(x16), Tensor(w)), (Tensor(x16[:1]), Tensor(w)))
    res["mindspore_matmul"] = (a[0], b[0])
    a, b = row0(fnorm, (Tensor(x16),), (Tensor(x16[:1]),))
    res["rmsnorm"] = (a[0], b[0])
    a, b = row0(fatt, (Tensor(q16), k, v, Tensor(mask16[None, None])),
                (Tensor(q16[:, :, :1]), k, v, Tensor(mask16[None, None, :1])))
    res["attention_core"] = (a[0, :, 0], b[0, :, 0])
    out = {}
    print("\nrow 0 of a 16-row call vs a 1-row call (bit-identical?):")
    for name, (p, q) in res.items():
        same = bool(np.array_equal(p.view(np.uint32), q.view(np.uint32)))
        out[name] = {"identical": same, "max_abs_diff": float(np.abs(p - q).max())}
        print(f"  {name:18s} {same}  max |diff| {out[name]['max_abs_diff']:.3g}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--skip-teacher", action="store_true")
    ap.add_argument("--skip-micro", action="store_true")
    args = ap.parse_args()

    import mindspore as ms

    from mindspore_eagle.kernels import kernel_status

    ms.set_device("CPU")
    for dtype in ("float32", "bfloat16"):
        st = kernel_status(dtype)
        if st.library is None:
            raise SystemExit(f"custom {dtype} kernel unavailable: {st.reason}")
    from mindspore_eagle.kernels.build import load

    import ctypes

    threads = ctypes.CDLL(load().library.path).MseKernelThreads()
    print(f"custom kernel threads: {threads} (MSE_KERNEL_THREADS, default: the CPUs this process may use), os.cpu_count() = {os.cpu_count()}")
    result = {"kernel_threads": threads, "reps": args.reps}
    if not args.skip_micro:
        result.update(bench_microbench(args.reps))
    result["part_invariance"] = part_invariance()
    if not args.skip_teacher:
        from mindspore_eagle.assets import require_default_model

        teachers = load_teachers(require_default_model())
        prefix = np.random.default_rng(4).integers(0, VOCAB, PREFIX)
        result["teacher"] = bench_teacher(teachers, max(5, args.reps // 2), prefix)
        result["teacher_invariance"] = teacher_invariance(teachers, prefix)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
