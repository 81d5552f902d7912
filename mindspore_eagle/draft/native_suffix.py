"""``NativeSuffixIndex``: ``draft.suffix``'s index and proposal computed by the kernel library (``kernels/suffix.cc``).

Why: every awake drafting step looks its request's committed sequence up and builds, features and scores the
continuation trie (up to ``max_occurrences`` x ``max_depth`` nodes). In Python that is ~0.25 ms a request step
(dicts and ~40 small numpy calls), paid by every awake request on every step of the batch engine whether or not the
global budget then gives it rows; in C++ it is a few microseconds plus the ctypes calls. Same numbers, bit for bit
(suffix.cc says how; ``tests/test_suffix_index.py`` runs every index test on both and compares their proposals'
bits): which one drafts never changes a token, a tree or a probability, only the host time.

``new_suffix_index`` picks it where the kernel library loads, and ``draft.suffix.SuffixIndex`` (the reference)
elsewhere (no compiler, another architecture): drafting works the same on both, the Python one slower.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Iterable, Sequence

import numpy as np

from ..errors import ConfigError
from .calibration import NodeFeatures
from .merge import CandidateTree
from .suffix import MAX_TOKEN_ID, IndexedSequence, Match, SuffixConfig, SuffixIndex, check_positive


@functools.lru_cache(maxsize=None)
def _library():
    """The kernel library with the suffix functions' signatures, or None where it cannot be built or loaded."""
    from ..kernels import build

    status = build.load()
    if status.library is None:
        return None
    lib = ctypes.CDLL(status.library.path)
    vp, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    for name, res, args in (("MseSuffixNew", vp, (i32,)), ("MseSuffixFree", None, (vp,)),
                            ("MseSuffixReset", None, (vp,)), ("MseSuffixNumNodes", i64, (vp,)),
                            ("MseSuffixLongestMatch", i32, (vp,)),
                            ("MseSuffixExtend", i64, (vp, vp, i64)), ("MseSuffixMatchAtLeast", i32, (vp, i32)),
                            ("MseSuffixCount", i64, (vp, vp, i32)), ("MseSuffixMatches", i32, (vp, i32, i32, vp, vp)),
                            ("MseSuffixPropose", i64, (vp, vp, vp, i32, vp, i32, vp, vp, vp, vp, vp, vp, vp))):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def native_available() -> bool:
    """Whether ``NativeSuffixIndex`` runs here (the kernel library builds and loads)."""
    return _library() is not None


def new_suffix_index(max_match: int = 16):
    """The index a proposer drafts with: ``NativeSuffixIndex`` where the kernel library loads, else the Python
    ``SuffixIndex`` (the same results)."""
    return NativeSuffixIndex(max_match) if native_available() else SuffixIndex(max_match)


class NativeSuffixIndex(IndexedSequence):
    """``SuffixIndex``'s interface (``extend``, ``reset``, ``tokens``, ``count``, ``longest_match``,
    ``match_at_least``, ``matches``) over a C++ index, plus ``propose``: what ``suffix_proposal`` returns for it.
    One request's index: calls on one object must not run concurrently."""

    def __init__(self, max_match: int = 16):
        check_positive("SuffixIndex", "max_match", max_match)
        lib = _library()
        if lib is None:
            raise ConfigError("NativeSuffixIndex: the kernel library is unavailable here (mindspore-eagle setup says "
                              "why); use draft.suffix.SuffixIndex")
        self._lib, self.max_match = lib, max_match
        self._handle = lib.MseSuffixNew(max_match)
        self._seq: list[int] = []
        self._out_size = 0
        self._calibration = None  # (calibration, match edges, count edges) of the last propose

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle:
            self._lib.MseSuffixFree(handle)
            self._handle = None

    # ----- state ------------------------------------------------------------------------------------------
    def reset(self) -> None:
        self._lib.MseSuffixReset(self._handle)
        self._seq = []

    @property
    def num_nodes(self) -> int:
        return int(self._lib.MseSuffixNumNodes(self._handle))

    def count(self, pattern: Sequence[int]) -> int:
        """Occurrences of ``pattern`` (1..max_match tokens) in the sequence (0 if it never occurred)."""
        self._check_pattern(pattern)
        arr = np.ascontiguousarray(pattern, np.int64)
        return int(self._lib.MseSuffixCount(self._handle, arr.ctypes.data, len(pattern)))

    # ----- updates ----------------------------------------------------------------------------------------
    def extend(self, tokens: Iterable[int]) -> None:
        """Append ``tokens`` (ids in [0, 2^31)) and index every new occurrence; an id outside that range is refused
        before any token is appended."""
        new = [int(t) for t in tokens]
        if not new:
            return
        arr = np.asarray(new, np.int64)
        bad = int(self._lib.MseSuffixExtend(self._handle, arr.ctypes.data, arr.shape[0]))
        if bad:
            raise ConfigError(f"SuffixIndex.extend: token id {new[bad - 1]} is outside [0, {MAX_TOKEN_ID}]")
        self._seq += new

    # ----- queries ----------------------------------------------------------------------------------------
    def longest_match(self) -> int:
        return int(self._lib.MseSuffixLongestMatch(self._handle))

    def match_at_least(self, length: int) -> bool:
        self._check_match_length(length)
        return bool(self._lib.MseSuffixMatchAtLeast(self._handle, length))

    def matches(self, max_occurrences: int, min_match: int = 1) -> list[Match]:
        if max_occurrences < 1:
            return []
        starts = np.zeros(max_occurrences, np.int64)
        lengths = np.zeros(max_occurrences, np.int32)
        n = self._lib.MseSuffixMatches(self._handle, max_occurrences, min_match, starts.ctypes.data,
                                       lengths.ctypes.data)
        return [Match(int(s), int(m)) for s, m in zip(starts[:n], lengths[:n])]

    # ----- the proposal -----------------------------------------------------------------------------------
    def propose(self, cfg: SuffixConfig, calibration) -> tuple[CandidateTree, NodeFeatures]:
        """``suffix_proposal(self, cfg, calibration)``: the scored candidate tree (root = the sequence's last token,
        at most ``cfg.max_candidates`` nodes) and its nodes' features. ``calibration``: a ``SuffixCalibration`` or
        an ``OnlineCalibration`` (its ``q_table()`` now)."""
        self._check_not_empty()
        cached = self._calibration
        if cached is None or cached[0] is not calibration:
            match_edges = np.asarray(calibration.match_edges, np.int64)
            count_edges = np.asarray(calibration.count_edges, np.int64)
            cached = (calibration, match_edges, count_edges, match_edges.ctypes.data, count_edges.ctypes.data)
            self._calibration = cached
        _, match_edges, count_edges, match_ptr, count_ptr = cached
        table = np.ascontiguousarray(calibration.q_table(), np.float64)
        if table.shape != (match_edges.size, 4, count_edges.size):
            raise ConfigError(f"suffix proposal: calibration table of shape {table.shape} for "
                              f"{match_edges.size} match and {count_edges.size} count buckets")
        size = max(cfg.max_candidates, 1)
        if size != self._out_size:  # output buffers, reused (each result is copied out of them)
            self._ints = np.zeros((5, size), np.int64)  # tokens, parents, m_eff, role, count
            self._probs = np.zeros(size, np.float64)
            self._args = np.zeros(4, np.int64)
            row, step = self._ints.ctypes.data, self._ints.strides[0]
            self._ptrs = (self._args.ctypes.data, row, row + step, self._probs.ctypes.data, row + 2 * step,
                          row + 3 * step, row + 4 * step)
            self._out_size = size
        self._args[:] = (cfg.max_occurrences, cfg.max_depth, cfg.min_match, cfg.max_candidates)
        args, tok, par, prob, m_eff_p, role_p, count_p = self._ptrs
        n = int(self._lib.MseSuffixPropose(self._handle, args, match_ptr, match_edges.size, count_ptr,
                                           count_edges.size, table.ctypes.data, tok, par, prob, m_eff_p, role_p,
                                           count_p))
        ints, probs = self._ints, self._probs
        tokens, parents, m_eff, role, count = (ints[i, :n].copy() for i in range(5))
        return CandidateTree(tokens, parents, probs[:n].copy()), NodeFeatures(m_eff, role, count)


__all__ = ["NativeSuffixIndex", "native_available", "new_suffix_index"]
