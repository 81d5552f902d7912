"""The suffix candidates' acceptance table: node features, the table (``SuffixCalibration``), its fitting and the
shipped file.

A suffix candidate's conditional acceptance ``q`` (given its parent accepted) is read from an empirical table by
effective match length, standing among its siblings (``ROLES``) and occurrence count (``NodeFeatures``); the table
is fitted on a replay of the committed evaluation trace (``scripts/replay_suffix.py --fit``) and shipped as
``suffix_calibration.json``. ``draft.suffix`` holds the index and the continuation trie whose nodes these score;
``draft.online_calibration`` corrects the table while serving (``--suffix-calibration online``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..errors import AssetError, ConfigError

if TYPE_CHECKING:
    from .suffix import ContinuationTrie

ROLE_ONLY, ROLE_LEADER, ROLE_TIED, ROLE_OTHER = 0, 1, 2, 3
ROLES = ("only", "leader", "tied", "other")
"""A node's standing among its siblings: the only child; the one child holding the longest match among
them; one of several children tied for it; any other. Siblings compete, so standing predicts acceptance far
better than the share of occurrences (replay: at 8-11 tokens of match, 0.90 / 0.80 / 0.39 / 0.11)."""


@dataclass(frozen=True)
class NodeFeatures:
    """What a continuation node's conditional acceptance is read from (all ``[N]``; root entries unused)."""

    m_eff: np.ndarray  # int64: match + depth - 1, the context its occurrence shares once the path is accepted
    role: np.ndarray  # int64: ROLE_*
    count: np.ndarray  # int64: occurrences through the node


def node_features(trie: ContinuationTrie) -> NodeFeatures:
    """Features of every node of ``trie`` (vectorised over its parent array).

    Example: root children a (match 5, count 2) and b (match 5, count 1), a's only child c: roles a, b =
    tied, c = only; m_eff a = b = 5, c = 6."""
    n, par, match = trie.num_nodes, trie.parents[1:], trie.match[1:]
    siblings = np.bincount(par, minlength=n)
    best = np.zeros(n, np.int64)
    np.maximum.at(best, par, match)
    holds = match == best[par]
    holders = np.bincount(par, weights=holds, minlength=n)
    role = np.where(siblings[par] == 1, ROLE_ONLY,
                    np.where(holds, np.where(holders[par] == 1, ROLE_LEADER, ROLE_TIED), ROLE_OTHER))
    return NodeFeatures(trie.match + trie.depth - 1, np.concatenate([[ROLE_ONLY], role]).astype(np.int64),
                        trie.count.copy())


@dataclass(frozen=True)
class SuffixCalibration:
    """Conditional acceptance ``q`` of a continuation node given its parent accepted, by feature bucket.

    ``table[i][r][k]``: m_eff bucket i, role r (``ROLES``), count bucket k. A feature's bucket is the last
    edge ``<= value`` (edges strictly increasing from 1). Example: match_edges (1, 4), count_edges (1, 2): a
    leader with match 2 at depth 3 (m_eff 4) seen once reads ``table[1][ROLE_LEADER][0]``.
    """

    match_edges: tuple[int, ...]
    count_edges: tuple[int, ...]
    table: tuple[tuple[tuple[float, ...], ...], ...]
    source: str = ""  # how the table was fitted (command, data, split)

    def __post_init__(self) -> None:
        object.__setattr__(self, "match_edges", tuple(int(e) for e in self.match_edges))
        object.__setattr__(self, "count_edges", tuple(int(e) for e in self.count_edges))
        for name, edges in (("match_edges", self.match_edges), ("count_edges", self.count_edges)):
            if not edges or edges[0] != 1 or any(b <= a for a, b in zip(edges, edges[1:])):
                raise ConfigError(f"SuffixCalibration.{name}={edges}: must be strictly increasing from 1")
        shape = (len(self.match_edges), len(ROLES), len(self.count_edges))
        arr = np.asarray(self.table, np.float64)
        if arr.shape != shape:
            raise ConfigError(f"SuffixCalibration.table shape {arr.shape}: expected {shape} (m_eff x role x count)")
        if not np.all((arr >= 0) & (arr <= 1)):
            raise ConfigError("SuffixCalibration.table: every entry is a probability in [0, 1]")
        object.__setattr__(self, "table", tuple(tuple(tuple(float(x) for x in r) for r in p) for p in arr))
        object.__setattr__(self, "_array", arr)
        # the edges as arrays once: searchsorted would convert the tuples on every lookup (every drafting step)
        object.__setattr__(self, "_match_edges", np.asarray(self.match_edges, np.int64))
        object.__setattr__(self, "_count_edges", np.asarray(self.count_edges, np.int64))

    def cells(self, f: NodeFeatures) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        i = np.searchsorted(self._match_edges, f.m_eff, side="right") - 1
        k = np.searchsorted(self._count_edges, f.count, side="right") - 1
        return np.maximum(i, 0), f.role, np.maximum(k, 0)

    def q(self, f: NodeFeatures) -> np.ndarray:
        """float64 [N]: the table entry of every node."""
        return self._array[self.cells(f)]

    def q_table(self) -> np.ndarray:
        """float64 [m_eff buckets, roles, count buckets]: every cell's q (what ``q`` reads; read-only)."""
        return self._array

    def to_dict(self) -> dict:
        return {"match_edges": list(self.match_edges), "count_edges": list(self.count_edges), "roles": list(ROLES),
                "table": [[list(r) for r in p] for p in self.table], "source": self.source}

    def to_json(self) -> str:
        """The JSON text of ``to_dict``, one m_eff bucket of the table per line (readable in a diff)."""
        d = self.to_dict()
        table = d.pop("table")
        head = json.dumps(d)[:-1]
        planes = ",\n  ".join(json.dumps(p) for p in table)
        return f"{head},\n \"table\": [\n  {planes}\n ]}}\n"

    @classmethod
    def from_dict(cls, d: dict) -> "SuffixCalibration":
        if d.get("roles", list(ROLES)) != list(ROLES):
            raise ConfigError(f"suffix calibration roles {d.get('roles')}: expected {list(ROLES)}")
        try:
            return cls(d["match_edges"], d["count_edges"], d["table"], d.get("source", ""))
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"suffix calibration: expected keys match_edges, count_edges, table ({exc})") from None

    @classmethod
    def load(cls, path: str) -> "SuffixCalibration":
        try:
            with open(path, encoding="utf-8") as f:
                return cls.from_dict(json.load(f))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"suffix calibration {path}: {exc}") from None


def fit_calibration(features: NodeFeatures, accepted: np.ndarray, match_edges: Sequence[int],
                    count_edges: Sequence[int], prior: float = 20.0, source: str = "") -> SuffixCalibration:
    """The empirical table from labelled nodes: ``features`` of nodes whose parent the teacher accepted, and
    ``accepted`` (bool) whether it accepted the node too. Cells are smoothed with ``prior`` pseudo-counts
    towards coarser estimates (a cell towards its (m_eff, role) rate, that towards its m_eff rate, that towards
    the overall rate), so a sparse cell reads its neighbourhood instead of 0 or 1."""
    acc = np.asarray(accepted, np.float64).reshape(-1)
    if acc.size == 0 or not (features.m_eff.shape == features.role.shape == features.count.shape == acc.shape):
        raise ConfigError("fit_calibration: features and labels must be non-empty arrays of one shape")
    shape = (len(match_edges), len(ROLES), len(count_edges))
    probe = SuffixCalibration(match_edges, count_edges, np.zeros(shape))
    cell = probe.cells(features)
    hits, seen = np.zeros(shape), np.zeros(shape)
    np.add.at(hits, cell, acc)
    np.add.at(seen, cell, 1.0)
    r1 = (hits.sum((1, 2)) + prior * acc.mean()) / (seen.sum((1, 2)) + prior)  # [I]
    r2 = (hits.sum(2) + prior * r1[:, None]) / (seen.sum(2) + prior)  # [I, R]
    r3 = (hits + prior * r2[:, :, None]) / (seen + prior)  # [I, R, K]
    return SuffixCalibration(match_edges, count_edges, np.round(r3, 4), source)


CALIBRATION_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "suffix_calibration.json")
"""The shipped calibration: fitted by ``scripts/replay_suffix.py --fit --install`` on half of the committed
evaluation trace's conversations (its ``source`` field says which), for ``SuffixConfig()``."""

_DEFAULT: list[SuffixCalibration] = []


def default_calibration() -> SuffixCalibration:
    """The shipped calibration (read once)."""
    if not _DEFAULT:
        if not os.path.isfile(CALIBRATION_FILE):
            raise AssetError(f"suffix calibration {CALIBRATION_FILE} is missing: regenerate it with "
                             "scripts/replay_suffix.py --fit --install")
        _DEFAULT.append(SuffixCalibration.load(CALIBRATION_FILE))
    return _DEFAULT[0]
