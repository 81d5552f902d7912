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
  * ``commit(path, LENGTH)`` (path ``[0, 1, ..., k]``, a chain) writes nothing: ``L += k + 1``;
  * ``commit(path, PATH_INDEX)`` copies rows ``L + path[i]`` to ``L + i`` for the out-of-place suffix of the
    path only (``path_moves``), all layers in one graph, then ``L += k + 1``; rows below L are untouched;
  * ``abort_round()``, ``rollback(L')`` and ``reset()`` write nothing: rows ``>= L'`` become stale, hidden
    by every mask and overwritten by the next round;
  * ``reorder(index_map)`` (general, for callers that need it) writes exactly the rows ``i`` with
    ``index_map[i] != i``.

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

from ..errors import CacheCapacityError, ConfigError
from .commit import (CommitMode, PathCommit, check_path, compile_commit, map_moves, move_bucket, pad_moves,
                     path_moves)


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
    """A list of ``(k_cache, v_cache)`` buffers plus their ``CacheState``: round, commit, rollback, reorder.

    Usage per step::

        L = cache.begin_round(bucket)                  # capacity check, before any write
        teacher.forward(tokens, L + depth, L + arange(bucket), tree_attention_mask(layout, L, max_len))
        L = cache.commit(accepted_path, CommitMode.PATH_INDEX)

    ``exec_mode`` "performance" compiles the row moves with ``ms.jit`` (once per move bucket P); "reference"
    runs the same Cell in PyNative.
    """

    def __init__(self, pairs: Sequence[tuple[Parameter, Parameter]], exec_mode: str = "performance"):
        self.pairs = [tuple(pair) for pair in pairs]
        self.cell = PathCommit(self.pairs)
        self._fn = compile_commit(self.cell, exec_mode)
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

    def round_rows(self, num_rows: int) -> np.ndarray:
        """int64 ``[B, num_rows]`` cache rows ``L + i`` for the open round's tokens (the forward's ``rows``)."""
        if self.state.round_bucket is None or not 1 <= num_rows <= self.state.round_bucket:
            raise ConfigError(f"round_rows({num_rows}): the open round reserved {self.state.round_bucket} rows")
        rows = self.committed_len + np.arange(num_rows, dtype=np.int64)
        return np.broadcast_to(rows, (self.batch_size, num_rows)).copy()

    def abort_round(self) -> None:
        """Discard the open round (e.g. a decode step whose row is not kept): nothing is committed or written."""
        self.state.abort()

    def rollback(self, committed_len: int) -> int:
        """Forget everything after ``committed_len`` tokens (ConfigError if it is not an earlier length)."""
        return self.state.rollback(committed_len)

    def reset(self) -> None:
        """Start a new conversation: committed length 0, no round open."""
        self.state.reset()

    # ----- commit ------------------------------------------------------------------------------------

    def commit(self, path: Sequence[int], mode: CommitMode = CommitMode.PATH_INDEX,
               parents: Sequence[int] | None = None) -> int:
        """Make the accepted root-to-node ``path`` (tree node indices, ``path[0] == 0``) the committed continuation.

        The root and every accepted node join the committed sequence: afterwards rows ``L .. L+k`` hold
        ``path[0..k]`` and the committed length is ``L + k + 1`` (returned). ``parents`` (optional) lets the
        path be checked against the tree. LENGTH requires ``path == [0, 1, ..., k]``. Every check runs before
        any write; a refused commit leaves buffers and state unchanged (the round stays open).
        """
        if not isinstance(mode, CommitMode):
            raise ConfigError(f"commit mode {mode!r}: expected a CommitMode")
        if self.state.round_bucket is None:
            raise ConfigError("commit without an open round: call begin_round(bucket) before the forward")
        p = check_path(path, self.state.round_bucket, parents)
        L = self.committed_len
        if mode is CommitMode.LENGTH:
            if not np.array_equal(p, np.arange(p.size)):
                raise ConfigError(f"CommitMode.LENGTH needs a chain path [0, 1, ..., {p.size - 1}] (its nodes "
                                  f"already in rows L..L+{p.size - 1}); got {p.tolist()}: use CommitMode.PATH_INDEX")
        else:
            src, dst = path_moves(p, L)
            if src.size:
                self._run([src] * self.batch_size, [dst] * self.batch_size)
        return self.state.advance(p.size)

    def reorder(self, index_map: Sequence[int] | np.ndarray) -> None:
        """General reorder: new row ``i`` <- old row ``index_map[i]`` for ``i < n``; rows ``>= n`` untouched.

        ``index_map`` is int ``[n]`` (same map for every sequence) or ``[B, n]``; entries in ``[0, max_len)``.
        Only rows with ``index_map[i] != i`` are written; the committed length does not change (the caller
        says what the rows now mean, e.g. with ``rollback``). Example: ``[0, 1, 4, 3]`` copies row 4 to row 2.
        """
        m = np.asarray(index_map)
        if m.size == 0 or m.dtype.kind not in "iu" or m.ndim not in (1, 2):
            raise ConfigError(f"reorder: index_map must be a non-empty int array [n] or [B, n], got "
                              f"{m.dtype} {m.shape}")
        if m.shape[-1] > self.max_len:
            raise ConfigError(f"reorder: index_map of {m.shape[-1]} rows exceeds max_len={self.max_len}")
        m = self._per_sequence(m, "index_map")
        moves = [map_moves(row) for row in m]
        if any(s.size for s, _ in moves):
            self._run([s for s, _ in moves], [d for _, d in moves])

    def move_rows(self, src_rows: Sequence[int] | np.ndarray, dst_rows: Sequence[int] | np.ndarray) -> None:
        """Low level: copy row ``src_rows[j]`` to row ``dst_rows[j]`` in every buffer, all reads first.

        Int ``[n]`` (every sequence) or ``[B, n]``, entries in ``[0, max_len)``; a destination listed twice
        must have the same source. Identity moves are run too (``commit`` and ``reorder`` skip them).
        """
        s, d = np.asarray(src_rows), np.asarray(dst_rows)
        if s.shape != d.shape or s.size == 0 or s.ndim not in (1, 2) or s.dtype.kind not in "iu" \
                or d.dtype.kind not in "iu":
            raise ConfigError(f"move_rows: src {s.dtype} {s.shape} and dst {d.dtype} {d.shape} must be equal-shaped, "
                              "non-empty int arrays [n] or [B, n]")
        s, d = self._per_sequence(s, "src_rows"), self._per_sequence(d, "dst_rows")
        for b in range(self.batch_size):
            first = {}
            for src, dst in zip(s[b].tolist(), d[b].tolist()):
                if first.setdefault(dst, src) != src:
                    raise ConfigError(f"move_rows: row {dst} of sequence {b} would receive rows {first[dst]} "
                                      f"and {src}")
        self._run(list(s), list(d))

    def _per_sequence(self, a: np.ndarray, what: str) -> np.ndarray:
        """``[n]`` or ``[B, n]`` int rows -> int64 ``[B, n]``, every entry checked to be in ``[0, max_len)``."""
        a = np.broadcast_to(a, (self.batch_size, a.shape[-1])) if a.ndim == 1 else a
        if a.shape[0] != self.batch_size:
            raise ConfigError(f"{what}: shape {a.shape} does not match batch_size={self.batch_size}")
        if a.min() < 0 or a.max() >= self.max_len:
            raise ConfigError(f"{what}: rows must be in [0, {self.max_len}), got [{int(a.min())}, {int(a.max())}]")
        return a.astype(np.int64)

    def _run(self, src: list[np.ndarray], dst: list[np.ndarray]) -> None:
        """Run the PathCommit graph on per-sequence move lists (host-checked, in range), padded to a bucket."""
        s, d = pad_moves(src, dst, move_bucket(max(x.size for x in src)))
        self._fn(Tensor(s), Tensor(d))


__all__ = ["BranchableKVCache", "CacheState", "CommitMode"]
