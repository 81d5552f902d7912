"""Acceptance: which part of a verified tree the teacher keeps, and the bonus token after it.

The teacher's verification forward gives, for every node ``i`` of the tree, its distribution over the token
that follows node ``i`` (``logits[i]``). Acceptance walks down from the root:

* **greedy** -- move to the child whose token equals the teacher's argmax at the current node (the lowest
  node index if siblings repeat a token); stop when no child matches. The argmax at the stopping node is the
  bonus. Every emitted token is therefore the teacher's own greedy choice: output equals greedy decoding.
  It needs only the argmax of every node (``argmax[i]``, numpy's tie rule), which the teacher computes in its
  graph (``Teacher.forward(..., output="argmax")``), not the logits.
* **sampling** -- position-keyed Gumbel-max: the token at sequence position ``t`` is
  ``argmax_v(log p(v) + g_t(v))``, where ``p`` is the teacher's distribution after the context (temperature,
  top-k, top-p: ``target_probs``) and ``g_t`` is Gumbel noise drawn from a counter-based stream keyed by
  (seed, t) (``PositionNoise``). Acceptance is then greedy acceptance of that target: at the current node (depth
  ``d``, its next token at position ``t = base + d``) move to the child whose token equals the target, else emit
  the target as the bonus. Why: (1) exact -- for a fixed context, Gumbel-max with fresh noise is an exact sample
  of ``p``, and each position's noise is independent of every other position's, so the emitted sequence is
  distributed as teacher-only sampling; (2) a draft ``x`` is accepted with probability ``p(x)`` and a set of
  sibling drafts with their total probability, the most any lossless scheme accepts for candidates fixed before
  verification (as SpecInfer / EAGLE's recursive rejection sampling); (3) reproducible -- the emitted token at
  position ``t`` depends only on the seed, the position and the context, not on the tree, the proposer, the
  budget, the warm-up or the batch: the same seed gives the same text with or without speculation.

Terms (root, node, accepted, bonus) as defined in ``mindspore_eagle.tree``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from .errors import ConfigError
from .tree.layout import TreeLayout


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` means greedy. ``top_k == 0`` and ``top_p == 1`` disable those filters. ``seed`` is any
    integer >= 0 (what ``np.random.default_rng`` takes); every field is type-checked here, so a bad value fails
    at construction and not at the first sampled token."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if not _is_real(self.temperature) or not 0 <= self.temperature < math.inf:
            raise ConfigError(f"SamplingParams.temperature={self.temperature!r}: must be a finite number >= 0")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ConfigError(f"SamplingParams.top_p={self.top_p!r}: must be a number in (0, 1]")
        for name in ("top_k", "seed"):  # the seed seeds numpy's generator, which takes non-negative ints only
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"SamplingParams.{name}={value!r}: must be an integer >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def target_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The teacher's sampling distribution for one row of logits ``[V]`` after temperature, top-k, top-p.

    Shared by teacher-only sampling and speculative acceptance, so both sample the very same distribution.
    top-p keeps the smallest set of most likely tokens whose mass reaches ``top_p`` (ties by token id).
    """
    z = logits.astype(np.float64) / params.temperature
    if params.top_k:
        k = min(params.top_k, z.size)
        kth = np.partition(z, z.size - k)[z.size - k]  # the k-th largest: np.sort(z)[-k] without sorting V values
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if params.top_p < 1:
        mask = np.zeros_like(p, bool)
        mask[nucleus(p, params.top_p)] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return p


NUCLEUS_FIRST = 64
"""Tokens ``nucleus`` ranks first (then 8x more, until the mass is reached or the whole vocabulary is ranked)."""


def nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """The ids top-p keeps: the shortest prefix of the tokens in decreasing ``p`` (ties by id) whose cumulative mass
    (``np.cumsum`` in that order) reaches ``top_p``; all of them when it never does.

    Why not one stable sort of the vocabulary: it cost ~5 ms per sampled position (V = 49,152; a decode forward
    is ~10 ms), and the mass sits in a few tokens. So the ``m`` most likely are ranked first: every token at least
    as likely as the ``m``-th (ties included, in id order) is exactly the first entries of the full order, and a
    cumulative sum is sequential, so its prefix is the full sum's prefix, bit for bit. If the mass is reached
    inside them, that is the answer; else ``m`` grows. Same ids as the full sort, always."""
    def ranked(ids: np.ndarray) -> tuple[np.ndarray, int]:
        """``ids`` (increasing) in decreasing p, ties in id order, and the index where their mass reaches top_p."""
        order = ids[np.argsort(-p[ids], kind="stable")]
        return order, int(np.searchsorted(np.cumsum(p[order]), top_p))

    size = p.size
    m = NUCLEUS_FIRST
    while m < size:
        threshold = np.partition(p, size - m)[size - m]  # the m-th largest probability
        # fewer than m tokens have mass (top-k ran before): just those, the zeros after them add nothing to the sum
        order, j = ranked(np.flatnonzero(p >= threshold) if threshold > 0 else np.flatnonzero(p > 0))
        if j < order.size:
            return order[:j + 1]
        if threshold == 0:
            break  # every token with mass did not reach top_p: all of them (the full order below)
        m *= 8
    order, j = ranked(np.arange(size))
    return order[:j + 1]


@dataclass(frozen=True)
class Acceptance:
    """Result of verifying one tree.

    ``path`` are node indices root -> last accepted node (``path[0] == 0``); ``tokens`` are the tokens this
    step emits: the accepted drafts (tokens of ``path[1:]``) followed by the bonus. ``nodes``: the verified
    tree's nodes, root included (0: not recorded). The engine may verify fewer nodes than were proposed (the root
    alone, near the end of the cache); a proposer that learns step costs must charge the tree that ran.
    """

    path: tuple[int, ...]
    tokens: tuple[int, ...]
    bonus: int
    nodes: int = field(default=0, compare=False)  # what was verified, not what was accepted

    @property
    def num_accepted(self) -> int:
        """Accepted draft tokens (0 when only the bonus is emitted)."""
        return len(self.path) - 1


def children_lists(layout: TreeLayout) -> list[list[int]]:
    """Valid children of every node, in increasing index order (O(N))."""
    kids: list[list[int]] = [[] for _ in range(layout.num_nodes)]
    for i in range(1, layout.num_nodes):
        if layout.valid[i]:
            kids[int(layout.parents[i])].append(i)
    return kids


def accept_greedy(layout: TreeLayout, argmax: np.ndarray) -> Acceptance:
    """Longest root-to-node path whose every token is the teacher's argmax at its parent, plus the bonus.

    ``argmax [>= num_nodes]`` int: the teacher's greedy next token after each node (rows past the tree's are
    padding and never read)."""
    argmax = np.asarray(argmax)
    if argmax.ndim != 1 or argmax.shape[0] < layout.num_nodes or not np.issubdtype(argmax.dtype, np.integer):
        raise ConfigError(f"accept_greedy: argmax must be integer token ids [>= {layout.num_nodes}] (one per node), "
                          f"got {argmax.dtype} {argmax.shape}; from logits, pass np.argmax(logits, -1)")
    kids = children_lists(layout)
    path = [0]
    while True:
        cur = path[-1]
        target = int(argmax[cur])
        nxt = next((c for c in kids[cur] if int(layout.tokens[c]) == target), None)
        if nxt is None:
            tokens = tuple(int(layout.tokens[n]) for n in path[1:]) + (target,)
            return Acceptance(tuple(path), tokens, target, layout.num_nodes)
        path.append(nxt)


class PositionNoise:
    """Gumbel noise per sequence position from a counter-based stream keyed by (seed, position): the same
    (seed, position) always gives the same vector, distinct positions independent vectors (NumPy's Philox keyed by
    a ``SeedSequence(seed, spawn_key=(position,))``: any integer seed >= 0). A few recent positions are cached
    (a tree verification reads one vector per depth; a step's next tree starts where it ended)."""

    def __init__(self, seed: int, keep: int = 64):
        self.seed = int(seed)
        self._cache: dict[tuple[int, int], np.ndarray] = {}
        self._keep = keep

    def gumbel(self, position: int, size: int) -> np.ndarray:
        key = (int(position), int(size))
        g = self._cache.get(key)
        if g is None:
            ss = np.random.SeedSequence(self.seed, spawn_key=(int(position),))
            g = np.random.Generator(np.random.Philox(ss)).gumbel(size=size)
            if len(self._cache) >= self._keep:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = g
        return g


def gumbel_target(logits: np.ndarray, params: SamplingParams, noise: PositionNoise, position: int) -> int:
    """The token at ``position``: ``argmax(log p + g_position)`` over the support of ``p`` (module docstring)."""
    p = target_probs(logits, params)
    with np.errstate(divide="ignore"):
        score = np.log(p) + noise.gumbel(position, p.size)
    return int(np.argmax(score))  # log 0 = -inf: never outside the support (p has positive mass somewhere)


def accept_sampling(layout: TreeLayout, logits: np.ndarray, params: SamplingParams, noise: PositionNoise,
                    position: int) -> Acceptance:
    """Lossless, reproducible acceptance for deterministic drafts (module docstring); ``logits [N, V]`` of every
    node, ``position``: the sequence position of the token after the root (the root's position + 1). Greedy
    ``params``: ``accept_greedy`` of the argmax."""
    if params.greedy:
        return accept_greedy(layout, np.argmax(logits, -1))
    depth = layout.depth
    kids = children_lists(layout)
    path = [0]
    while True:
        cur = path[-1]
        target = gumbel_target(logits[cur], params, noise, position + int(depth[cur]))
        nxt = next((c for c in kids[cur] if int(layout.tokens[c]) == target), None)
        if nxt is None:
            tokens = tuple(int(layout.tokens[n]) for n in path[1:]) + (target,)
            return Acceptance(tuple(path), tokens, target, layout.num_nodes)
        path.append(nxt)


def sample_token(logits: np.ndarray, params: SamplingParams, noise: PositionNoise, position: int) -> int:
    """The token at ``position`` from the teacher's distribution (teacher-only sampling, the prefill's first token)."""
    if params.greedy:
        return int(np.argmax(logits))
    return gumbel_target(logits, params, noise, position)
