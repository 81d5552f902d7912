"""Acceptance: which part of a verified tree the teacher keeps, and the bonus token after it.

The teacher's verification forward gives, for every node ``i`` of the tree, its distribution over the token
that follows node ``i`` (``logits[i]``). Acceptance walks down from the root:

* **greedy** -- move to the child whose token equals the teacher's argmax at the current node (the lowest
  node index if siblings repeat a token); stop when no child matches. The argmax at the stopping node is the
  bonus. Every emitted token is therefore the teacher's own greedy choice: output equals greedy decoding.
  It needs only the argmax of every node (``argmax[i]``, numpy's tie rule), which the teacher computes in its
  graph (``Teacher.forward(..., output="argmax")``), not the logits.
* **sampling** -- multi-candidate rejection sampling with deterministic drafts (SpecInfer / EAGLE): at the
  current node with target distribution ``p``, try the children in index order; child token ``x`` is
  accepted with probability ``p(x)`` (the draft put all its mass on ``x``); when rejected, ``p(x)`` is set
  to zero and ``p`` renormalised (the *residual*). If a child is accepted, descend and repeat with that
  node's ``p``; if all are rejected (or the node is a leaf), the bonus is sampled from the residual. Each
  step emits exactly a sample of the teacher's distribution, so output is distributed as teacher-only
  sampling with the same ``SamplingParams``.

Terms (root, node, accepted, bonus) as defined in ``mindspore_eagle.tree``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

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
        kth = np.sort(z)[-min(params.top_k, z.size)]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if params.top_p < 1:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, params.top_p) + 1)]
        mask = np.zeros_like(p, bool)
        mask[keep] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return p


@dataclass(frozen=True)
class Acceptance:
    """Result of verifying one tree.

    ``path`` are node indices root -> last accepted node (``path[0] == 0``); ``tokens`` are the tokens this
    step emits: the accepted drafts (tokens of ``path[1:]``) followed by the bonus.
    """

    path: tuple[int, ...]
    tokens: tuple[int, ...]
    bonus: int

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
            return Acceptance(tuple(path), tokens, target)
        path.append(nxt)


def accept_sampling(layout: TreeLayout, logits: np.ndarray, params: SamplingParams,
                    rng: np.random.Generator) -> Acceptance:
    """Lossless multi-candidate acceptance for deterministic drafts (see the module docstring); ``logits [N, V]``,
    since every node's whole distribution may be needed (greedy ``params``: ``accept_greedy`` of their argmax)."""
    if params.greedy:
        return accept_greedy(layout, np.argmax(logits, -1))
    kids = children_lists(layout)
    path = [0]
    while True:
        cur = path[-1]
        p = target_probs(logits[cur], params)
        accepted = None
        for c in kids[cur]:
            x = int(layout.tokens[c])
            if p[x] > 0 and rng.random() < p[x]:
                accepted = c
                break
            # Rejected: the residual drops x. It keeps positive mass, since x was rejected only if p(x) < 1.
            p[x] = 0.0
            p /= p.sum()
        if accepted is None:
            bonus = int(rng.choice(p.size, p=p))
            tokens = tuple(int(layout.tokens[n]) for n in path[1:]) + (bonus,)
            return Acceptance(tuple(path), tokens, bonus)
        path.append(accepted)


def sample_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """One token from the teacher's distribution (teacher-only sampling and the one-node tree alike)."""
    if params.greedy:
        return int(np.argmax(logits))
    p = target_probs(logits, params)
    return int(rng.choice(p.size, p=p))
