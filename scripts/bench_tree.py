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

from mindspore_eagle.tree import (  # noqa: E402
    TreeLayout,
    check_tree,
    choose_bucket,
    tree_attention_mask,
    tree_visibility,
)

VOCAB = 32000
LEVEL_SIZES = (8, 10, 10, 10, 10, 10, 5)  # 1 root + 63 drafts = 64 nodes, depth 7
CACHE_LEN = 2048


def grown_levels(seed=0):
    """Per-level output shaped like tree growth: each level's parents are on the previous level."""
    rng = np.random.default_rng(seed)
    levels, first, prev_size = [], 0, 1  # first = global index of the previous level's first node
    for size in LEVEL_SIZES:
        parents = first + rng.integers(0, prev_size, size)
        levels.append((rng.integers(0, VOCAB, size), parents))
        first, prev_size = first + prev_size, size
    return levels


def median_us(fn, repeats=2000):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1000.0


def main():
    levels = grown_levels()
    layout = TreeLayout.from_levels(7, levels)
    assert layout.num_nodes == 64
    check_tree(layout, VOCAB)
    padded = layout.padded(choose_bucket(layout.num_nodes))

    def build_and_check():
        lay = TreeLayout.from_levels(7, levels)
        check_tree(lay, VOCAB, max_depth=12)
        return lay.padded(choose_bucket(lay.num_nodes))

    rows = [
        ("build (from_levels)", lambda: TreeLayout.from_levels(7, levels)),
        ("check_tree", lambda: check_tree(layout, VOCAB, max_depth=12)),
        ("build + check + pad", build_and_check),
        ("ancestor_table", padded.ancestor_table),
        ("tree_visibility [64, 64]", lambda: tree_visibility(padded)),
        (f"tree_attention_mask [1, 1, 64, {CACHE_LEN}]", lambda: tree_attention_mask(padded, 1000, CACHE_LEN)),
    ]
    print(f"64-node tree (depth {layout.max_depth}), median host time over 2000 runs:")
    for name, fn in rows:
        print(f"  {name:<38s} {median_us(fn):8.1f} us")


if __name__ == "__main__":
    main()
