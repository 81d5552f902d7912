"""Draft vocabulary: the N most frequent tokens the teacher outputs -> ``d2t`` offsets and ``t2d`` mask.

A head predicting over N << vocab tokens has an N-wide lm_head (smaller, faster, and its softmax is not spread
over tokens the teacher never says). Layout as in the public EAGLE-3 checkpoints: draft ids are the chosen
target ids *in ascending order*; ``d2t[i] = target_id(i) - i`` and ``t2d[target] = True`` for chosen ids.

Example: vocab 6, chosen target ids {4, 1} -> draft ids 0 -> 1, 1 -> 4: d2t = [1, 3], t2d = [F, T, F, F, T, F].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ..errors import ConfigError


@dataclass(frozen=True)
class DraftVocab:
    """``target_ids [N]`` ascending; ``d2t [N]`` int64 offsets; ``t2d [vocab]`` bool; ``draft_of [vocab]`` the
    draft id of each target id, -1 outside the draft vocabulary (host-side lookup only)."""

    target_ids: np.ndarray
    d2t: np.ndarray
    t2d: np.ndarray
    draft_of: np.ndarray

    @property
    def size(self) -> int:
        return int(self.target_ids.shape[0])

    @classmethod
    def from_target_ids(cls, target_ids: Iterable[int], vocab_size: int) -> "DraftVocab":
        ids = np.unique(np.asarray(list(target_ids), np.int64))
        if ids.size == 0 or ids[0] < 0 or ids[-1] >= vocab_size:
            raise ConfigError(f"draft vocabulary ids must be non-empty and in [0, {vocab_size})")
        t2d = np.zeros(vocab_size, np.bool_)
        t2d[ids] = True
        draft_of = np.full(vocab_size, -1, np.int64)
        draft_of[ids] = np.arange(ids.size)
        return cls(ids, ids - np.arange(ids.size), t2d, draft_of)

    @classmethod
    def from_d2t(cls, d2t: np.ndarray, vocab_size: int) -> "DraftVocab":
        return cls.from_target_ids(np.arange(len(d2t)) + np.asarray(d2t, np.int64), vocab_size)


def build_draft_vocab(token_counts: np.ndarray, size: int, always: Iterable[int] = (),
                      secondary: np.ndarray | None = None) -> DraftVocab:
    """The ``size`` most frequent ids of ``token_counts [vocab]`` plus ``always`` (e.g. EOS ids, so the draft can
    propose the end of an answer). Ties (in particular the many ids a small data set never shows) are broken by
    ``secondary`` counts (e.g. how often an id is among the teacher's top-k candidates), then by lower id: a head
    must have exactly ``size`` entries."""
    vocab = token_counts.shape[0]
    if not 1 <= size <= vocab:
        raise ConfigError(f"draft vocabulary size {size}: must be in [1, {vocab}]")
    forced = sorted(set(int(a) for a in always))
    second = np.zeros(vocab, np.int64) if secondary is None else np.asarray(secondary, np.int64)
    order = np.lexsort((np.arange(vocab), -second, -token_counts.astype(np.int64)))  # count desc, then secondary
    chosen = list(forced)
    taken = set(forced)
    for t in order:
        if len(chosen) >= size:
            break
        if int(t) not in taken:
            chosen.append(int(t))
            taken.add(int(t))
    return DraftVocab.from_target_ids(chosen[:size], vocab)


def count_tokens(token_arrays: Iterable[np.ndarray], vocab_size: int) -> np.ndarray:
    counts = np.zeros(vocab_size, np.int64)
    for arr in token_arrays:
        counts += np.bincount(np.asarray(arr, np.int64).reshape(-1), minlength=vocab_size)[:vocab_size]
    return counts


def coverage(token_counts: np.ndarray, vocab: DraftVocab) -> float:
    """Fraction of the counted occurrences that the draft vocabulary can propose."""
    total = token_counts.sum()
    return float(token_counts[vocab.target_ids].sum() / total) if total else 0.0


__all__ = ["DraftVocab", "build_draft_vocab", "count_tokens", "coverage"]
