"""The answer ledger: a data directory's teacher answers, small enough for git, and the data rebuilt from them.

Why: a data directory (``train.data``) stores ~4.6 KB per token (fp16 features of three taps, top-k ids and logits)
and does not survive between sessions, while generation runs at ~180 answer tokens/s, so a multi-million-token set
takes longer than a session. The features are a function of the tokens: given the teacher's answers, one teacher
forward over prompt + answer (teacher forcing) gives them back. A ledger keeps only the answers (~2 bytes per
token), so they accumulate in the repository across sessions, and ``train.rebuild`` turns them into shards again.

What a ledger holds: per conversation, its id (the prompt source's stable id: ``prompts.prompt_id`` of the first
turn for the synthetic set, ``"sg-" + ...`` for ShareGPT, ``sharegpt.source_of``), its source, and per answered turn
the teacher's answer ids (EOS included when the answer ended on it). Never a prompt id: the prompts come back from
their source (ShareGPT's text, whose licence is unclear, must not enter the repository; token ids decode to it). The
teacher's own answers may. A header records the data directory's identity (``data.data_identity``: the teacher's
content fingerprint, top-k, max_new_tokens and the prompt set's settings), which the rebuilt directory takes over.

Layout: a directory of parts ``part-<16 hex>.npz`` (``np.savez_compressed``, written atomically, named by the
SHA-256 of their arrays), each a closed set of conversations:

    header       str     JSON: {"kind": "answer-ledger", "version": 1, "identity": {...}, "conversations": C,
                         "turns": S, "answer_tokens": N, "sha256": hex of the arrays below}
    ids          str     [C]  conversation ids
    sources      str     [C]  "synthetic" or "sharegpt"
    turns        int32   [C]  answered turns of each conversation
    answer_lens  int32   [S]  length of each answer, conversations in order, turns in order
    answers      uint16  [N]  the answers' ids, concatenated (int32 when an id is >= 65536)

Merging: ``export_ledger`` writes only the conversations the ledger lacks, as one new part, so two sessions add two
files (no merge conflict in git). ``read_ledger`` takes the union of the parts; every part must record the same
identity, and a conversation found in two parts must have the same answers there (else DataError naming both parts).
A part that cannot be read whole (a torn or cut copy: the zip or its CRC fails; arrays whose counts or checksum do
not match the header) is a DataError naming it: a ledger is never half read. A hidden temporary of an interrupted
export (``.part-....npz.XXXX.tmp``) is not a part: it is ignored with a warning.

Rebuild: ``train.rebuild.rebuild_from_ledger`` turns a ledger back into a data directory.

Command line: ``python -m mindspore_eagle.train.ledger export --data DIR --ledger LEDGER`` (a new part),
``rebuild --ledger LEDGER [--teacher DIR] [--out DIR] [--chunk N] [--retarget]`` and ``show --ledger LEDGER``
(counts, bytes).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import zipfile
from dataclasses import dataclass

import numpy as np

from ..errors import DataError, EagleError, IdentityError
from ..storage.atomic import write_bytes
from .data import conversation_id, index_sequences, read_manifest
from .identity import mismatch, read_identity
from .sharegpt import source_of

KIND = "answer-ledger"
VERSION = 1
PART_PREFIX, PART_SUFFIX = "part-", ".npz"
ARRAYS = ("ids", "sources", "turns", "answer_lens", "answers")
# identity keys that let the prompt set be rebuilt (``data.generate_dataset`` records them)
PROMPT_SET_KEYS = ("per_category", "seed", "second_turns", "max_prompt_tokens")


@dataclass(frozen=True)
class Entry:
    """One conversation of a ledger: its prompt source and the teacher's answer to each answered turn."""

    source: str
    answers: tuple[np.ndarray, ...]  # per turn: answer ids [n_k] int


@dataclass(frozen=True)
class Ledger:
    """The union of a ledger's parts: ``entries`` maps conversation id -> Entry, parts in name order, conversations
    in part order."""

    path: str
    identity: dict
    entries: dict
    parts: tuple[str, ...]

    @property
    def answer_tokens(self) -> int:
        return int(sum(len(a) for e in self.entries.values() for a in e.answers))


@dataclass(frozen=True)
class ExportResult:
    part: str | None  # the part written, None when the ledger already held every conversation
    conversations: int  # new conversations written
    answer_tokens: int  # their answer tokens
    known: int  # conversations of the data directory the ledger already held (same answers)


# ---- parts -----------------------------------------------------------------------------------------------------
def _checksum(arrays: dict) -> str:
    h = hashlib.sha256()
    for name in ARRAYS:
        a = arrays[name]
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update("\n".join(a.tolist()).encode("utf-8") if a.dtype.kind == "U" else np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def write_part(ledger_dir: str, identity: dict, entries: dict) -> str:
    """Write ``entries`` (conversation id -> Entry) as one new part of ``ledger_dir`` (created if missing),
    atomically; returns its path. The name is the arrays' SHA-256, so the same set written twice is one file."""
    if not entries:
        raise DataError(f"{ledger_dir}: a ledger part holds at least one conversation")
    answers = [np.asarray(a) for e in entries.values() for a in e.answers]
    flat = np.concatenate(answers) if answers else np.zeros(0, np.int64)
    if flat.size and (flat.min() < 0 or flat.max() > np.iinfo(np.int32).max):
        raise DataError(f"{ledger_dir}: answer ids outside [0, 2^31): not token ids")
    arrays = {"ids": np.array(list(entries)), "sources": np.array([e.source for e in entries.values()]),
              "turns": np.array([len(e.answers) for e in entries.values()], np.int32),
              "answer_lens": np.array([len(a) for a in answers], np.int32),
              "answers": flat.astype(np.uint16 if flat.size == 0 or flat.max() < 65536 else np.int32)}
    digest = _checksum(arrays)
    header = {"kind": KIND, "version": VERSION, "identity": identity, "conversations": len(entries),
              "turns": len(answers), "answer_tokens": int(flat.size), "sha256": digest}
    buf = io.BytesIO()
    np.savez_compressed(buf, header=np.array(json.dumps(header, sort_keys=True)), **arrays)
    os.makedirs(ledger_dir, exist_ok=True)
    path = os.path.join(ledger_dir, f"{PART_PREFIX}{digest[:16]}{PART_SUFFIX}")
    write_bytes(path, buf.getvalue())
    return path


def read_part(path: str) -> tuple[dict, dict]:
    """``(header, entries)`` of one part, checked whole (module docstring); DataError naming the part otherwise."""
    def damaged(why: str) -> DataError:
        return DataError(f"{path}: not a whole ledger part ({why}): a torn or damaged copy; restore it (it is in git) "
                         "or remove it (its conversations are then generated again)")

    try:
        with np.load(path, allow_pickle=False) as z:
            missing = sorted({"header", *ARRAYS} - set(z.files))
            if missing:
                raise damaged(f"arrays {missing} missing")
            header = json.loads(str(z["header"]))
            arrays = {name: z[name] for name in ARRAYS}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as exc:
        raise damaged(f"{type(exc).__name__}: {exc}") from None
    if not isinstance(header, dict) or header.get("kind") != KIND:
        raise damaged("its header is not an answer ledger's")
    if header.get("version") != VERSION:
        raise DataError(f"{path}: ledger version {header.get('version')!r}, this code reads version {VERSION}")
    ids, sources, turns, lens, answers = (arrays[k] for k in ARRAYS)
    counts = (len(ids) == len(sources) == len(turns) == header.get("conversations")
              and int(turns.sum()) == len(lens) == header.get("turns")
              and int(lens.sum()) == len(answers) == header.get("answer_tokens")
              and (turns >= 1).all() and (lens >= 1).all())
    if not counts:
        raise damaged("its arrays do not add up to the header's counts")
    if _checksum(arrays) != header.get("sha256"):
        raise damaged("its arrays do not match the header's checksum")
    if len(set(ids.tolist())) != len(ids):
        raise damaged("a conversation id appears twice")
    ends = np.cumsum(lens)
    pieces = np.split(answers.astype(np.int64), ends[:-1]) if len(lens) else []
    entries, t = {}, 0
    for cid, source, n in zip(ids.tolist(), sources.tolist(), turns.tolist()):
        entries[cid] = Entry(source, tuple(pieces[t:t + n]))
        t += n
    return header, entries


def part_paths(path: str) -> list[str]:
    """The parts of a ledger directory, by name (a single part file is its own ledger); warns about temporaries of
    an interrupted export, which are not parts."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        return []
    names = sorted(os.listdir(path))
    for name in names:
        if name.startswith(".") and name.endswith(".tmp"):
            print(f"warning: {os.path.join(path, name)}: an unfinished ledger write (an interrupted export), not a "
                  "part: ignored", file=sys.stderr)
    return [os.path.join(path, n) for n in names if n.startswith(PART_PREFIX) and n.endswith(PART_SUFFIX)]


def read_ledger(path: str) -> Ledger:
    """The union of the parts of ledger ``path`` (module docstring: one identity; a conversation in two parts with
    different answers is a DataError naming both)."""
    parts = part_paths(path)
    if not parts:
        raise DataError(f"{path}: no ledger parts ({PART_PREFIX}*{PART_SUFFIX}) found")
    identity, entries, where = None, {}, {}
    for part in parts:
        header, got = read_part(part)
        if identity is None:
            identity = header["identity"]
        elif header["identity"] != identity:
            raise IdentityError(f"{part} records another data identity than {parts[0]} ("
                                f"{mismatch(identity, header['identity'])}): one ledger holds the answers of one "
                                "teacher and one set of generation settings")
        for cid, entry in got.items():
            old = entries.get(cid)
            if old is None:
                entries[cid], where[cid] = entry, part
            elif not _same_answers(old, entry):
                raise DataError(f"conversation {cid} has different answers in {where[cid]} and {part}: the same "
                                "teacher and settings answer a conversation one way; one of the parts is not what it "
                                "claims to be")
    return Ledger(path, identity, entries, tuple(parts))


def _same_answers(a: Entry, b: Entry) -> bool:
    return a.source == b.source and len(a.answers) == len(b.answers) and \
        all(np.array_equal(x, y) for x, y in zip(a.answers, b.answers))


# ---- export ----------------------------------------------------------------------------------------------------
def data_answers(data_dir: str) -> dict:
    """conversation id -> Entry of every conversation listed in ``data_dir``'s manifest (manifest order): each
    stored sequence's answer is its tokens after its prompt."""
    turns: dict[str, dict[int, np.ndarray]] = {}
    for s in index_sequences(data_dir):
        cid = conversation_id(s.pid)
        k = 0 if s.pid == cid else int(s.pid[len(cid) + 2:]) - 1
        turns.setdefault(cid, {})[k] = s.tokens[s.prompt_len:].astype(np.int64)
    order = [cid for rec in read_manifest(data_dir) for cid in rec["ids"]]
    out = {}
    for cid in order:
        got = turns.get(cid, {})
        if sorted(got) != list(range(len(got))) or not got:
            raise DataError(f"{data_dir}: conversation {cid} has sequences of turns {sorted(got)}, not turns 1..n: "
                            "its shard is damaged")
        out[cid] = Entry(source_of(cid), tuple(got[k] for k in range(len(got))))
    return out


def export_ledger(data_dir: str, path: str) -> ExportResult:
    """Add the answers of ``data_dir``'s conversations to ledger directory ``path`` (created if missing): those the
    ledger lacks become one new part; a conversation it holds with other answers is a DataError, a ledger of another
    identity an IdentityError (nothing is written then)."""
    identity = read_identity(data_dir)
    if identity is None:
        raise IdentityError(f"{data_dir}: no identity.json: not a data directory made by `python -m "
                            "mindspore_eagle.train.data`, so nothing says which teacher and prompts its answers "
                            "belong to")
    lacking = [k for k in PROMPT_SET_KEYS if k not in identity]
    if lacking:
        raise DataError(f"{data_dir}: its identity records no prompt set ({', '.join(lacking)} missing): its prompts "
                        "were given directly (a script or a test), not drawn from train.prompts / train.sharegpt, so "
                        "a ledger could not rebuild them")
    current = read_ledger(path) if part_paths(path) else None
    if current is not None and current.identity != identity:
        raise IdentityError(f"ledger {path} holds answers of another data identity than {data_dir} "
                            f"({mismatch(current.identity, identity)}); export into another ledger directory")
    new, known = {}, 0
    for cid, entry in data_answers(data_dir).items():
        old = current.entries.get(cid) if current is not None else None
        if old is None:
            new[cid] = entry
        elif _same_answers(old, entry):
            known += 1
        else:
            raise DataError(f"conversation {cid}: {data_dir} and ledger {path} hold different answers; the same "
                            "teacher and settings answer a conversation one way (a damaged shard or ledger part?)")
    if not new:
        return ExportResult(None, 0, 0, known)
    part = write_part(path, identity, new)
    return ExportResult(part, len(new), int(sum(len(a) for e in new.values() for a in e.answers)), known)


# ---- command line ----------------------------------------------------------------------------------------------
def summary(ledger: Ledger) -> dict:
    """Counts and sizes of a ledger, for ``show`` and the log."""
    size = sum(os.path.getsize(p) for p in ledger.parts)
    tokens = ledger.answer_tokens
    sources: dict[str, int] = {}
    for e in ledger.entries.values():
        sources[e.source] = sources.get(e.source, 0) + 1
    return {"parts": len(ledger.parts), "conversations": len(ledger.entries), "sources": sources,
            "turns": int(sum(len(e.answers) for e in ledger.entries.values())), "answer_tokens": tokens,
            "bytes": size, "bytes_per_answer_token": round(size / tokens, 3) if tokens else None,
            "teacher": ledger.identity.get("teacher")}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m mindspore_eagle.train.ledger",
                                 description="Keep a data directory's teacher answers in a small ledger (for git) "
                                             "and rebuild the data directory's shards from it.")
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="add a data directory's answers to a ledger directory (a new part)")
    ex.add_argument("--data", required=True, help="data directory (python -m mindspore_eagle.train.data --out)")
    ex.add_argument("--ledger", required=True, help="ledger directory (created if missing)")
    rb = sub.add_parser("rebuild", help="rebuild a data directory from a ledger (resumes)")
    rb.add_argument("--ledger", required=True, help="ledger directory (or one part file)")
    rb.add_argument("--teacher", default=None, help="converted teacher dir (default: the default teacher); must be "
                                                    "the ledger's")
    rb.add_argument("--out", default=None, help="data directory (default: HOME/train_data/<teacher name>-<its "
                                                "content fingerprint>, as the generator's)")
    rb.add_argument("--chunk", type=int, default=64, help="rows per teacher forward (default 64)")
    rb.add_argument("--time-limit", type=float, default=None, help="stop (resumably) after this many seconds")
    rb.add_argument("--retarget", action="store_true",
                    help="the ledger was written by another conversion of this teacher (another fingerprint): rebuild "
                         "with this one, checking every answer token against its greedy choice (a conversation that "
                         "fails is left out and named; more than 5 and 1%% stop the rebuild); the data directory "
                         "records this teacher (export it into a new ledger directory)")
    sh = sub.add_parser("show", help="print a ledger's counts and size as one JSON line")
    sh.add_argument("--ledger", required=True)
    return ap


def main(argv: list[str] | None = None) -> int:
    from ..storage.assets import default_model_dir
    from .data import default_data_dir
    from .rebuild import rebuild_from_ledger

    a = build_parser().parse_args(argv)
    try:
        if a.command == "export":
            r = export_ledger(a.data, a.ledger)
            where = f"new part {r.part}" if r.part else "no new part"
            print(f"{r.conversations} new conversations ({r.answer_tokens} answer tokens), {r.known} already in the "
                  f"ledger: {where}")
            print(json.dumps(summary(read_ledger(a.ledger))))
        elif a.command == "rebuild":
            teacher = a.teacher or default_model_dir()
            out = a.out or default_data_dir(teacher)
            s = rebuild_from_ledger(a.ledger, teacher, out, a.chunk, time_limit_s=a.time_limit, retarget=a.retarget)
            print(s.summary(out))
        else:
            print(json.dumps(summary(read_ledger(a.ledger))))
    except KeyboardInterrupt:
        return 130
    except EagleError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


__all__ = ["Entry", "ExportResult", "Ledger", "data_answers", "export_ledger", "part_paths", "read_ledger",
           "read_part", "summary", "write_part"]

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
