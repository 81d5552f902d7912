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

Traces are files users keep, merge and edit, so reading one checks every record against that schema where it
is parsed (``_fields``): a missing field, a string where a number belongs, a negative count or a zero request
time is a ConfigError naming ``file:line`` and the field, not an exception deep inside ``report``'s numpy.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from dataclasses import dataclass
from typing import IO, Any

from ..errors import ConfigError

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
# An evaluation trace file (``mindspore-eagle eval``) is JSON lines of four records, told apart by "record":
#   "run"   a header per session of a worker: {"record": "run", "config": {...}, "rank", "world", "selected"}
#   "step"  one StepTrace of a turn's speculative generation, plus "turn": the turn id
#   "turn"  one TurnSummary, written after that turn's step lines (the whole block in one write + fsync)
#   "skip"  one SkippedTurn: a turn that could not run (its prompt does not fit the cache), with the reason
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
    accepted_eagle: int | None = None  # accepted draft tokens proposed by the EAGLE-3 head only (None: not recorded)
    accepted_suffix: int | None = None  # ... by the suffix index only
    accepted_both: int | None = None  # ... by both sources (the merged tree shared the node)

    def to_json(self) -> str:
        d = {"record": "turn", **dataclasses.asdict(self)}
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "TurnSummary":
        """A summary from its JSON record, every field checked (ConfigError naming the field)."""
        return cls(**_fields(cls, d, "turn"))


def step_from_dict(d: dict) -> StepTrace:
    """A step from its JSON record, every field checked (ConfigError naming the field). A legacy record (see the
    module docstring) is mapped onto the current phases first."""
    if "teacher_ms" in d and "grow_ms" not in d:
        for k in ("draft_ms", "verify_ms", "teacher_ms"):
            v = d.get(k)
            if not (_is_real(v) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"step record: {k}={v!r}: must be a finite number >= 0")
        d = {**d, "grow_ms": d["draft_ms"], "host_ms": max(0.0, d["verify_ms"] - d["teacher_ms"]),
             "verify_ms": d["teacher_ms"], "update_ms": 0.0}
    return StepTrace(**_fields(StepTrace, d, "step"))


# Wall times of a whole request: the report divides by their sums, and a real request always takes time.
_POSITIVE = ("greedy_s", "spec_s")


def _fields(cls: type, d: dict, kind: str) -> dict:
    """The fields of dataclass ``cls`` taken from record ``d``, each checked against its annotation: ``int``
    (an integer >= 0), ``float`` (finite, >= 0; > 0 for ``_POSITIVE``), ``str``, ``bool``, ``tuple[int, ...]``
    (a JSON list of integers >= 0, returned as a tuple), any of them ``| None``. Other keys are ignored."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            if f.default is dataclasses.MISSING:
                raise ConfigError(f"{kind} record: missing field {f.name!r}")
            continue
        value, optional = d[f.name], f.type.endswith(" | None")
        base = f.type.removesuffix(" | None")
        if value is None and optional:
            out[f.name] = None
            continue
        if base == "int":
            ok, rule = _is_int(value) and value >= 0, "an integer >= 0"
        elif base == "float":
            low = 0.0 if f.name not in _POSITIVE else math.nextafter(0.0, 1.0)
            ok = _is_real(value) and math.isfinite(value) and value >= low
            rule = "a finite number > 0" if f.name in _POSITIVE else "a finite number >= 0"
        elif base == "str":
            ok, rule = isinstance(value, str), "a string"
        elif base == "bool":
            ok, rule = isinstance(value, bool), "true or false"
        else:  # tuple[int, ...]
            ok = isinstance(value, list) and all(_is_int(i) and i >= 0 for i in value)
            rule = "a list of integers >= 0"
            value = tuple(value) if ok else value
        if not ok:
            raise ConfigError(f"{kind} record: {f.name}={value!r}: must be {rule}{' or null' if optional else ''}")
        out[f.name] = value
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


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
    skipped: list = dataclasses.field(default_factory=list)  # SkippedTurn records, in file order


@dataclass(frozen=True)
class SkippedTurn:
    """A turn the runner could not run -- its prompt does not fit the cache, or an earlier turn of its conversation
    was skipped -- recorded (``"record": "skip"``) so that a rerun moves on to the next turn instead of failing on
    it again, and so that ``report`` says which turns are missing and why."""

    turn: str
    category: str
    reason: str

    def to_json(self) -> str:
        return json.dumps({"record": "skip", **dataclasses.asdict(self)}, separators=(",", ":"))


@dataclass(frozen=True)
class _StepTurn:
    """The key a step record adds to its StepTrace fields."""

    turn: str


def read_trace(path: str) -> TraceFile:
    """Parse an evaluation trace (``.jsonl``, or ``.jsonl.gz`` as committed under results/). A bad line is
    tolerated only at the very end (a torn write); anywhere else it is an error naming the line."""
    import gzip
    import zlib

    headers, turns, steps, pending, skipped = [], [], {}, {}, []
    good, offset, torn = 0, 0, False
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            lines = f.read().split(b"\n")
    except (OSError, EOFError, zlib.error) as exc:  # missing, a directory, not gzip, a cut-off .gz
        raise ConfigError(f"{path}: not a readable trace ({type(exc).__name__}: {exc})") from None
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
        try:
            if kind == "run":
                if not isinstance(d.get("config", {}), dict):
                    raise ConfigError(f"run record: config={d['config']!r}: must be an object")
                headers.append(d)
                good = end
            elif kind == "step":
                turn = _fields(_StepTurn, d, "step")["turn"]
                pending.setdefault(turn, []).append(step_from_dict(d))
            elif kind == "turn":
                s = TurnSummary.from_dict(d)
                turns.append(s)
                steps[s.turn] = pending.pop(s.turn, [])
                good = end
            elif kind == "skip":
                skipped.append(SkippedTurn(**_fields(SkippedTurn, d, "skip")))
                good = end
            else:
                raise ConfigError(f"unknown record {kind!r}")
        except ConfigError as exc:
            raise ConfigError(f"{path}:{n + 1}: {exc}") from None
        offset = end
    return TraceFile(path, headers, turns, steps, sum(len(v) for v in pending.values()), torn, good, skipped)
