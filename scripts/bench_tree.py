"""Host cost, in microseconds, of building and checking a 64-node speculative tree (and of its masks).

The checks run every step in reference mode and once per step in performance mode, so their cost must stay
small next to a teacher forward (~30-150 ms on CPU). Prints the median over many repetitions.

    GLOG_v=3 .venv/bin/python scripts/bench_tree.py
"""

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mindspore_eagle.config import Buckets  # noqa: E402
from mindspore_eagle.tree import ForwardInputs, TreeLayout, check_tree, tree_attention_mask, tree_visibility  # noqa: E402

VOCAB = 32000
LEVEL_SIZES = (8, 10, 10, 10, 10, 10, 5)  # 1 root + 63 drafts = 64 nodes, depth 7
CACHE_LEN = 2048


def grown_tree(seed=0):
    """Tokens and parents shaped like tree growth: each level's parents are on the previous level."""
    rng = np.random.default_rng(seed)
    tokens, parents, first, prev_size = [7], [0], 0, 1  # first = index of the previous level's first node
    for size in LEVEL_SIZES:
        parents += (first + rng.integers(0, prev_size, size)).tolist()
        tokens += rng.integers(0, VOCAB, size).tolist()
        first, prev_size = first + prev_size, size
    return tokens, parents


def median_us(fn, repeats=2000):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1000.0


def main():
    tokens, parents = grown_tree()
    layout = TreeLayout.from_parents(tokens, parents)
    assert layout.num_nodes == 64
    check_tree(layout, VOCAB)
    buckets = Buckets((1, 8, 16, 32, 64))
    padded = layout.padded(buckets.fit(layout.num_nodes))

    def build_check_inputs():
        lay = TreeLayout.from_parents(tokens, parents)
        check_tree(lay, VOCAB)
        return ForwardInputs.for_tree(lay, 1000, buckets.fit(lay.num_nodes), CACHE_LEN)

    rows = [
        ("build (from_parents)", lambda: TreeLayout.from_parents(tokens, parents)),
        ("check_tree", lambda: check_tree(layout, VOCAB)),
        (f"build + check + ForwardInputs ({CACHE_LEN})", build_check_inputs),
        ("ancestor_table", padded.ancestor_table),
        ("tree_visibility [64, 64]", lambda: tree_visibility(padded)),
        (f"tree_attention_mask [1, 1, 64, {CACHE_LEN}]", lambda: tree_attention_mask(padded, 1000, CACHE_LEN)),
    ]
    print(f"64-node tree (depth {layout.max_depth}), median host time over 2000 runs:")
    for name, fn in rows:
        print(f"  {name:<38s} {median_us(fn):8.1f} us")


if __name__ == "__main__":
    main()
