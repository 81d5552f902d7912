"""Tree masks built inside a graph from the parent tensor, with static shapes.

The host builders in ``mask.py`` are the reference; these Cells compute the same masks on the device so the
performance path ships ``parents [N]`` and ``valid [N]`` instead of a ``[N, cache_len]`` float mask. Shapes
depend only on the bucket N (and cache_len), so a graph compiles once per bucket; ``committed_len`` is a
value, not a shape, and never recompiles.

Preconditions, checked on the host by ``check_tree(layout, vocab, max_depth=cell.max_depth)`` before the
call (a graph cannot raise): every parent in ``[0, N)``, ``parents[0] == 0``, no row deeper than
``max_depth``. The walk then never leaves ``[0, N)``: the root is its own parent, so once a row's walk reaches
it, it stays there.
"""

import mindspore as ms
from mindspore import nn, ops

from mindspore_eagle.errors import ConfigError
from mindspore_eagle.tree.mask import MASK_VALUE


class TreeMaskCell(nn.Cell):
    """parents int32/int64 ``[N]``, valid bool ``[N]`` -> bool ``[N, N]`` visibility (== ``mask.tree_visibility``).

    Unrolled walk up the tree: ``cur`` starts as ``[0, 1, ..., N-1]`` and each step replaces every entry by
    its parent, marking ``vis[i, cur[i]]`` through an ``equal`` one-hot (a bool ``one_hot`` is rejected).
    Example, parents [0, 0, 1]: cur [0, 1, 2] -> [0, 0, 1] -> [0, 0, 0], so row 2 marks columns 2, 1, 0.
    After ``max_depth`` steps every row has marked all its ancestors-or-self; then rows and columns of
    padding are cleared and the diagonal restored, exactly as the host builder does.
    """

    def __init__(self, max_depth: int):
        super().__init__()
        if max_depth < 1:
            raise ConfigError(f"TreeMaskCell.max_depth={max_depth}: must be >= 1 (padding rows sit at depth 1)")
        self.max_depth = max_depth

    def construct(self, parents, valid):
        n = parents.shape[0]
        parents = ops.cast(parents, ms.int64)
        idx = ops.arange(n, dtype=ms.int64)
        cols = idx.reshape(1, n)
        eye = ops.equal(idx.reshape(n, 1), cols)  # [N, N]
        vis = eye
        cur = idx
        for _ in range(self.max_depth):
            cur = ops.gather(parents, cur, 0)  # [N] next ancestor of every row
            vis = ops.logical_or(vis, ops.equal(cur.reshape(n, 1), cols))
        both_real = ops.logical_and(valid.reshape(n, 1), valid.reshape(1, n))
        return ops.logical_or(ops.logical_and(vis, both_real), eye)


class TreeAttentionMaskCell(nn.Cell):
    """parents ``[N]``, valid ``[N]``, committed_len int64 scalar -> mask ``[1, 1, N, cache_len]``.

    Same as ``mask.tree_attention_mask`` (additive float32) or, with ``ascend=True``, ``mask.ascend_tree_mask``
    (uint8, 1 = masked out). Column c maps to tree column ``j = c - committed_len``; ``j`` is clamped into
    ``[0, N)`` before the gather so no index is ever negative, and the clamped columns are then hidden by the
    ``0 <= j < N`` test. Example, N=2, committed_len=3, cache_len=6: j = [-3 -2 -1 0 1 2] -> gather columns
    [0 0 0 0 1 1], keep only c = 3, 4. The caller guarantees ``committed_len + N <= cache_len``.
    """

    def __init__(self, max_depth: int, cache_len: int, ascend: bool = False):
        super().__init__()
        self.tree = TreeMaskCell(max_depth)
        self.cache_len = cache_len
        self.ascend = ascend

    def construct(self, parents, valid, committed_len):
        n = parents.shape[0]
        vis = self.tree(parents, valid)  # [N, N]
        col = ops.arange(self.cache_len, dtype=ms.int64)  # [C]
        start = ops.cast(committed_len, ms.int64)
        j = col - start  # [C] tree column of each cache column (negative = prefix)
        in_tree = ops.logical_and(j >= 0, j < n)
        j_safe = ops.minimum(ops.maximum(j, 0), n - 1)
        tree_part = ops.logical_and(ops.gather(vis, j_safe, 1), in_tree.reshape(1, -1))  # [N, C]
        visible = ops.logical_or(tree_part, (col < start).reshape(1, -1))
        visible = visible.reshape(1, 1, n, self.cache_len)
        if self.ascend:
            return ops.cast(ops.logical_not(visible), ms.uint8)
        return ops.select(visible, ops.zeros_like(visible, dtype=ms.float32),
                          ops.full_like(visible, float(MASK_VALUE), dtype=ms.float32))
