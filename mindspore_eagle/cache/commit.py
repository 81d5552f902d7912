"""Committing an accepted path: the host-side move list and the in-graph row moves.

``PathCommit`` is built from any list of ``(k_cache, v_cache)`` Parameter pairs ``[B, Hkv, max_len, D]`` (the
teacher's layers, the draft head's layer, or both; pairs may differ in ``Hkv`` and ``D``) and holds them the
way an optimizer holds a network's parameters. One call moves the same rows in every buffer: it first
*gathers* every source row of every buffer, then *scatters* them into the destination rows. All reads come
before any write, so a move list whose sources overlap its destinations is still a pure permutation of the
old values. Example: accepted path ``[0, 2, 5]`` at committed length L moves ``L+2 -> L+1`` and
``L+5 -> L+2``; row ``L+2`` is read (old value, for ``L+1``) and written (with the old ``L+5``) in one call.

Static shapes: the move list is padded to one of the runtime's ``Buckets`` (P), so a graph compiles once per P
actually used. A pad entry repeats the last real move (same source, same destination, so the same value lands
twice on one row) — harmless, in range, never negative.

``path_moves`` builds the move list of an accepted path: only the out-of-place suffix, never a row below L; a
chain path (``[0, 1, ..., k]``, its nodes already in rows ``L .. L+k``) moves nothing.

Two implementations of the same copy: ``ops.gather_nd`` + ``ops.scatter_nd_update`` (primitives, any device;
on the CPU every ScatterNdUpdate copies its whole buffer, 60 buffers per commit of the default teacher), and
the in-place ``kernels.RowMoveKernel`` (one op that copies only the moved rows). A copy is a copy: both leave
bit-identical buffers (tests/test_cache_commit.py runs both). ``inplace=None`` picks the kernel where the
kernel library runs (x86-64 or AArch64 Linux, MindSpore on the CPU).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from mindspore import Parameter, ParameterTuple, nn, ops

from ..errors import ConfigError
from ..kernels import RowMoveKernel, kernel_status
from ..models.layers import write_index

def check_path(path: Sequence[int], bucket: int, parents: Sequence[int] | None = None) -> np.ndarray:
    """Validate an accepted path of tree node indices; return it as int64 ``[k+1]``.

    Rules: non-empty, starts at the root (0), strictly increasing (parents precede children), every node
    below the round's ``bucket``; with ``parents`` given, each node's parent is the previous path entry.
    Example: parents [0, 0, 0, 1, 2, 2], path [0, 2, 5] is valid; [0, 1, 5] is not (5's parent is 2).
    """
    p = np.asarray(path)
    if p.ndim != 1 or p.size == 0 or (p.size and p.dtype.kind not in "iu"):
        raise ConfigError(f"accepted path {list(np.ravel(p))!r}: must be a non-empty 1-D list of node indices")
    p = p.astype(np.int64)
    if p[0] != 0:
        raise ConfigError(f"accepted path {p.tolist()}: must start at the root (node 0)")
    if p.size > 1 and not np.all(np.diff(p) > 0):
        raise ConfigError(f"accepted path {p.tolist()}: node indices must strictly increase (parents come first)")
    if p[-1] >= bucket:
        raise ConfigError(f"accepted path {p.tolist()}: node {int(p[-1])} is outside this round's {bucket} "
                          "written rows")
    if parents is not None:
        par = np.asarray(parents, np.int64)
        if p[-1] >= par.shape[0]:
            raise ConfigError(f"accepted path {p.tolist()}: node {int(p[-1])} is not in the tree of "
                              f"{par.shape[0]} nodes")
        bad = np.flatnonzero(par[p[1:]] != p[:-1])
        if bad.size:
            i = int(bad[0]) + 1
            raise ConfigError(f"accepted path {p.tolist()}: node {int(p[i])} has parent {int(par[p[i]])}, "
                              f"not the previous path node {int(p[i - 1])}")
    return p


def path_moves(path: np.ndarray, committed_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Row moves ``(src, dst)`` that put the accepted ``path`` into rows ``L .. L+k`` (L = committed_len).

    A valid path has ``path[i] >= i``, and once ``path[i] > i`` every later entry is out of place too, so the
    moves are one contiguous suffix and never touch a row below L. Example, L=10, path [0, 1, 3, 6]:
    src [13, 16], dst [12, 13] (nodes 0 and 1 are already in place). A chain path gives no moves.
    """
    out_of_place = np.flatnonzero(path != np.arange(path.size))
    dst = committed_len + out_of_place
    src = committed_len + path[out_of_place]
    return src.astype(np.int64), dst.astype(np.int64)


def pad_moves(src: Sequence[np.ndarray], dst: Sequence[np.ndarray], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-sequence move lists -> int32 ``[B, size]`` each, padded by repeating the last real move.

    A sequence without moves gets the self-copy ``0 -> 0`` (it has no other destination, so nothing
    conflicts). Example, size 4: src [7, 9], dst [5, 6] -> [[7, 9, 9, 9]], [[5, 6, 6, 6]].
    """
    b = len(src)
    s_out = np.zeros((b, size), np.int32)
    d_out = np.zeros((b, size), np.int32)
    for i, (s, d) in enumerate(zip(src, dst)):
        n = s.size
        if n:
            s_out[i, :n], s_out[i, n:] = s, s[-1]
            d_out[i, :n], d_out[i, n:] = d, d[-1]
    return s_out, d_out


def _check_pairs(pairs: Sequence[tuple[Parameter, Parameter]]) -> tuple[int, int]:
    """All pairs ``[B, Hkv, max_len, D]`` with one B and one max_len; k and v of a pair alike. -> (B, max_len)."""
    if not pairs:
        raise ConfigError("PathCommit needs at least one (k_cache, v_cache) pair")
    shapes = set()
    for n, (k, v) in enumerate(pairs):
        if len(k.shape) != 4 or tuple(k.shape) != tuple(v.shape):
            raise ConfigError(f"cache pair {n}: k {tuple(k.shape)} and v {tuple(v.shape)} must be equal "
                              "[B, Hkv, max_len, D]")
        shapes.add((k.shape[0], k.shape[2]))
    if len(shapes) != 1:
        raise ConfigError(f"cache pairs disagree on (batch, max_len): {sorted(shapes)}")
    return shapes.pop()


def row_moves_in_place() -> bool:
    """Whether ``PathCommit`` can use the in-place row-move kernel here (the kernel library runs, on the CPU)."""
    import mindspore as ms

    return ms.get_context("device_target") == "CPU" and kernel_status("float32").library is not None


class PathCommit(nn.Cell):
    """``construct(src_rows [B, P], dst_rows [B, P]) -> dst_rows``: row ``src_rows[b, j]`` of every buffer
    is copied to row ``dst_rows[b, j]``, reading all sources before any write.

    Both index tensors are int32 (``pad_moves``), in ``[0, max_len)``; the caller (``BranchableKVCache``) checks
    that on the host. Duplicate destinations must carry the same source (pad entries do). ``inplace``: the
    row-move kernel (True), the primitives (False), or the kernel where it runs (None, see the module
    docstring). The primitives update the buffers with ``ops.scatter_nd_update`` (``Parameter.scatter_`` would
    silently do nothing in a graph).
    """

    def __init__(self, pairs: Sequence[tuple[Parameter, Parameter]], inplace: bool | None = None):
        super().__init__()
        self.batch_size, self.max_len = _check_pairs(pairs)
        self.caches = ParameterTuple([p for pair in pairs for p in pair])  # k0, v0, k1, v1, ...
        self.num_layers = len(pairs)
        self.inplace = row_moves_in_place() if inplace is None else bool(inplace)
        if self.inplace:
            self.mover = RowMoveKernel()

    def construct(self, src_rows, dst_rows):
        if self.inplace:
            return self.mover(src_rows, dst_rows, self.caches)
        gathered = ()
        for cache in self.caches:
            idx = write_index(src_rows, cache.shape[1])  # [B, Hkv, P, 3] (batch, head, row)
            gathered = gathered + (ops.gather_nd(cache, idx),)  # [B, Hkv, P, D]
        # Each write consumes the gather of its own buffer, so by data dependency every row of a buffer is
        # read before that buffer is written.
        updated = ()
        for cache, rows in zip(self.caches, gathered):
            updated = updated + (ops.scatter_nd_update(cache, write_index(dst_rows, cache.shape[1]), rows),)
        return ops.depend(dst_rows, updated)


__all__ = ["PathCommit", "check_path", "pad_moves", "path_moves"]
