"""Time of committing the accepted path of a 64-node tree (all layers, and one layer) next to one teacher
decode step, on the default teacher's shape (SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64), cache 1024.

Timings do not depend on weight values, so without ``--model-dir`` the teacher is built from the SmolLM2
shape with random weights. Each figure is the median (and min) of ``--repeats`` runs after a warm-up
(compile) call; graph calls on CPU return when their kernels are done, so wall time includes the device work.
Last stdout line: one JSON object.

Cost model, measured: on CPU, ``ScatterNdUpdate`` updates the buffer in place and then copies the *whole*
buffer to its output, so a commit costs ~2 x layers x buffer bytes of memcpy (O(max_len), not O(rows moved));
the teacher's own K/V write pays the same per forward. ``--max-len`` shows the scaling.

    GLOG_v=3 .venv/bin/python scripts/bench_commit.py [--model-dir DIR] [--repeats 50] [--prefix 512] [--max-len 1024]
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

from mindspore_eagle.cache import BranchableKVCache, CommitMode  # noqa: E402
from mindspore_eagle.config import RuntimeConfig, TeacherConfig  # noqa: E402
from mindspore_eagle.teacher import Teacher  # noqa: E402
from mindspore_eagle.tree import TreeLayout, check_tree  # noqa: E402
from mindspore_eagle.tree.mask import causal_mask  # noqa: E402

SMOLLM2_135M = TeacherConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                             num_kv_heads=3, rms_norm_eps=1e-5, rope_theta=100000, tie_word_embeddings=True,
                             max_position_embeddings=8192)
LEVEL_SIZES = (8, 10, 10, 10, 10, 10, 5)  # 1 root + 63 drafts = 64 nodes, depth 7 (as scripts/bench_tree.py)


def tree_64(vocab: int, seed: int = 0) -> TreeLayout:
    rng = np.random.default_rng(seed)
    levels, first, prev = [], 0, 1
    for size in LEVEL_SIZES:
        levels.append((rng.integers(0, vocab, size), first + rng.integers(0, prev, size)))
        first, prev = first + prev, size
    layout = TreeLayout.from_levels(7, levels)
    check_tree(layout, vocab)
    return layout


def timed_ms(fn, repeats: int) -> tuple[float, float]:
    """(median, min) wall milliseconds of ``fn()`` over ``repeats`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3


def random_teacher(runtime: RuntimeConfig) -> Teacher:
    import mindspore as ms

    teacher = Teacher(SMOLLM2_135M, runtime)
    rng = np.random.default_rng(0)
    for p in teacher.cell.weight_parameters().values():
        p.set_data(ms.Tensor((rng.standard_normal(p.shape, dtype=np.float32) * 0.02).astype(np.float32)))
    return teacher


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", help="converted teacher directory (default: random SmolLM2-135M-shaped teacher)")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--prefix", type=int, default=512, help="committed length L during the measurements")
    ap.add_argument("--max-len", type=int, default=1024, help="max_cache_len of the teacher")
    args = ap.parse_args()

    runtime = RuntimeConfig(max_cache_len=args.max_len, buckets=(1, 64), prefill_chunk=64)
    teacher = Teacher.load(args.model_dir, runtime) if args.model_dir else random_teacher(runtime)
    cfg, L = teacher.cfg, args.prefix
    cache = BranchableKVCache.for_teacher(teacher)
    one_layer = BranchableKVCache(cache.pairs[:1])

    layout = tree_64(cfg.vocab_size)
    deepest = int(np.argmax(layout.depth))
    path = layout.path_to(deepest)[:layout.path_length(deepest)]  # root + 7 drafts
    full_map = np.arange(L + 64)
    full_map[L + 1:] = full_map[L + 1:][::-1]  # worst case: all 63 non-root rows of the bucket move (P=64)

    def at_L(c):
        c.reset()
        c.begin_round(L)
        c.commit(np.arange(L), CommitMode.LENGTH)

    def commit(c):
        def run():
            c.begin_round(64)
            c.commit(path, CommitMode.PATH_INDEX, layout.parents)
            c.rollback(L)
        return run

    def commit_length(c):
        def run():
            c.begin_round(64)
            c.commit(np.arange(path.size), CommitMode.LENGTH)
            c.rollback(L)
        return run

    at_L(cache)
    at_L(one_layer)
    results = {
        "teacher": args.model_dir or "random SmolLM2-135M shape",
        "layers": cfg.num_layers, "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "max_cache_len": runtime.max_cache_len, "committed_len": L,
        "tree_nodes": layout.num_nodes, "path": path.tolist(),
        "rows_moved": int(np.count_nonzero(path != np.arange(path.size))),
    }

    def record(name, fn, repeats=args.repeats):
        results[name + "_ms"], results[name + "_min_ms"] = timed_ms(fn, repeats)

    record("path_index_commit_all_layers", commit(cache))
    record("path_index_commit_one_layer", commit(one_layer))
    results["path_index_commit_per_layer_ms"] = results["path_index_commit_all_layers_ms"] / cfg.num_layers
    record("length_commit_all_layers", commit_length(cache))
    record("reorder_64_rows_all_layers", lambda: cache.reorder(full_map))
    pos = np.array([[L]])
    mask = causal_mask(L, 1, runtime.max_cache_len)
    record("teacher_decode_step", lambda: teacher.forward(np.array([[7]]), pos, pos, mask, 1),
           max(5, args.repeats // 3))
    results["commit_over_decode"] = results["path_index_commit_all_layers_ms"] / results["teacher_decode_step_ms"]

    width = max(len(k) for k in results)
    for k, v in results.items():
        print(f"{k:<{width}}  {v:.3f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
