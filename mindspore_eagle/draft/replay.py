"""Offline replay of a proposer against a known greedy output: the engine's steps without the teacher.

When ``output`` is the teacher's greedy continuation of ``prompt``, greedy verification of any tree is a pure
function of the tree and ``output``: the accepted path is the longest root-to-node path spelling the next
output tokens (``accepted_path``), and the bonus is the output token after it. A proposer that needs no teacher
features (a ``HybridProposer`` of proposer "suffix") therefore runs through exactly the steps it would run in the
engine, with its real ``begin / propose / accept`` calls; ``scripts/replay_suffix.py`` uses this on the committed
evaluation trace, and a test checks it against the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..tree.layout import TreeLayout
from ..verify import Acceptance, children_lists


def accepted_path(layout: TreeLayout, future: Sequence[int]) -> tuple[int, ...]:
    """Node indices, root first, of the longest path whose tokens are ``future[0], future[1], ...``.

    Example: tokens [7, 3, 9, 4], parents [0, 0, 0, 1], future [3, 4, 5] -> (0, 1, 3)."""
    kids = children_lists(layout)
    path = [0]
    for tok in future:
        nxt = next((c for c in kids[path[-1]] if int(layout.tokens[c]) == int(tok)), None)
        if nxt is None:
            break
        path.append(nxt)
    return tuple(path)


@dataclass(frozen=True)
class ReplayStep:
    nodes: int  # proposed nodes, root included
    emitted: int  # accepted drafts + bonus (fewer at the very end of the output)


def replay(proposer, prompt: Sequence[int], output: Sequence[int]) -> list[ReplayStep]:
    """Run ``proposer`` over ``output`` as the engine would (features are empty ``[n, 0]`` arrays). The last
    step is cut where the output ends: its emitted count is what the output still had."""
    out = [int(t) for t in output]
    proposer.begin(list(prompt), np.zeros((len(prompt), 0), np.float32), out[0])
    steps, pos = [], 1
    while pos < len(out):
        layout = proposer.propose(out[pos - 1])
        path = accepted_path(layout, out[pos:])
        remaining = len(out) - pos
        path = path[: remaining]  # keep room for the bonus inside the known output
        tokens = tuple(out[pos:pos + len(path)])  # accepted drafts (len(path) - 1), then the bonus
        proposer.accept(Acceptance(path, tokens, tokens[-1]), np.zeros((len(path), 0), np.float32))
        steps.append(ReplayStep(layout.num_nodes, len(tokens)))
        pos += len(tokens)
    return steps


__all__ = ["ReplayStep", "accepted_path", "replay"]
