"""Scripted proposers that know the teacher's continuation in advance: bounds and test doubles.

``OracleProposer`` ("self-drafting") proposes the teacher's own future greedy tokens as a chain, so every level
is accepted and tau = depth + 1: the speedup it shows is the ceiling of a tree of that depth on this machine
with a draft that costs nothing. ``mode="wrong"`` proposes tokens the teacher never picks (tau = 1, the floor
that measures pure verification overhead). Neither is a real draft: they need the greedy output first.
"""

from __future__ import annotations

from typing import Sequence

from .errors import ConfigError
from .tree import TreeLayout


class OracleProposer:
    def __init__(self, future: Sequence[int], depth: int, vocab_size: int, mode: str = "oracle"):
        if mode not in ("oracle", "wrong"):
            raise ConfigError(f"OracleProposer mode={mode!r}: expected 'oracle' or 'wrong'")
        if depth < 1:
            raise ConfigError(f"OracleProposer depth={depth}: must be >= 1")
        self.future = list(future)  # the teacher's greedy output, first token included
        self.depth, self.vocab, self.mode = depth, vocab_size, mode
        self.max_nodes = depth + 1  # a chain: the root and up to ``depth`` drafts
        self.pos = 0

    def begin(self, prompt, aux_hidden, first_token) -> None:
        self.pos = 1

    def propose(self, root_token: int) -> TreeLayout:
        nxt = self.future[self.pos:self.pos + self.depth]
        if self.mode == "wrong":
            nxt = [(t + 1) % self.vocab for t in nxt]
        return TreeLayout.from_parents([root_token] + nxt, [0] + list(range(len(nxt))))

    def accept(self, acceptance, aux_hidden) -> None:
        self.pos += len(acceptance.tokens)
