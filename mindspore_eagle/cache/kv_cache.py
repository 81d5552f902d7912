"""Branchable KV cache: speculative tree rounds on static buffers, and committing the accepted path.

Design note
-----------
Layout. Every attention layer owns two static Parameter buffers ``[B, Hkv, max_len, D]`` (K and V); this
module never allocates or copies them, it only holds them (``(k, v)`` pairs, the teacher's or the draft
head's) and a host-side ``CacheState``. Rows ``[0, L)`` hold the committed sequence, ``L = committed_len``.

Which rows are written when:
  * a round (prefill chunk, decode step or speculative tree) is first reserved with ``begin_round(bucket)``,
    which refuses with ``CacheCapacityError`` *before* anything is written when ``L + bucket > max_len``;
  * the forward then writes rows ``[L, L + bucket)`` only: tree node ``i`` (node 0 = the root, the last
    accepted token) at row ``L + i``, padding after the real nodes. Rows below L are never a write target;
  * ``commit(path)`` copies rows ``L + path[i]`` to ``L + i`` for the out-of-place suffix of the path only
    (``path_moves``), all layers in one graph, then ``L += k + 1``; rows below L are untouched. A chain path
    ``[0, 1, ..., k]`` (a prefill chunk, a decode step, a chain-shaped acceptance) is already in place and
    moves nothing: the commit is then only ``L += k + 1``;
  * ``abort_round()``, ``rollback(L')`` and ``reset()`` write nothing: rows ``>= L'`` become stale, hidden
    by every mask and overwritten by the next round.

Why this layout. Branches share the committed prefix physically: a tree node reads the prefix plus its own
ancestors through the tree attention mask (``tree.tree_attention_mask``) and never a sibling's row, so
isolation holds by construction, and there is no per-branch copy of the prefix (hence no branch clone here:
the cheapest clone is none). A round costs one bucket of rows; the commit costs O(path length) rows, not
O(L); and every shape is static (bucket, move-list bucket P), so graph mode compiles a handful of graphs
once. The accepted path ends up contiguous, which is what the next round's mask and positions assume.

Batch: one committed length for all ``B`` sequences, and ``commit`` applies the same path to each;
``PathCommit`` itself takes per-sequence rows, so per-sequence acceptance only needs per-sequence states.

The draft head reuses the protocol unchanged: ``BranchableKVCache(draft_cell.cache_parameters())`` with its
own ``CacheState`` (its committed length may differ from the teacher's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from mindspore import Parameter, Tensor

from ..runtime import ExecMode
from ..errors import CacheCapacityError, ConfigError
from .commit import PathCommit, check_path, pad_moves, path_moves


def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{what}={value!r}: must be an integer >= 1")
    return int(value)


@dataclass
class CacheState:
    """Host-side bookkeeping of one cache's rows (no tensors).

    Invariants:
      * ``0 <= committed_len <= max_len``; rows ``[0, committed_len)`` hold the committed sequence;
      * ``committed_len`` only grows (``advance``), except through ``rollback`` and ``reset``;
      * while a round is open (``round_bucket`` is not None), ``committed_len + round_bucket <= max_len``
        and the round may write rows ``[committed_len, committed_len + round_bucket)`` only.
    Every method checks before it changes anything: a refused call leaves the state as it was.
    """

    max_len: int
    committed_len: int = 0
    round_bucket: int | None = None  # rows reserved by the open round, None when no round is open

    def __post_init__(self) -> None:
        _positive_int(self.max_len, "CacheState.max_len")
        if not 0 <= self.committed_len <= self.max_len:
            raise ConfigError(f"CacheState.committed_len={self.committed_len}: must be in [0, {self.max_len}]")

    @property
    def free_rows(self) -> int:
        return self.max_len - self.committed_len

    def reserve(self, bucket: int) -> int:
        """Open a round writing rows ``[L, L + bucket)``; return L. CacheCapacityError if they do not fit."""
        bucket = _positive_int(bucket, "bucket")
        if self.committed_len + bucket > self.max_len:
            raise CacheCapacityError(f"a round of {bucket} rows at committed_len={self.committed_len} needs "
                                     f"{self.committed_len + bucket} cache rows, max_len={self.max_len}")
        self.round_bucket = bucket
        return self.committed_len

    def advance(self, k: int) -> int:
        """Commit the first ``k`` rows of the open round (``0 <= k <= round_bucket``); close it; return new L."""
        if self.round_bucket is None:
            raise ConfigError("advance without an open round: call reserve(bucket) before writing rows")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= self.round_bucket:
            raise ConfigError(f"advance({k!r}): the open round wrote {self.round_bucket} rows")
        self.committed_len += int(k)
        self.round_bucket = None
        return self.committed_len

    def abort(self) -> None:
        """Close the open round (if any) committing nothing: its rows become stale and are never visible."""
        self.round_bucket = None

    def rollback(self, committed_len: int) -> int:
        """Return to an earlier committed length (``0 <= committed_len <= current``); close any open round."""
        if isinstance(committed_len, bool) or not isinstance(committed_len, (int, np.integer)):
            raise ConfigError(f"rollback({committed_len!r}): committed length must be an integer")
        if not 0 <= committed_len <= self.committed_len:
            raise ConfigError(f"rollback({committed_len}): must be in [0, committed_len={self.committed_len}]; "
                              "rows past the committed length hold no committed tokens")
        self.committed_len = int(committed_len)
        self.round_bucket = None
        return self.committed_len

    def reset(self) -> None:
        """Empty the cache for a new conversation (buffers are not cleared: stale rows are never visible)."""
        self.committed_len = 0
        self.round_bucket = None


class BranchableKVCache:
    """A list of ``(k_cache, v_cache)`` buffers plus their ``CacheState``: the one owner of a model's cache rows.

    Usage per step::

        L = cache.begin_round(bucket)             # the capacity check, before any write
        teacher.forward(ForwardInputs.for_tree(layout, L, bucket, max_len))   # writes rows [L, L + bucket)
        L = cache.commit(accepted_path)           # moves only out-of-place rows; L += len(path)

    ``exec_mode`` PERFORMANCE compiles the row moves (one graph per round bucket that ever commits a move);
    REFERENCE runs the same Cell in PyNative. ``inplace``: how the rows move (``cache.commit.PathCommit``; None =
    the in-place kernel where it runs).
    """

    def __init__(self, pairs: Sequence[tuple[Parameter, Parameter]], exec_mode: ExecMode = ExecMode.PERFORMANCE,
                 inplace: bool | None = None):
        self.pairs = [tuple(pair) for pair in pairs]
        self.cell = PathCommit(self.pairs, inplace)
        self._fn = ExecMode.parse(exec_mode).compile(self.cell)
        self.state = CacheState(self.cell.max_len)

    @classmethod
    def for_teacher(cls, teacher) -> "BranchableKVCache":
        """The cache of a ``Teacher`` (all its layers), in the teacher's execution mode."""
        return cls(teacher.cell.cache_parameters(), teacher.runtime.exec_mode)

    # ----- state -------------------------------------------------------------------------------------

    @property
    def committed_len(self) -> int:
        return self.state.committed_len

    @property
    def max_len(self) -> int:
        return self.state.max_len

    @property
    def batch_size(self) -> int:
        return self.cell.batch_size

    def begin_round(self, bucket: int) -> int:
        """Reserve rows ``[L, L + bucket)`` for the next forward; return L (CacheCapacityError, nothing written)."""
        return self.state.reserve(bucket)

    def abort_round(self) -> None:
        """Discard the open round (e.g. a decode step whose row is not kept): nothing is committed or written."""
        self.state.abort()

    def rollback(self, committed_len: int) -> int:
        """Forget everything after ``committed_len`` tokens (ConfigError if it is not an earlier length)."""
        return self.state.rollback(committed_len)

    def reset(self) -> None:
        """Start a new conversation: committed length 0, no round open."""
        self.state.reset()

    def warm_up_commit(self, bucket: int) -> None:
        """Compile the row-move graph of ``bucket`` (one per tree bucket; smaller than 3 rows a path never moves a
        row): a path ``[0, 2]`` moves one row in a round that is then discarded. Leaves the cache reset."""
        self.reset()
        self.begin_round(bucket)
        self.commit([0, 2])
        self.reset()

    # ----- commit ------------------------------------------------------------------------------------

    def commit(self, path: Sequence[int], parents: Sequence[int] | None = None) -> int:
        """Make the accepted root-to-node ``path`` (tree node indices, ``path[0] == 0``) the committed continuation.

        The root and every accepted node join the committed sequence: afterwards rows ``L .. L+k`` hold
        ``path[0..k]`` and the committed length is ``L + k + 1`` (returned). Only the out-of-place rows move
        (none for a chain). ``parents`` (optional) lets the path be checked against the tree. Every check runs
        before any write; a refused commit leaves buffers and state unchanged (the round stays open).
        """
        if self.state.round_bucket is None:
            raise ConfigError("commit without an open round: call begin_round(bucket) before the forward")
        p = check_path(path, self.state.round_bucket, parents)
        src, dst = path_moves(p, self.committed_len)
        if src.size:
            # padded to the round's own bucket: one graph per verification bucket, whatever the move count
            s, d = pad_moves([src] * self.batch_size, [dst] * self.batch_size, self.state.round_bucket)
            self._fn(Tensor(s), Tensor(d))
        return self.state.advance(p.size)


__all__ = ["BranchableKVCache", "CacheState"]
