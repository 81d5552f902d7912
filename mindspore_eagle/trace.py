"""Structured traces: one record per speculative step, written as JSON lines.

The schema is this dataclass (field names are the JSON keys). ``draft_ms`` is the proposer's tree growth,
``verify_ms`` the host checks + mask + teacher forward (``teacher_ms`` of it is the forward alone), and
``commit_ms`` acceptance + cache commit + the draft's catch-up.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import IO, Any


@dataclass(frozen=True)
class StepTrace:
    step: int  # 0-based speculative cycle within the request
    committed_len: int  # L before the step (cache rows holding committed tokens)
    tree_nodes: int  # real nodes verified (root included)
    bucket: int  # static row count the forward was padded to
    depth: int  # deepest node of the tree
    accepted_len: int  # accepted draft tokens (bonus excluded)
    bonus: int  # the teacher's token after the accepted path
    path: tuple[int, ...]  # accepted node indices, root first
    tokens: tuple[int, ...]  # tokens emitted by the step: accepted drafts then the bonus
    commit_mode: str  # "length" or "path_index"
    draft_ms: float
    verify_ms: float
    commit_ms: float
    teacher_ms: float

    @property
    def emitted(self) -> int:
        return len(self.tokens)

    def to_json(self, **extra: Any) -> str:
        d = dataclasses.asdict(self)
        d.update(extra)
        return json.dumps(d, separators=(",", ":"))


def write_steps(f: IO[str], steps, **extra: Any) -> None:
    """Append one JSON line per step (``extra`` keys, e.g. the turn id, are added to every line)."""
    for s in steps:
        f.write(s.to_json(**extra) + "\n")
