"""Attention-mask conventions, kept in one module.

Three conventions meet in this project:

* **boolean visibility** ``visible[i, j] == True`` means query row ``i`` may attend to key column ``j``;
* **additive float32** (what our attention adds to the scores): ``0.0`` where visible, ``MASK_VALUE`` where
  hidden. ``MASK_VALUE`` is a large finite negative number rather than ``-inf`` so that a padding row that
  sees nothing produces a uniform softmax instead of NaN;
* **Ascend fused-attention uint8**: ``1`` means *masked out*, ``0`` means visible (the opposite sense of
  the boolean form), as the fused attention ops require.

A forward reads the cache rows ``[0, cache_len)`` -- the whole static cache, or a context bucket holding every
row it writes or sees (``Teacher.mask_width``) -- so its mask is ``[B, 1, T, cache_len]``: columns the row may not
see (later rows, stale speculative rows, unused rows) are hidden.

Tree masks (host builders below): tree node ``i`` is written at cache row ``committed_len + i`` and sees the
committed prefix ``[0, committed_len)`` plus exactly its ancestors-or-self (for a chain, that is the causal mask). A padding row sees the prefix and itself only, and no real row sees it,
so padding cannot change a real node's output and no row is ever fully masked.
"""

import numpy as np

from mindspore_eagle.errors import CacheCapacityError, ConfigError
from mindspore_eagle.tree.layout import TreeLayout

MASK_VALUE = np.float32(-1e9)


def additive_from_bool(visible: np.ndarray) -> np.ndarray:
    """Boolean visibility -> additive float32 mask (0 visible, MASK_VALUE hidden)."""
    return np.where(visible, np.float32(0.0), MASK_VALUE).astype(np.float32)


def ascend_uint8_from_bool(visible: np.ndarray) -> np.ndarray:
    """Boolean visibility -> Ascend fused-attention mask (uint8, 1 = masked out)."""
    return np.logical_not(visible).astype(np.uint8)


# ----- tree masks ----------------------------------------------------------------------------------------


def tree_visibility(layout: TreeLayout) -> np.ndarray:
    """bool ``[N, N]``: ``vis[i, j]`` iff j is an ancestor-or-self of i and both are real, or ``i == j``.

    The diagonal is always True, so a padding row sees itself only; a real row never sees a padding row.
    Example (parents [0, 0, 0, 1], all real):
        [[1 0 0 0],
         [1 1 0 0],
         [1 0 1 0],
         [1 1 0 1]]
    Built from ``ancestor_table``: row i sets the columns listed in its table row. Pad entries of the table
    are the root, which is already an ancestor of every real row, so setting them again changes nothing.
    """
    n = layout.num_nodes
    if n == 1:  # the root alone (a real node by check_tree): sees itself
        return np.ones((1, 1), np.bool_)
    table = layout.ancestor_table()  # [N, D]
    vis = np.zeros((n, n), dtype=np.bool_)
    vis[np.arange(n)[:, None], table] = True
    vis &= layout.valid[:, None] & layout.valid[None, :]
    vis[np.arange(n), np.arange(n)] = True
    return vis


def tree_attention_visibility(layout: TreeLayout, committed_len: int, cache_len: int) -> np.ndarray:
    """bool ``[N, cache_len]``: row i sees columns ``[0, committed_len)`` and ``committed_len + j`` iff ``vis[i, j]``.

    Every other column (stale speculative rows, unused cache rows) is hidden. Example: parents [0, 0],
    committed_len 2, cache_len 5 ->
        [[1 1 1 0 0],
         [1 1 1 1 0]]
    Raises CacheCapacityError if the tree does not fit: ``committed_len + N > cache_len``.
    """
    n = layout.num_nodes
    if committed_len < 0:
        raise ConfigError(f"committed_len={committed_len}: must be >= 0")
    if committed_len + n > cache_len:
        raise CacheCapacityError(
            f"tree of {n} rows at committed_len={committed_len} needs {committed_len + n} cache rows, "
            f"cache_len={cache_len}"
        )
    vis = np.zeros((n, cache_len), dtype=np.bool_)
    vis[:, :committed_len] = True
    vis[:, committed_len : committed_len + n] = tree_visibility(layout)
    return vis


def tree_attention_mask(layout: TreeLayout, committed_len: int, cache_len: int) -> np.ndarray:
    """Additive float32 ``[1, 1, N, cache_len]`` over the whole static cache: what the teacher consumes."""
    return additive_from_bool(tree_attention_visibility(layout, committed_len, cache_len))[None, None]


def ascend_tree_mask(layout: TreeLayout, committed_len: int, cache_len: int) -> np.ndarray:
    """uint8 ``[1, 1, N, cache_len]`` in Ascend fused-attention convention (1 = masked out)."""
    return ascend_uint8_from_bool(tree_attention_visibility(layout, committed_len, cache_len))[None, None]
