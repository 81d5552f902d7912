"""``OnlineCalibration``: the suffix calibration corrected by what the teacher actually accepts while it serves.

Why. The shipped table (``suffix_calibration.json``) was fitted on a replay of one teacher's evaluation turns.
How often a suffix continuation is accepted depends on the teacher and on the request: an answer that copies its
prompt accepts match-1 continuations far more often than a story does (on ``make demo``'s answer such steps
accepted ~0.1 draft tokens where the table expects ~0.3-0.5 per node), and another teacher repeats itself more or
less than SmolLM2. Over-estimated suffix nodes mislead the adaptive rule twice: it verifies rows that are
rejected, and ``should_grow`` keeps the EAGLE head switched off because the suffix branch looks good enough.

What it learns. Every verified step labels suffix candidates for free: with greedy verification the committed
tokens are the teacher's own continuation, so every candidate whose parent path was accepted (or is the root) is
either on that continuation (accepted) or not, whether or not it was in the verified tree. Per m_eff bucket of
the table (the match length plus the depth, the feature that dominates), the proposer keeps the *observed* hits
and the *expected* hits (the sum of the table's q over the same labelled nodes), both decayed by ``decay`` per
step; the correction of the bucket is the ratio

    ratio[i] = (hits[i] + strength) / (expected[i] + strength)

and a node reads ``q = min(table q * ratio[i], q_max)``. ``strength`` expected hits of prior evidence hold the
ratio at 1 until the bucket has been tried enough; ``decay`` < 1 forgets old steps (half-life ``log 0.5 / log
decay`` steps), so the correction follows the request in hand yet persists across requests (it describes the
teacher as well as the conversation). The ratio pools a bucket's roles and counts: their relative order is the
table's; only the level is learnt (a bucket has enough labels within a few dozen steps; a cell would not).

Lossless by construction: it changes only which candidates are verified, never what is accepted.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from .calibration import NodeFeatures, SuffixCalibration


class OnlineCalibration:
    """A ``SuffixCalibration`` (the prior) times a learnt per-m_eff-bucket ratio (module docstring).

    It offers the prior's ``cells`` and ``q``, so ``score_trie`` / ``suffix_candidates`` take either; ``observe``
    adds one step's labelled nodes. ``reset`` forgets what was learnt (back to the prior)."""

    def __init__(self, prior: SuffixCalibration, strength: float = 4.0, decay: float = 0.99,
                 q_max: float = 0.995):
        if not isinstance(prior, SuffixCalibration):
            raise ConfigError(f"OnlineCalibration prior: expected a SuffixCalibration, got {type(prior).__name__}")
        if not (isinstance(strength, (int, float)) and strength > 0):
            raise ConfigError(f"OnlineCalibration.strength={strength!r}: must be > 0 (expected hits of prior evidence)")
        if not (isinstance(decay, (int, float)) and 0 < decay <= 1):
            raise ConfigError(f"OnlineCalibration.decay={decay!r}: must be in (0, 1] (1 = never forget)")
        if not (isinstance(q_max, (int, float)) and 0 < q_max <= 1):
            raise ConfigError(f"OnlineCalibration.q_max={q_max!r}: must be in (0, 1]")
        self.prior, self.strength, self.decay, self.q_max = prior, float(strength), float(decay), float(q_max)
        self._table = np.asarray(prior.table, np.float64)
        self.reset()

    @property
    def match_edges(self) -> tuple[int, ...]:
        return self.prior.match_edges

    @property
    def count_edges(self) -> tuple[int, ...]:
        return self.prior.count_edges

    def reset(self) -> None:
        buckets = len(self.prior.match_edges)
        self.hits = np.zeros(buckets)
        self.expected = np.zeros(buckets)
        self.labels = 0  # labelled nodes observed so far (not decayed; for traces)

    @property
    def ratio(self) -> np.ndarray:
        """float64 [buckets]: the learnt correction of each m_eff bucket (1 = the table as shipped)."""
        return (self.hits + self.strength) / (self.expected + self.strength)

    def cells(self, f: NodeFeatures) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.prior.cells(f)

    def q(self, f: NodeFeatures) -> np.ndarray:
        """float64 [N]: the table's q of every node times its bucket's ratio, capped at ``q_max``."""
        i, r, k = self.cells(f)
        return np.minimum(self._table[i, r, k] * self.ratio[i], self.q_max)

    def q_table(self) -> np.ndarray:
        """float64 [m_eff buckets, roles, count buckets]: every cell's q now (``q`` reads the same numbers)."""
        return np.minimum(self._table * self.ratio[:, None, None], self.q_max)

    def observe(self, f: NodeFeatures, accepted: np.ndarray) -> None:
        """One verified step: ``f`` the features of the nodes whose parent path was accepted, ``accepted`` (bool)
        whether each was accepted too. Decays the old evidence first, even for a step without labels."""
        acc = np.asarray(accepted, np.float64).reshape(-1)
        if not (f.m_eff.shape == f.role.shape == f.count.shape == acc.shape):
            raise ConfigError(f"OnlineCalibration.observe: {acc.size} labels for features of shapes "
                              f"{f.m_eff.shape} / {f.role.shape} / {f.count.shape}")
        self.hits *= self.decay
        self.expected *= self.decay
        if acc.size == 0:
            return
        i, r, k = self.cells(f)
        np.add.at(self.hits, i, acc)
        np.add.at(self.expected, i, self._table[i, r, k])
        self.labels += int(acc.size)


def labelled_nodes(tokens: np.ndarray, parents: np.ndarray, committed) -> tuple[np.ndarray, np.ndarray]:
    """Which nodes of a candidate tree one verified step labels, and their labels.

    ``tokens`` / ``parents``: the candidate tree (node 0 the root, parents before children); ``committed``: the
    tokens the step committed after the root (accepted drafts, then the bonus) = the teacher's greedy
    continuation. A node at depth d is labelled iff its parent's path spells ``committed[:d - 1]`` and
    ``d <= len(committed)``; its label is whether its own token is ``committed[d - 1]``.

    Example: tokens [r, 5, 6, 7], parents [0, 0, 0, 1], committed [5, 9]: nodes 1 and 2 are labelled (depth 1),
    1 accepted, 2 not; node 3 (depth 2, parent on the path) is labelled and not accepted (9 was committed)."""
    tokens = np.asarray(tokens).reshape(-1)
    par = np.asarray(parents).reshape(-1)
    committed = [int(t) for t in committed]
    n, length = tokens.shape[0], len(committed)
    depth = np.zeros(n, np.int64)
    on_path = np.zeros(n, bool)
    on_path[0] = True
    labelled = np.zeros(n, bool)
    for j in range(1, n):  # parents first
        depth[j] = depth[par[j]] + 1
        if on_path[par[j]] and depth[j] <= length:
            labelled[j] = True
            on_path[j] = int(tokens[j]) == committed[depth[j] - 1]
    return labelled, on_path


__all__ = ["OnlineCalibration", "labelled_nodes"]
