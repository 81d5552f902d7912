"""Structured traces: one record per speculative step (``StepTrace``) and, in evaluation traces, one per turn
(``TurnSummary``), written as JSON lines; ``read_trace`` reads an evaluation trace back.

The schema is these dataclasses (field names are the JSON keys). A step's time is split into five phases
that add up to the step (``engine.SpeculativeEngine._step``):

  grow_ms    the proposer's ``propose``: draft tree growth (EAGLE-3 forwards, suffix lookup, merging)
  verify_ms  the teacher's verification forward, device transfer of its results included
  commit_ms  the teacher cache commit (row moves of the accepted path)
  update_ms  the proposer's ``accept``: the draft head's catch-up forward on the committed tokens
  host_ms    everything else on the host: tree checks, padding, mask, acceptance

Traces written before this split (``draft_ms``, ``teacher_ms``, a ``commit_ms`` that included the draft's
catch-up, ``commit_mode``) are read as legacy steps: grow = draft, verify = teacher, host = the old verify
minus the forward, commit = the old commit (the draft's catch-up included), update = 0.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import IO, Any

SHARD_GLOB = "shard-*.jsonl"  # an evaluation worker's trace file (``evaluate.shard_path``)
MERGED_NAME = "merged.jsonl"  # the merged trace of an evaluation directory


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
    grow_ms: float
    verify_ms: float
    commit_ms: float
    update_ms: float
    host_ms: float

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


# ----- evaluation traces ------------------------------------------------------------------------------------
# An evaluation trace file (``mindspore-eagle eval``) is JSON lines of three records, told apart by "record":
#   "run"   a header per session of a worker: {"record": "run", "config": {...}, "rank", "world", "selected"}
#   "step"  one StepTrace of a turn's speculative generation, plus "turn": the turn id
#   "turn"  one TurnSummary, written after that turn's step lines (the whole block in one write + fsync)
# A turn counts only once its summary line is read; step lines with no summary after them (an interrupted
# write) are dropped by ``read_trace``.


@dataclass(frozen=True)
class TurnSummary:
    """One evaluated turn: the teacher-only greedy run and the speculative run on the same prompt."""

    turn: str  # stable id: "mtbench-081-t2", "humaneval-000"
    category: str  # MT-Bench category, "humaneval", or a custom set's
    seed: int  # derived from the turn id (crc32), never from the rank: the seed of any sampling in the turn
    rank: int  # the worker that ran it (informational: results do not depend on it)
    prompt_tokens: int
    tokens: int  # new tokens of the greedy output
    spec_tokens: int  # new tokens of the speculative output
    stop_reason: str  # greedy's: "eos" | "max_new_tokens" | "cache_full"
    greedy_s: float  # wall time of the whole request, prefill included
    spec_s: float
    greedy_ttft_s: float
    spec_ttft_s: float
    greedy_tok_s: float  # tokens / greedy_s
    spec_tok_s: float
    speedup: float  # spec_tok_s / greedy_tok_s
    cycles: int  # speculative steps (teacher verification forwards after the prefill)
    emitted: int  # tokens those steps emitted, bonus included (sum of StepTrace.emitted)
    tau: float | None  # emitted / cycles: mean tokens per cycle (None when the turn had no cycle)
    spec_teacher_s: float  # spec time inside teacher forwards (prefill + verification)
    spec_draft_s: float  # spec time in the proposer: tree growth + the draft's catch-up (grow + update phases)
    lossless: bool  # speculative tokens == greedy tokens
    output_ids: tuple[int, ...]  # the greedy output: the next turn of the conversation is conditioned on it
    spec_ids: tuple[int, ...] | None = None  # the speculative output when it differs from greedy, else None
    spec_host_s: float | None = None  # spec host time of the steps (checks, mask, acceptance); None in legacy traces

    def to_json(self) -> str:
        d = {"record": "turn", **dataclasses.asdict(self)}
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "TurnSummary":
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["output_ids"] = tuple(kw["output_ids"])
        if kw.get("spec_ids") is not None:
            kw["spec_ids"] = tuple(kw["spec_ids"])
        return cls(**kw)


def step_from_dict(d: dict) -> StepTrace:
    if "teacher_ms" in d:  # a legacy trace: see the module docstring
        d = {**d, "grow_ms": d["draft_ms"], "host_ms": d["verify_ms"] - d["teacher_ms"],
             "verify_ms": d["teacher_ms"], "update_ms": 0.0}
    names = {f.name for f in dataclasses.fields(StepTrace)}
    kw = {k: v for k, v in d.items() if k in names}
    kw["path"], kw["tokens"] = tuple(kw["path"]), tuple(kw["tokens"])
    return StepTrace(**kw)


@dataclass
class TraceFile:
    """What ``read_trace`` found in one file. ``good_bytes`` ends the last complete record block: appending
    after truncating there drops a torn tail and orphan step lines."""

    path: str
    headers: list  # the "run" records, in order
    turns: list  # TurnSummary, in file order
    steps: dict  # turn id -> list[StepTrace] (only turns with a summary)
    orphan_steps: int  # step lines of turns that never got a summary (interrupted)
    torn: bool  # the file ended inside a line
    good_bytes: int


def read_trace(path: str) -> TraceFile:
    """Parse an evaluation trace (``.jsonl``, or ``.jsonl.gz`` as committed under results/). A bad line is
    tolerated only at the very end (a torn write); anywhere else it is an error naming the line."""
    import gzip

    from .errors import ConfigError

    headers, turns, steps, pending = [], [], {}, {}
    good, offset, torn = 0, 0, False
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        lines = f.read().split(b"\n")
    last = len(lines) - 1  # after the final newline split() yields b"" (or a torn fragment)
    for n, raw in enumerate(lines):
        end = offset + len(raw) + (0 if n == last else 1)
        if n == last:
            torn = raw.strip() != b""
            break
        try:
            d = json.loads(raw)
            kind = d["record"]
        except (ValueError, KeyError, TypeError):
            if n == last - 1 and not lines[last]:
                torn = True  # a torn line that was followed by nothing else
                break
            raise ConfigError(f"{path}:{n + 1}: not a trace record") from None
        if kind == "run":
            headers.append(d)
            good = end
        elif kind == "step":
            pending.setdefault(d["turn"], []).append(step_from_dict(d))
        elif kind == "turn":
            s = TurnSummary.from_dict(d)
            turns.append(s)
            steps[s.turn] = pending.pop(s.turn, [])
            good = end
        else:
            raise ConfigError(f"{path}:{n + 1}: unknown record {kind!r}")
        offset = end
    return TraceFile(path, headers, turns, steps, sum(len(v) for v in pending.values()), torn, good)
