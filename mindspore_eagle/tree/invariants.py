"""Host-side invariant checks for TreeLayout, run before any graph sees the tree.

Inside a compiled graph a bad index is not an exception: on Ascend a negative or out-of-range gather index
is undefined behaviour and a malformed mask silently mixes branches. So every rule a kernel relies on is
checked here, on the host, with a message that names the first offending node and the broken rule. The
checks are vectorised numpy over ``[N]`` arrays (O(N); only the error path walks a parent chain), cheap enough
to run every step in reference mode and once per step before the fused forward in performance mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from mindspore_eagle.errors import ConfigError, TreeInvariantError
from mindspore_eagle.tree.layout import ROOT

if TYPE_CHECKING:
    from mindspore_eagle.tree.layout import TreeLayout


def _first(bad: np.ndarray) -> int | None:
    """Index of the first True in ``bad``, or None."""
    hits = np.flatnonzero(bad)
    return int(hits[0]) if hits.size else None


def _describe_backward_parent(parents: np.ndarray, node: int) -> str:
    """Name the rule broken by ``parents[node] >= node``: self-loop, cycle, or plain order violation.

    Walks up from ``node`` at most N steps (indices are known to be in range here); only runs on the error
    path. Example: parents [0, 2, 1] at node 1 -> "cycle 1 -> 2 -> 1".
    """
    p = int(parents[node])
    if p == node:
        return f"node {node}: parent is itself (rule: no self-loop)"
    chain = [node]
    cur = p
    for _ in range(parents.shape[0]):
        chain.append(cur)
        if cur == node:
            return f"node {node}: parent cycle {' -> '.join(map(str, chain))} (rule: no cycles)"
        if cur == ROOT:
            break
        cur = int(parents[cur])
    return f"node {node}: parent {p} >= own index {node} (rule: topological order, 0 <= parent < index)"


def _check_below_root(parents: np.ndarray, depth: np.ndarray, valid: np.ndarray) -> None:
    """``check_tree``'s rules for the nodes below the root: index range, order, closure, padding, depth."""
    n = parents.shape[0]
    # Node i > 0 needs 0 <= parents[i] < i, which also implies parents[i] < N.
    if ((parents[1:] < 0) | (parents[1:] >= np.arange(1, n))).any():
        bad = _first(parents < 0)
        if bad is not None:
            raise TreeInvariantError(
                f"node {bad}: negative parent {int(parents[bad])} (rule: index range, no negative index)"
            )
        bad = _first(parents >= n)
        if bad is not None:
            raise TreeInvariantError(f"node {bad}: parent {int(parents[bad])} >= num_nodes {n} (rule: index range)")
        raise TreeInvariantError(_describe_backward_parent(parents, _first(parents[1:] >= np.arange(1, n)) + 1))

    orphan = valid & ~valid[parents]
    if orphan.any():
        bad = _first(orphan)
        raise TreeInvariantError(
            f"node {bad}: real node under padding row {int(parents[bad])} (rule: closure, a real node's parent is real)"
        )
    pad = ~valid
    stray = pad & (parents != ROOT)
    if stray.any():
        bad = _first(stray)
        raise TreeInvariantError(
            f"node {bad}: padding row has parent {int(parents[bad])}, must be 0 (rule: padding inert)"
        )
    late = valid[1:] & pad[:-1]  # late[i - 1]: real node i right after a padding row
    if late.any():
        bad = _first(late) + 1
        raise TreeInvariantError(f"node {bad}: real node after a padding row (rule: padding rows come last)")

    expected = depth[parents] + 1
    wrong = depth[1:] != expected[1:]
    if wrong.any():
        bad = _first(wrong) + 1
        rule = "padding inert, padding depth is PAD_DEPTH" if pad[bad] else "depth consistency"
        raise TreeInvariantError(
            f"node {bad}: depth {int(depth[bad])}, expected {int(expected[bad])} "
            f"(parent {int(parents[bad])} at depth {int(depth[parents[bad]])}) (rule: {rule})"
        )


def check_tree(layout: "TreeLayout", vocab_size: int) -> None:
    """Raise TreeInvariantError naming the first node that breaks a layout rule; return None if all hold.

    Rules, in the order checked (earlier rules make later ones well defined):
      root          node 0 is real, its own parent, at depth 0;
      index range   every parent in [0, N) (no negative index);
      order         node i > 0 has parent < i: no self-loop, no cycle, topological order;
      closure       a real node's parent is real (padding can never be an ancestor of a real node);
      padding       padding rows hang off the root at PAD_DEPTH, after every real node;
      depth         depth[i] == depth[parents[i]] + 1 for i > 0 (padding hangs off the root, so PAD_DEPTH);
      tokens        every token in [0, vocab_size).
    """
    if vocab_size < 1:
        raise ConfigError(f"vocab_size={vocab_size}: must be >= 1")
    tokens, parents, depth, valid = layout.tokens, layout.parents, layout.depth, layout.valid
    n = parents.shape[0]
    # Each rule is one vectorised test plus one .any(); _first() and the message run only on failure.

    if not valid[0]:
        raise TreeInvariantError("node 0: root is marked invalid (rule: root is a real node)")
    if parents[0] != ROOT:
        raise TreeInvariantError(f"node 0: root parent is {int(parents[0])}, must be 0 (rule: root is its own parent)")
    if depth[0] != 0:
        raise TreeInvariantError(f"node 0: root depth is {int(depth[0])}, must be 0 (rule: root depth)")

    if n > 1:  # a root alone (one per plainly decoding request of a batch step) skips ~20 us of vectorised rules
        _check_below_root(parents, depth, valid)
    if tokens.min() < 0 or tokens.max() >= vocab_size:
        bad = _first((tokens < 0) | (tokens >= vocab_size))
        raise TreeInvariantError(f"node {bad}: token {int(tokens[bad])} not in [0, {vocab_size}) (rule: token range)")

