"""TreeLayout: the one host-side description of a speculative tree, safe to index on any device.

Every index a layout holds or produces is non-negative and in range by construction: "no parent" is the
dummy root (``ROOT == 0``, its own parent), padding rows hang off the root, and unused slots of ancestor
tables and paths hold ``PAD_SLOT`` (also ``0``) instead of ``-1``. Nothing relies on negative-index
wrap-around, which Ascend gather/scatter kernels leave undefined. Terms are defined in
``mindspore_eagle.tree``'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mindspore_eagle.errors import ConfigError, TreeInvariantError

ROOT = 0
"""Index of the dummy root. ``parents[ROOT] == ROOT``: the root is its own parent, so walking up never leaves
``[0, N)``."""

PAD_SLOT = ROOT
"""Index that fills every unused entry of an ancestor table or a root-to-node path.

It is the root's index on purpose: every layout has a root, so a gather through a pad entry reads real, finite
data and stays in range, whatever the bucket. A pad entry is told apart from the real root entry by position,
never by value: entries ``k > depth[node]`` (equivalently ``k >= path_length(node)``) are pad and are masked
out by ``path_mask`` / the depth comparison. Never ``-1``.
"""

PAD_TOKEN = 0
"""Token id written into padding rows (any in-vocabulary id would do; it is never seen by a real node)."""

PAD_DEPTH = 1
"""Depth of a padding row: a padding row is shaped like a leaf child of the root (parent ``ROOT``), so the
parent/depth rules hold for every row without special cases. It is inert because ``valid`` is False."""

def _frozen_array(values, dtype, field: str) -> np.ndarray:
    """Copy ``values`` into a read-only 1-D array of ``dtype``; refuse floats and non-bool masks."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise TreeInvariantError(f"TreeLayout.{field}: must be 1-D, got shape {arr.shape} (rule: shape)")
    if dtype is np.bool_:
        if arr.dtype != np.bool_:
            raise TreeInvariantError(f"TreeLayout.{field}: must be bool, got {arr.dtype} (rule: dtype)")
    elif arr.size and arr.dtype.kind not in "iu":
        raise TreeInvariantError(f"TreeLayout.{field}: must be integer, got {arr.dtype} (rule: dtype)")
    out = np.array(arr, dtype=dtype)  # always a private copy, so freezing it cannot affect the caller
    out.setflags(write=False)
    return out


def compute_depth(parents: np.ndarray) -> np.ndarray:
    """Depth of every node of a topologically ordered parent array (``0 <= parents[i] < i`` for ``i > 0``).

    Raises TreeInvariantError, naming the node, when a parent is out of ``[0, i)`` (or the root is not its
    own parent): depth is only defined on a tree. Example: parents [0, 0, 1, 1] -> depth [0, 1, 2, 2].
    """
    p = parents.tolist()
    n = len(p)
    if n == 0:
        raise TreeInvariantError("empty parent list: a tree has at least the root (rule: root)")
    if p[0] != ROOT:
        raise TreeInvariantError(f"node 0: root parent is {p[0]}, must be 0 (rule: root)")
    depth = [0] * n
    for i in range(1, n):
        if not 0 <= p[i] < i:
            raise TreeInvariantError(
                f"node {i}: parent {p[i]} not in [0, {i}) (rule: topological order, no negative index)"
            )
        depth[i] = depth[p[i]] + 1
    return np.asarray(depth, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class TreeLayout:
    """A speculative tree in topological order, with a dummy root at index 0 and optional padding rows.

    Invariants (checked by ``check_tree``, not here, so that corrupted layouts can be built and rejected):
      * ``parents[0] == 0``, ``depth[0] == 0``, ``valid[0]``; the root's token is the last accepted token
        that is not yet in the KV cache;
      * real node ``i > 0``: ``0 <= parents[i] < i`` (parents come first, so no cycle is possible),
        ``depth[i] == depth[parents[i]] + 1``, and its parent is real;
      * padding rows (``valid == False``) come after every real node, with parent ``ROOT`` and depth
        ``PAD_DEPTH`` (``padded`` writes token ``PAD_TOKEN``); no real node ever sees them;
      * no field holds a negative number.
    Arrays are private read-only copies; the dataclass compares by identity (``eq=False``) because ``==``
    on arrays is elementwise.
    """

    tokens: np.ndarray  # int64 [N]  token id of each node (the root's is the last accepted token)
    parents: np.ndarray  # int64 [N]  parent index; parents[0] == 0
    depth: np.ndarray  # int64 [N]  edges from the root; depth[0] == 0
    valid: np.ndarray  # bool  [N]  False for padding rows

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", _frozen_array(self.tokens, np.int64, "tokens"))
        object.__setattr__(self, "parents", _frozen_array(self.parents, np.int64, "parents"))
        object.__setattr__(self, "depth", _frozen_array(self.depth, np.int64, "depth"))
        object.__setattr__(self, "valid", _frozen_array(self.valid, np.bool_, "valid"))
        sizes = {f: getattr(self, f).shape[0] for f in ("tokens", "parents", "depth", "valid")}
        if len(set(sizes.values())) != 1 or sizes["tokens"] == 0:
            raise TreeInvariantError(f"TreeLayout field lengths {sizes}: must be equal and >= 1 (rule: shape)")

    # ----- constructors -------------------------------------------------------------------------------

    @classmethod
    def from_parents(cls, tokens: Sequence[int], parents: Sequence[int]) -> "TreeLayout":
        """All-real layout from a parent list (node 0 = root, its token the last accepted token); depth computed.

        Example: tokens [7, 3, 9, 4], parents [0, 0, 0, 1] -> root 7 with children 3 and 9; 4 under 3.
        """
        tokens_arr = np.asarray(tokens)
        parents_arr = np.asarray(parents)
        if tokens_arr.shape != parents_arr.shape or parents_arr.ndim != 1:
            raise TreeInvariantError(
                f"tokens shape {tokens_arr.shape}, parents shape {parents_arr.shape}: "
                "must be equal and 1-D (rule: shape)"
            )
        depth = compute_depth(parents_arr)
        return cls(tokens_arr, parents_arr, depth, np.ones(depth.shape[0], dtype=np.bool_))

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> "TreeLayout":
        """A path: node i's parent is node i - 1. A prefill chunk or a draft context chunk is this tree, so it is
        padded, masked (causally) and positioned by the same rules as a verification tree.

        Example: tokens [4, 8, 6] -> parents [0, 0, 1], depth [0, 1, 2] (positions L, L+1, L+2).
        """
        n = len(tokens)
        return cls.from_parents(tokens, np.maximum(np.arange(n, dtype=np.int64) - 1, 0))

    @classmethod
    def single(cls, root_token: int) -> "TreeLayout":
        """The one-node tree: the greedy baseline runs the same loop with it."""
        return cls.from_parents([root_token], [ROOT])

    # ----- sizes --------------------------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        """N, padding rows included (the static row count a graph sees)."""
        return int(self.tokens.shape[0])

    @property
    def num_valid(self) -> int:
        """Number of real nodes (root included); they are rows ``0 .. num_valid - 1``."""
        return int(np.count_nonzero(self.valid))

    @property
    def max_depth(self) -> int:
        """Largest depth of any row; padding rows count as ``PAD_DEPTH`` so their table rows fit too."""
        return int(self.depth.max())

    # ----- padding ------------------------------------------------------------------------------------

    def padded(self, bucket: int) -> "TreeLayout":
        """This layout with ``bucket - N`` padding rows appended, so graph mode sees a fixed row count.

        Real rows keep their index, so every real node's parent, depth, ancestor row, mask row and cache row
        are unchanged. Raises ConfigError if the layout does not fit.
        """
        n = self.num_nodes
        if bucket < n:
            raise ConfigError(f"bucket={bucket}: smaller than the tree's {n} nodes")
        extra = bucket - n
        if extra == 0:
            return self
        return TreeLayout(
            np.concatenate([self.tokens, np.full(extra, PAD_TOKEN, dtype=np.int64)]),
            np.concatenate([self.parents, np.full(extra, ROOT, dtype=np.int64)]),
            np.concatenate([self.depth, np.full(extra, PAD_DEPTH, dtype=np.int64)]),
            np.concatenate([self.valid, np.zeros(extra, dtype=np.bool_)]),
        )

    # ----- derived index tensors ----------------------------------------------------------------------

    def _num_levels(self, num_levels: int | None) -> int:
        needed = self.max_depth + 1
        if num_levels is None:
            return needed
        if num_levels < needed:
            raise ConfigError(f"num_levels={num_levels}: the tree needs {needed} (max depth {self.max_depth} + 1)")
        return num_levels

    def ancestor_table(self, num_levels: int | None = None) -> np.ndarray:
        """int64 ``[N, D]``: row i lists i's ancestors-or-self from the root (column 0) down to i (column depth[i]).

        ``D = max_depth + 1`` unless ``num_levels`` (>= that) fixes it for a static shape. Entries past a
        node's depth are ``PAD_SLOT`` (the root), never ``-1``. Example: parents [0, 0, 1], D=3 ->
            [[0, 0, 0],
             [0, 1, 0],
             [0, 1, 2]]
        Built from ``up[k, i]``, the k-th ancestor of i: column c of row i is ``up[depth[i] - c, i]`` when
        ``c <= depth[i]``, else ``PAD_SLOT``. O(N * D).
        """
        n = self.num_nodes
        d = self._num_levels(num_levels)
        up = np.empty((self.max_depth + 1, n), dtype=np.int64)  # up[k, i] = k-th ancestor of i (root absorbs)
        up[0] = np.arange(n)
        for k in range(1, self.max_depth + 1):
            up[k] = self.parents[up[k - 1]]
        steps = self.depth[:, None] - np.arange(d)[None, :]  # [N, D] how far column c is above row i
        inside = steps >= 0
        table = up[np.where(inside, steps, 0), np.arange(n)[:, None]]  # [N, D]
        return np.where(inside, table, np.int64(PAD_SLOT))

    def positions(self, committed_len: int) -> np.ndarray:
        """int64 ``[N]`` RoPE positions: ``committed_len + depth``.

        ``committed_len`` is the number of tokens already in the KV cache. The root (last accepted token, not
        yet cached) is written at cache row ``committed_len`` with position ``committed_len``; node i is
        written at cache row ``committed_len + i`` with position ``committed_len + depth[i]``: siblings share a
        position because each one continues the same prefix. Padding rows get ``committed_len + PAD_DEPTH``.
        """
        if committed_len < 0:
            raise ConfigError(f"committed_len={committed_len}: must be >= 0")
        return self.depth + np.int64(committed_len)
