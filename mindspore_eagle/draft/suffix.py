"""Model-free drafting: an incremental suffix index over the conversation, and the scored tree it proposes.

Why. Small teachers decoding greedily repeat themselves, code answers copy the prompt, extraction copies the
input and second turns rewrite the first answer. Replaying the committed 240-turn trace
(``scripts/replay_suffix.py``), suffix drafting driving the decoding emits 2.2 tokens per 16-node step where
the EAGLE-3 head emits 1.75, and a lookup costs no forward pass. (At the head's own step positions a plain
lookup scores 3.80; that figure weights long copied stretches by their length, since a sequential run
crosses such a stretch in a few steps.)

The index (``SuffixIndex``) is a suffix trie of bounded depth ``M = max_match`` over the sequence ``T[0:n]``
(prompt, earlier turns, generated tokens): one node per distinct substring of length <= M, children by next
token. Every position ``i`` contributes one occurrence to each of the nodes of ``T[i-d+1 .. i]``
(``d = 1..M``), recorded by its *continuation start* ``s = i + 1`` (the position of the token that followed
it). Per node: ``last[v]``, its most recent ``s``; per depth ``d`` and start ``s``: ``prev[d][s]``, the start
of the previous occurrence of the same node. Starts are ``>= 1``, so ``0`` means "none". Appending one token
walks the M *active* nodes (the nodes of the sequence's suffixes of length 0..M-1) one step down: O(M), no
rescan. The sequence's own suffix of length d ends at ``n - 1`` (start ``n``), so its earlier occurrences are
the chain ``prev[d][n], prev[d][prev[d][n]], ...``, most recent first.

Worked example, M = 2, T = [5, 7, 5, 7] (n = 4). The length-2 suffix (5, 7) occurred ending at 1 and at 3:
``last[(5,7)] = 4`` (the current one) and ``prev[2][4] = 2`` (the earlier one, continuing at T[2] = 5), then
``prev[2][2] = 0``: one earlier occurrence, continuation [5, 7, ...].

Why not a suffix automaton: it finds the longest repeated suffix in O(1) amortized but keeps only the *first*
end position of a state cheaply; the most recent occurrences and their counts, which predict best here, would
need a walk of the whole suffix-link chain per token (O(n) on "a a a a ...", exactly the loops small models
fall into). A bounded depth costs little: on the replay, the next token's acceptance after a match of 8, 12
and 16-or-more tokens is 0.77, 0.83 and 0.96, so matches longer than 16 would hardly rank differently.

Candidates (``suffix_candidates``). The earlier occurrences of the longest matching suffix (most recent first,
then those of shorter suffixes, up to ``max_occurrences`` distinct starts) each propose their continuation
``T[s : s + max_depth]``. A continuation that reaches the end of the sequence continues periodically with its
own tokens (``c[k] = c[k - (n - s)]``): the sequence so far is then periodic with period ``n - s``, the loop
a greedy small model is in. Continuations are merged into a trie (shared prefixes once), each node counting
the occurrences through it and the longest match among them.

Scores. Each node gets an estimated *acceptance probability*: the probability that the teacher accepts the
whole path from the root to it, the quantity EAGLE-2 observes a draft's cumulative probability approximates,
so the two sources compare on one scale (``draft.merge``). It is the product, down the path, of each node's
conditional acceptance ``q`` given its parent accepted, read from ``SuffixCalibration`` (``draft.calibration``,
with its fitting and the shipped table's I/O): an empirical table by effective match length (the match length plus
the tokens already followed: ``m + depth - 1``), by the node's standing among its siblings (``ROLES``: only child,
sole holder of the siblings' longest match, tied for it, other) and by its occurrence count; fitted on a replay of
the committed evaluation trace (``scripts/replay_suffix.py --fit``). Conditionals of siblings that sum past 1 are
scaled to sum to 1 (they are exclusive events; rare with these features).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from ..errors import ConfigError
from .calibration import NodeFeatures, SuffixCalibration, node_features

NO_OCCURRENCE = 0
"""``prev`` / ``last`` value meaning "no (earlier) occurrence": continuation starts are always >= 1."""

MAX_TOKEN_ID = 2**31 - 1
"""Largest token id an index takes (the native index packs a node and a token into 64 bits); vocabularies are far
smaller."""


def check_positive(owner: str, name: str, value, low: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{owner}.{name}={value!r}: must be an integer >= {low}")


@dataclass(frozen=True)
class Match:
    """One earlier occurrence of a suffix of the sequence: its continuation starts at ``start`` (the sequence
    continued with ``T[start]`` after it) and it matches the sequence's last ``length`` tokens (at least;
    ``length == max_match`` means "max_match or more")."""

    start: int
    length: int


class IndexedSequence:
    """What both suffix indexes (this module's, and ``native_suffix.NativeSuffixIndex``) share: the indexed sequence
    ``_seq`` and the checks of their queries; each computes ``propose`` (what ``suffix_proposal`` returns)."""

    max_match: int
    _seq: list[int]

    def __len__(self) -> int:
        return len(self._seq)

    @property
    def tokens(self) -> Sequence[int]:
        """The indexed sequence (read it, do not modify it)."""
        return self._seq

    def _check_pattern(self, pattern: Sequence[int]) -> None:
        if not 1 <= len(pattern) <= self.max_match:
            raise ConfigError(f"pattern of {len(pattern)} tokens: the index holds substrings of 1..{self.max_match}")

    def _check_match_length(self, length: int) -> None:
        if not 1 <= length <= self.max_match:
            raise ConfigError(f"match_at_least({length}): the index holds matches of 1..{self.max_match} tokens")

    def _check_not_empty(self) -> None:
        if not self._seq:
            raise ConfigError("suffix_candidates: the index is empty (call extend with the prompt first)")


class SuffixIndex(IndexedSequence):
    """Bounded-depth suffix trie over one growing token sequence (see the module docstring).

    ``extend`` appends tokens (O(max_match) each); ``matches`` lists earlier occurrences of the sequence's
    suffixes. ``reset`` forgets everything (a new conversation)."""

    def __init__(self, max_match: int = 16):
        check_positive("SuffixIndex", "max_match", max_match)
        self.max_match = max_match
        self.reset()

    def reset(self) -> None:
        self._seq: list[int] = []
        self._children: list[dict[int, int]] = [{}]  # node -> {token: child node}; node 0 = empty string
        self._last: list[int] = [NO_OCCURRENCE]  # node -> most recent continuation start
        self._count: list[int] = [0]  # node -> occurrences so far
        # _prev[d][s]: start of the previous occurrence of the depth-d node that occurred with start s
        # (index 0 unused, so _prev[d] has n + 1 entries); _prev[0] is unused.
        self._prev: list[list[int]] = [[NO_OCCURRENCE] for _ in range(self.max_match + 1)]
        self._active: list[int] = [0]  # _active[d] = node of the sequence's length-d suffix, d <= min(n, M)

    # ----- state ------------------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self._children)

    def count(self, pattern: Sequence[int]) -> int:
        """Occurrences of ``pattern`` (1..max_match tokens) in the sequence (0 if it never occurred)."""
        v = self._node(pattern)
        return 0 if v is None else self._count[v]

    def _node(self, pattern: Sequence[int]) -> int | None:
        self._check_pattern(pattern)
        v = 0
        for t in pattern:
            v = self._children[v].get(int(t))
            if v is None:
                return None
        return v

    # ----- updates ----------------------------------------------------------------------------------------
    def extend(self, tokens: Iterable[int]) -> None:
        """Append ``tokens`` (ids in [0, 2^31)) to the sequence and index every new occurrence; an id outside that
        range is refused before any token is appended."""
        new = [int(t) for t in tokens]
        for t in new:
            if not 0 <= t <= MAX_TOKEN_ID:
                raise ConfigError(f"SuffixIndex.extend: token id {t} is outside [0, {MAX_TOKEN_ID}]")
        seq, children, last, count = self._seq, self._children, self._last, self._count
        rows = self._prev[1:]  # rows[d - 1] = _prev[d]: the active node of depth d - 1 grows into depth d
        active = self._active
        for t in new:
            seq.append(t)
            s = len(seq)  # continuation start of every occurrence ending at the new token
            new_active = [0]
            for v, row in zip(active, rows):  # the suffix of length d grows into the one of length d + 1
                w = children[v].get(t)
                if w is None:  # the first occurrence of this substring
                    w = len(last)
                    children[v][t] = w
                    children.append({})
                    last.append(s)
                    count.append(1)
                    row.append(NO_OCCURRENCE)
                else:
                    row.append(last[w])
                    last[w] = s
                    count[w] += 1
                new_active.append(w)
            for row in rows[len(new_active) - 1:]:  # suffixes longer than the sequence: keep _prev[d] aligned
                row.append(NO_OCCURRENCE)
            active = new_active
        self._active = active

    # ----- queries ----------------------------------------------------------------------------------------
    def longest_match(self) -> int:
        """Length of the longest suffix of the sequence that also occurred earlier (0: none), capped at
        ``max_match``."""
        n = len(self._seq)
        for d in range(len(self._active) - 1, 0, -1):
            if self._prev[d][n] != NO_OCCURRENCE:
                return d
        return 0

    def match_at_least(self, length: int) -> bool:
        """Whether the sequence's last ``length`` tokens (1..max_match) occurred earlier: ``longest_match() >=
        length`` in O(1), for a check on every step."""
        self._check_match_length(length)
        return len(self._active) > length and self._prev[length][len(self._seq)] != NO_OCCURRENCE

    def matches(self, max_occurrences: int, min_match: int = 1) -> list[Match]:
        """Earlier occurrences of the sequence's suffixes of ``min_match..max_match`` tokens: those of the
        longest matching suffix first (most recent first), then occurrences of shorter suffixes not yet
        listed; at most ``max_occurrences`` distinct starts. Every start is ``< len(self)``."""
        n = len(self._seq)
        out: list[Match] = []
        seen: set[int] = set()
        for d in range(len(self._active) - 1, max(min_match, 1) - 1, -1):
            chain = self._prev[d]
            s = chain[n]
            while s != NO_OCCURRENCE and len(out) < max_occurrences:
                if s not in seen:
                    seen.add(s)
                    out.append(Match(s, d))
                s = chain[s]
            if len(out) >= max_occurrences:
                break
        return out


    # ----- the proposal -----------------------------------------------------------------------------------
    def propose(self, cfg: "SuffixConfig", calibration):
        """``suffix_proposal(self, cfg, calibration)`` (the reference computation)."""
        from .merge import CandidateTree

        self._check_not_empty()
        matches = self.matches(cfg.max_occurrences, cfg.min_match)
        trie = continuation_trie(self.tokens, matches, cfg.max_depth)
        f = node_features(trie)
        if trie.num_nodes == 1:
            return CandidateTree.single(int(trie.tokens[0])), f
        p = _score(trie, f, calibration)
        if trie.num_nodes > cfg.max_candidates:  # top by p, ties to the lower index: ancestor-closed (p is monotone)
            keep = np.sort(np.lexsort((np.arange(trie.num_nodes), -p))[: cfg.max_candidates])
            new_index = np.zeros(trie.num_nodes, np.int64)
            new_index[keep] = np.arange(keep.size)
            return (CandidateTree(trie.tokens[keep], new_index[trie.parents[keep]], p[keep]),
                    NodeFeatures(f.m_eff[keep], f.role[keep], f.count[keep]))
        return CandidateTree(trie.tokens, trie.parents, p), f


# ----- the continuation trie -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ContinuationTrie:
    """The continuations of a set of earlier occurrences, merged: node 0 is the root (the sequence's last
    token), node i > 0 continues node ``parents[i] < i``. Per node, the features its score is read from."""

    tokens: np.ndarray  # int64 [N]; tokens[0] is the root's (the sequence's last token)
    parents: np.ndarray  # int64 [N]; parents[0] == 0
    depth: np.ndarray  # int64 [N]; tokens after the root
    count: np.ndarray  # int64 [N]; occurrences whose continuation passes through the node (root: all)
    match: np.ndarray  # int64 [N]; longest match length among those occurrences (root: 0)
    periodic: np.ndarray  # bool  [N]; every occurrence reached the node through a periodic extension

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[0])


def continuation_trie(seq: Sequence[int], matches: Sequence[Match], max_depth: int) -> ContinuationTrie:
    """Merge the continuations ``T[s : s + max_depth]`` of ``matches`` (periodically extended past the end of
    ``seq``, see the module docstring) into one trie, in the order given (earlier matches get lower indices).

    Example: seq [1, 2, 9, 1, 2, 8, 1, 2], matches at starts 6 (match 2) and 3 (match 2), max_depth 2 ->
    continuations [1, 2] (T[6:8]) and [8, 1] (T[3:5]): root 2 with children 1 (-> 2) and 8 (-> 1)."""
    n = len(seq)
    tokens, parents, depth, count, match, real = [seq[-1] if n else 0], [0], [0], [len(matches)], [0], [True]
    child: dict[tuple[int, int], int] = {}
    for mt in matches:
        s, m = mt.start, mt.length
        period = n - s  # continuation tokens k >= period come from the periodic extension
        cont = list(seq[s:s + max_depth])
        while len(cont) < max_depth:
            cont.append(cont[len(cont) - period])
        v, k = 0, 0
        while k < max_depth:  # down the nodes earlier continuations already made
            w = child.get((v, cont[k]))
            if w is None:
                break
            count[w] += 1
            if m > match[w]:
                match[w] = m
            real[w] = real[w] or k < period
            v, k = w, k + 1
        r = max_depth - k
        if r:  # the rest is a new chain of r nodes below v, appended in bulk
            first = len(tokens)
            chain_parents = [v] + list(range(first, first + r - 1))
            tokens.extend(cont[k:])
            parents.extend(chain_parents)
            depth.extend(range(k + 1, max_depth + 1))
            count.extend([1] * r)
            match.extend([m] * r)
            real.extend([j < period for j in range(k, max_depth)])
            child.update(zip(zip(chain_parents, cont[k:]), range(first, first + r)))
    return ContinuationTrie(np.asarray(tokens, np.int64), np.asarray(parents, np.int64),
                            np.asarray(depth, np.int64), np.asarray(count, np.int64), np.asarray(match, np.int64),
                            ~np.asarray(real, np.bool_))


# ----- calibration: features -> conditional acceptance ----------------------------------------------------

# ----- the proposal ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SuffixConfig:
    """How the suffix index drafts. ``max_match`` is the trie depth (longest suffix looked up);
    ``max_occurrences`` earlier occurrences are followed; each proposes up to ``max_depth`` tokens;
    occurrences of suffixes shorter than ``min_match`` are ignored; the ``max_candidates`` most probable nodes of
    the continuation trie are kept (root included)."""

    max_match: int = 16
    max_occurrences: int = 8
    max_depth: int = 32
    min_match: int = 1
    max_candidates: int = 64  # candidates offered to the selection, not the step's bound (DraftingConfig.max_nodes)

    def __post_init__(self) -> None:
        for name in ("max_match", "max_occurrences", "max_depth", "min_match", "max_candidates"):
            check_positive("SuffixConfig", name, getattr(self, name))
        if self.min_match > self.max_match:
            raise ConfigError(f"SuffixConfig.min_match={self.min_match} exceeds max_match={self.max_match}")


def score_trie(trie: ContinuationTrie, calibration: SuffixCalibration) -> np.ndarray:
    """float64 [N]: each node's estimated acceptance probability (root 1), by the rule of the module
    docstring: the product down the path of calibrated conditionals, siblings' conditionals capped to sum 1."""
    return _score(trie, node_features(trie), calibration)


def _score(trie: ContinuationTrie, features: NodeFeatures, calibration) -> np.ndarray:
    n = trie.num_nodes
    par = trie.parents
    q = calibration.q(features)
    q[0] = 1.0
    total = np.bincount(par[1:], weights=q[1:], minlength=n)  # summed in node order, as np.add.at would
    q[1:] /= np.maximum(total[par[1:]], 1.0)
    p = q.tolist()
    parents = par.tolist()
    for i in range(1, n):  # parents first
        p[i] *= p[parents[i]]
    return np.asarray(p, np.float64)


def suffix_candidates(index: SuffixIndex, cfg: SuffixConfig, calibration: SuffixCalibration):
    """The scored candidate tree (``draft.merge.CandidateTree``) the index proposes after its sequence; its
    root is the sequence's last token. Only the root when nothing matches."""
    return suffix_proposal(index, cfg, calibration)[0]


def suffix_proposal(index, cfg: SuffixConfig, calibration):
    """``(CandidateTree, NodeFeatures)``: ``suffix_candidates``'s tree and the features its scores were read from,
    node for node (what ``OnlineCalibration.observe`` needs once the step is verified). ``calibration``: a
    ``SuffixCalibration`` or an ``OnlineCalibration``. The index computes it: ``SuffixIndex.propose`` here, a
    ``NativeSuffixIndex`` the same bit for bit in the kernel library (``draft.native_suffix``)."""
    return index.propose(cfg, calibration)
