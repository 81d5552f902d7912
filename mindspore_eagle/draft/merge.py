"""One speculative tree from two draft sources: the EAGLE-3 head's candidates and the suffix index's.

Scores on one scale. Every candidate carries ``p``, an estimate of the probability that the teacher accepts the
whole path from the root to it (so ``1 + sum(p)`` over a tree estimates the tokens a step emits). EAGLE nodes:
``p = exp(power * cumulative draft log-prob)``, by default ``power = 1``: EAGLE-2's observation that a draft's
confidence approximates its acceptance rate. (The shipped head is somewhat over-confident: its raw p summed over
all candidates overestimates the accepted nodes by 27%, and power 1.1 minimises the log-loss on the replay of
its recorded candidates, ``scripts/replay_suffix.py --eagle``. Yet the adaptive budget with raw p was 1% faster
on both halves of that replay, its growth estimate being conservative, so the default stays 1.) Suffix nodes:
the calibrated estimate of ``draft.suffix``, fitted on a replay so that it *is* an acceptance rate.

Merge rule (``union``):
  1. nodes are identified by their token path from the root: a suffix path that starts with tokens the EAGLE
     candidates already hold reuses those nodes (shared prefixes are verified once);
  2. a node both sources propose gets ``p = max(p_eagle, p_suffix)``: both estimate the same event (that path
     accepted), and the better-informed estimate is the larger one in the replay (a long suffix match) or the
     head (no match);
  3. siblings are exclusive events, but the two sources estimate them separately: where the conditionals
     ``q = p / p(parent)`` of one node's children sum past 1, they are scaled to sum to 1 (top-down, so every
     path's ``p`` stays non-increasing).
Selection (``select``): best-first from the root, the next node kept being the most probable one whose parent
is kept (ties to the lower union index, i.e. EAGLE's order, parents first). Because ``p`` never increases
along a path this is exactly the ``n - 1`` most probable candidates, and it is ancestor-closed by construction.
Layout order: depth-first, most probable child first, so the most probable path is nodes ``0..d``: when it is
the one accepted, the commit moves no row. Every node records its source (``SOURCE_*``)
for traces.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from ..errors import TreeInvariantError
from ..tree.layout import ROOT, TreeLayout

SOURCE_ROOT, SOURCE_EAGLE, SOURCE_SUFFIX, SOURCE_BOTH = 0, 1, 2, 3
"""Bit flags per node: 1 = proposed by the EAGLE head, 2 = by the suffix index (3 = both; 0 = the root)."""

_SUM_TOLERANCE = 1e-6  # float slack before sibling conditionals count as summing past 1


@dataclass(frozen=True, eq=False)
class CandidateTree:
    """Scored draft candidates under one root: node 0 is the root (``p = 1``), ``0 <= parents[i] < i``.

    Candidates need not fit any budget; ``select`` picks from them."""

    tokens: np.ndarray  # int64 [C]
    parents: np.ndarray  # int64 [C]; parents[0] == 0
    probs: np.ndarray  # float64 [C]; estimated acceptance probability of the path root -> node; probs[0] == 1

    def __post_init__(self) -> None:
        tokens = np.asarray(self.tokens, np.int64).reshape(-1)
        parents = np.asarray(self.parents, np.int64).reshape(-1)
        probs = np.asarray(self.probs, np.float64).reshape(-1)
        n = tokens.shape[0]
        if n == 0 or parents.shape[0] != n or probs.shape[0] != n:
            raise TreeInvariantError(f"CandidateTree: tokens {tokens.shape}, parents {parents.shape}, probs "
                                     f"{probs.shape} must be equal and >= 1 (rule: shape)")
        if parents[0] != ROOT:
            raise TreeInvariantError(f"CandidateTree node 0: parent {parents[0]}, must be 0 (rule: root)")
        bad = np.flatnonzero((parents[1:] < 0) | (parents[1:] >= np.arange(1, n)))
        if bad.size:
            i = int(bad[0]) + 1
            raise TreeInvariantError(f"CandidateTree node {i}: parent {parents[i]} not in [0, {i}) (rule: order)")
        if not np.all(np.isfinite(probs) & (probs >= 0) & (probs <= 1 + _SUM_TOLERANCE)):
            raise TreeInvariantError("CandidateTree.probs: every entry must be a probability in [0, 1]")
        probs = np.minimum(probs, 1.0)
        probs[0] = 1.0
        for name, arr in (("tokens", tokens), ("parents", parents), ("probs", probs)):
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[0])

    @classmethod
    def single(cls, root_token: int) -> "CandidateTree":
        return cls([root_token], [ROOT], [1.0])

    @classmethod
    def from_eagle(cls, root_token: int, scores: np.ndarray, tokens: np.ndarray, parents: np.ndarray,
                   power: float = 1.0) -> "CandidateTree":
        """From ``Eagle3Proposer.candidates()``: candidate ``i`` (id ``i + 1``, parent id ``parents[i]``, 0 = root)
        becomes node ``i + 1``; ``p = exp(power * score)`` (a NaN score counts as p = 0)."""
        s = np.asarray(scores, np.float64).reshape(-1)
        p = np.exp(power * np.minimum(np.where(np.isnan(s), -np.inf, s), 0.0))
        return cls(np.concatenate([[root_token], np.asarray(tokens, np.int64).reshape(-1)]),
                   np.concatenate([[ROOT], np.asarray(parents, np.int64).reshape(-1)]),
                   np.concatenate([[1.0], p]))

    @classmethod
    def from_grown(cls, grown, power: float = 1.0) -> "CandidateTree":
        """From a ``GrownTree`` (an already selected EAGLE tree): ``p = exp(power * score)``."""
        layout = grown.layout
        n = layout.num_valid
        return cls(layout.tokens[:n], layout.parents[:n],
                   np.exp(power * np.minimum(grown.scores[:n].astype(np.float64), 0)))


@dataclass(frozen=True, eq=False)
class SourcedCandidates:
    """The union of both sources' candidates (``union``): a CandidateTree plus each node's source flags."""

    tree: CandidateTree
    source: np.ndarray  # int8 [C]; SOURCE_* flags

    def sorted_probs(self) -> np.ndarray:
        """float64 [C - 1]: the non-root probabilities, largest first (what a budget rule needs)."""
        return np.sort(self.tree.probs[1:])[::-1]


@dataclass(frozen=True, eq=False)
class MergedTree:
    """A selected tree: its layout (node 0 = root), each node's ``p`` and source."""

    layout: TreeLayout
    probs: np.ndarray  # float64 [N]; probs[0] == 1
    source: np.ndarray  # int8 [N]; SOURCE_* flags

    @property
    def expected_tokens(self) -> float:
        """Estimated tokens the step emits: every node's acceptance probability, plus the bonus."""
        return float(self.probs.sum())


def union(eagle: CandidateTree | None, suffix: CandidateTree | None) -> SourcedCandidates:
    """Both sources' candidates as one tree, merged by the rule of the module docstring. Either may be None."""
    trees = [(t, flag) for t, flag in ((eagle, SOURCE_EAGLE), (suffix, SOURCE_SUFFIX)) if t is not None]
    if not trees:
        raise TreeInvariantError("union: at least one candidate tree is required")
    root = int(trees[0][0].tokens[0])
    if any(int(t.tokens[0]) != root for t, _ in trees):
        raise TreeInvariantError(f"union: the candidate trees have different roots "
                                 f"{[int(t.tokens[0]) for t, _ in trees]}")
    if len(trees) == 1:
        tree, flag = trees[0]
        if len(set(zip(tree.parents[1:].tolist(), tree.tokens[1:].tolist()))) == tree.num_nodes - 1:
            # already a trie (no two children of one node share a token): the loop below would copy it node for
            # node, so take it as it is (a step the head did not grow drafts from the suffix tree alone)
            source = np.full(tree.num_nodes, flag, np.int8)
            source[0] = SOURCE_ROOT
            return SourcedCandidates(tree, source)
    tokens, parents, probs, source = [root], [ROOT], [1.0], [SOURCE_ROOT]
    node_of: dict[tuple[int, int], int] = {}  # (union parent, token) -> union node
    for tree, flag in trees:
        remap = np.zeros(tree.num_nodes, np.int64)  # tree node -> union node
        tt, tp, pp = tree.tokens.tolist(), tree.parents.tolist(), tree.probs.tolist()
        for i in range(1, tree.num_nodes):
            key = (int(remap[tp[i]]), tt[i])
            u = node_of.get(key)
            if u is None:
                u = len(tokens)
                node_of[key] = u
                tokens.append(tt[i])
                parents.append(key[0])
                probs.append(pp[i])
                source.append(flag)
            else:
                probs[u] = max(probs[u], pp[i])
                source[u] |= flag
            remap[i] = u
    p = np.asarray(probs, np.float64)
    par = np.asarray(parents, np.int64)
    if len(trees) > 1:
        p = _normalize_siblings(p, par)
    return SourcedCandidates(CandidateTree(tokens, par, p), np.asarray(source, np.int8))


def _normalize_siblings(p: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """Scale the children's conditionals of every node whose conditionals sum past 1 (rule 3).

    Example: root children with p 0.8 (EAGLE) and 0.6 (suffix): conditionals sum to 1.4 -> 0.571, 0.429."""
    n = p.shape[0]
    p_par = p[parents]
    q = np.divide(p, p_par, out=np.zeros(n), where=p_par > 0)
    q[0] = 1.0
    total = np.zeros(n)
    np.add.at(total, parents[1:], q[1:])
    scale = np.where(total > 1 + _SUM_TOLERANCE, total, 1.0)
    q[1:] /= scale[parents[1:]]
    out = np.empty(n)
    out[0] = 1.0
    for i in range(1, n):  # parents first, so out[parent] is final
        out[i] = out[parents[i]] * q[i]
    return out


def children_of(parents) -> list[list[int]]:
    """Each node's children in index order, from a parent array (``parents[i] < i`` for ``i > 0``)."""
    children: list[list[int]] = [[] for _ in range(len(parents))]
    for i, par in enumerate(list(parents)[1:], start=1):
        children[int(par)].append(i)
    return children


def best_first(children: list[list[int]], rank, max_nodes: int) -> list[int]:
    """The one selection of the draft side: node 0 (the root) and the best ``max_nodes - 1`` others, taken
    best-first from the root -- the next node kept is the highest-ranked one whose parent is kept (ties to the
    lower index, so a parent precedes an equally ranked child; NaN ranks last). ``children``: ``children_of`` the
    parent array. With ranks that never increase along a path (log-probs, path probabilities) this is exactly the
    top ``max_nodes - 1``; whatever the ranks, the kept set is ancestor-closed. Returns the kept nodes in the order
    taken (root first). Used by the head's growth (``grow.select_tree``) and the merged tree (``select``)."""
    if max_nodes < 1:
        raise TreeInvariantError(f"select: max_nodes={max_nodes}, must be >= 1")
    rank = [float("-inf") if r != r else r for r in (rank.tolist() if hasattr(rank, "tolist") else rank)]
    kept = [ROOT]
    ready = [(-rank[c], c) for c in children[ROOT]]
    heapq.heapify(ready)
    while ready and len(kept) < max_nodes:
        _, c = heapq.heappop(ready)
        kept.append(c)
        for g in children[c]:
            heapq.heappush(ready, (-rank[g], g))
    return kept


def select(cands: SourcedCandidates, max_nodes: int) -> MergedTree:
    """Keep the root and the ``max_nodes - 1`` best candidates (``best_first`` by path probability), laid out
    depth-first with the most probable child first (see the module docstring)."""
    tree = cands.tree
    if max_nodes == 1:  # the root alone (the adaptive rule's most common choice where rows are dear)
        return MergedTree(TreeLayout.from_parents(tree.tokens[:1], [ROOT]), tree.probs[:1].copy(),
                          cands.source[:1].copy())
    prob = tree.probs.tolist()
    children = children_of(tree.parents.tolist())
    keep = set(best_first(children, prob, max_nodes))
    order: list[int] = []
    stack = [ROOT]
    while stack:  # depth-first; the most probable child is pushed last, so it is visited first
        v = stack.pop()
        order.append(v)
        stack.extend(sorted((c for c in children[v] if c in keep), key=lambda c: (prob[c], -c)))
    new_index = {v: i for i, v in enumerate(order)}
    old = np.asarray(order, np.int64)
    new_parents = [new_index[int(tree.parents[v])] for v in order]
    layout = TreeLayout.from_parents(tree.tokens[old], new_parents)
    return MergedTree(layout, tree.probs[old].copy(), cands.source[old].copy())


def merge_trees(eagle: CandidateTree | None, suffix: CandidateTree | None, max_nodes: int) -> MergedTree:
    """One tree of at most ``max_nodes`` nodes from EAGLE and suffix candidates: ``select(union(...))``."""
    return select(union(eagle, suffix), max_nodes)


__all__ = ["CandidateTree", "MergedTree", "SOURCE_BOTH", "SOURCE_EAGLE", "SOURCE_ROOT", "SOURCE_SUFFIX",
           "SourcedCandidates", "best_first", "children_of", "merge_trees", "select", "union"]
