"""Training data for a draft head: the teacher's own greedy answers to an offline prompt set, as feature shards.

EAGLE's key lesson: a head must learn what *this* teacher outputs, so every answer is regenerated here by our
teacher (greedy). The prompt set (``--prompts``) is ``train.prompts`` (nine categories, some conversations with a
second turn asked after the teacher's own first answer; the default), the user turns of ShareGPT
(``train.sharegpt``: up to two per conversation, later ones likewise asked after the teacher's answers) or a mix
of the two (``--sharegpt-fraction``); generation is ``train.batch_greedy`` (continuous batching, top-k in the
graph). Evaluation turns are never a source (``train.overlap``, ``tests/test_train_overlap.py``). The settings are
``train_config.DataConfig``'s: its flags, or the ``"data"`` section of a recipe file (``--config``, ``configs/train/``).

Shards (``shard_XXXXX.npz`` in ``out_dir``, written atomically, then listed in ``manifest.jsonl``). For
sequence j with ``N_j`` tokens (prompt of ``P_j`` plus answer) the shard concatenates over sequences:

    tokens      int32   [sum N_j]          prompt + answer ids
    features    float16 [sum (N_j-1), 3H]  teacher aux hidden at positions 0..N_j-2 (the last token is never fed)
    topk_ids    int32   [sum (N_j-1), k]   teacher's top-k next-token ids at those positions (descending)
    topk_logits float16 [sum (N_j-1), k]
    lengths, prompt_lens int32 [n_seq];  ids: the sequence ids (str)
    starts int32 [n_seq]: position of the sequence's first token in its conversation (0 for a first turn; a
        second turn stores only the rows from its first new position on);  turns int32 [n_seq];
        categories: str [n_seq]

Logits at position p score token p + 1, so ``topk_ids[p, 0] == tokens[p + 1]`` on every answer position (greedy).
Storing top-k (default 32) instead of the 49k-wide logits keeps a token at ~3.6 KB (``bytes_per_token``); the
soft target is the softmax over the top-k entries that lie in the draft vocabulary.

Sequence ids: a first turn is its conversation id (``prompts.prompt_id``), a later turn ``{id}-t{k}``
(``batch_greedy.turn_pid``); ``conversation_id`` maps back, so a held-out split by conversation keeps both
turns together. Resume: a conversation listed in the manifest is never regenerated; one in flight when the run
stops is redone.

Manifest (``manifest.jsonl``, one record per line, appended after its shard is renamed into place): a last line that
does not parse is a torn append (a full disk, a kill) and is dropped with a warning -- its conversations are redone
on resume, after the torn tail is cut off (``repair_manifest``); a bad line with records after it is a ``DataError``
naming the file and line, and so is a shard name outside the directory (absolute, or climbing out with ``..``).

Identity (``train.identity``): a data directory records, when created, the teacher's content fingerprint and the
settings that shape its answers (``data_identity``); a run with another teacher or other settings is refused
instead of appending its answers to the first one's. The default directory is keyed by that fingerprint
(``default_data_dir``), so two teachers whose directories share a name never share data.

Answers outlive the directory in an answer ledger (``train.ledger``: the answer ids only, for git), from which the
shards are rebuilt bit for bit into a directory of the same identity, which generation then continues. A recipe
whose answers are kept in git names its ledger (``"from_ledger"``): ``main`` then rebuilds it instead of generating.
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass

import numpy as np

from ..storage.atomic import write_text
from ..errors import ConfigError, DataError, EagleError, IdentityError
from ..storage.fingerprint import directory_fingerprint
from ..storage.paths import home
from .identity import claim, mismatch
from .sequence import Sequence_

MANIFEST = "manifest.jsonl"
CONVERSATIONS_FILE = "conversations.jsonl"


def conversation_id(pid: str) -> str:
    """The conversation of a sequence id: ``"ab12-t2" -> "ab12"``, ``"ab12" -> "ab12"``."""
    return pid.split("-t", 1)[0]


def default_data_dir(model_dir: str, fingerprint: str | None = None) -> str:
    """``<home>/train_data/<teacher dir name>-<16 hex digits of its fingerprint>``: keyed by the teacher's content,
    not by its directory name alone (two teachers named alike trained on one's data)."""
    fingerprint = fingerprint or directory_fingerprint(model_dir)
    name = os.path.basename(os.path.normpath(os.path.abspath(model_dir)))
    return os.path.join(home(), "train_data", f"{name}-{fingerprint.split(':')[-1][:16]}")


def data_identity(model_dir: str, topk: int, max_new_tokens: int, **settings) -> dict:
    """What a data directory's answers depend on: the teacher's content and the generation settings (amounts and
    time limits are not identity: a rerun with a larger one resumes)."""
    return {"kind": "train-data", "teacher": directory_fingerprint(model_dir), "topk": topk,
            "max_new_tokens": max_new_tokens, **settings}


def claim_data_dir(out_dir: str, identity: dict) -> bool:
    """Record ``identity`` in a new or empty ``out_dir``, or check it against the recorded one (IdentityError)."""
    return claim(out_dir, identity, "data directory", "generate into another (new or empty) directory; each teacher "
                 "needs its own data")


def bytes_per_token(hidden_size: int, topk: int) -> int:
    """Stored bytes per sequence position: fp16 features (3 taps), int32 top-k ids, fp16 top-k logits, the token."""
    return 3 * hidden_size * 2 + topk * (4 + 2) + 4


# ---- shards --------------------------------------------------------------------------------------------
def write_shard(out_dir: str, index: int, seqs: list[Sequence_], starts: list[int] | None = None,
                turns: list[int] | None = None, categories: list[str] | None = None) -> str:
    """Write one shard atomically (tmp file + rename); returns its path."""
    path = os.path.join(out_dir, f"shard_{index:05d}.npz")
    tmp = path + ".tmp.npz"
    n = len(seqs)
    try:
        _savez_shard(tmp, seqs, starts, turns, categories, n)
    except BaseException:  # disk full, Ctrl-C: no partial shard left behind (resume regenerates it)
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    os.replace(tmp, path)
    return path


def _savez_shard(tmp: str, seqs: list[Sequence_], starts, turns, categories, n: int) -> None:
    np.savez(tmp, tokens=np.concatenate([s.tokens for s in seqs]),
             features=np.concatenate([s.features for s in seqs]),
             topk_ids=np.concatenate([s.topk_ids for s in seqs]),
             topk_logits=np.concatenate([s.topk_logits for s in seqs]),
             lengths=np.array([len(s.tokens) for s in seqs], np.int32),
             prompt_lens=np.array([s.prompt_len for s in seqs], np.int32),
             ids=np.array([s.pid for s in seqs]), starts=np.array(starts or [0] * n, np.int32),
             turns=np.array(turns or [0] * n, np.int32), categories=np.array(categories or [""] * n))


@dataclass(frozen=True)
class Manifest:
    """What ``scan_manifest`` found: the records, where the last complete one ends (``good_bytes``: appending
    after truncating there drops a torn tail), and whether the file ends in a torn line."""

    path: str
    records: list
    good_bytes: int
    torn: bool


def shard_name_confined(name) -> bool:
    """Whether a manifest's shard name stays inside its data directory: a relative path that never climbs out of
    it (``shard_00000.npz``, ``part/shard_00000.npz``), not absolute, not ``..``-escaping, no NUL."""
    if not isinstance(name, str) or not name or "\x00" in name or os.path.isabs(name):
        return False
    norm = os.path.normpath(name)
    return norm not in (".", "..") and not norm.startswith(".." + os.sep) and not os.path.isabs(norm)


def _manifest_record(rec, path: str, line: int) -> dict:
    """A manifest line's record, checked: an object naming a shard inside the directory and a list of ids."""
    if not isinstance(rec, dict) or "shard" not in rec:
        raise DataError(f"{path}: line {line} is not a manifest record (an object with 'shard' and 'ids')")
    if not shard_name_confined(rec["shard"]):
        raise DataError(f"{path}: line {line}: shard {rec['shard']!r} is not a file inside the data directory (an "
                        "absolute path or one leaving it with '..'); a manifest names its own directory's shards")
    ids = rec.get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise DataError(f"{path}: line {line}: 'ids' must be a list of conversation ids, got {ids!r:.80}")
    return rec


def scan_manifest(out_dir: str) -> Manifest:
    """Parse ``out_dir``'s manifest. A last line that does not parse is a torn append (a full disk, a kill between
    the shard's rename and the line's end) and is left out -- the shard it named is not listed, so resume
    regenerates its conversations; a bad line with records after it is damage: DataError naming file and line."""
    path = os.path.join(out_dir, MANIFEST)
    if not os.path.isfile(path):
        return Manifest(path, [], 0, False)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise DataError(f"{path}: unreadable manifest ({exc})") from None
    lines = data.split(b"\n")
    last = max((n for n, raw in enumerate(lines) if raw.strip()), default=-1)
    records, offset, good, torn = [], 0, 0, False
    for n, raw in enumerate(lines):
        end = offset + len(raw) + (1 if n < len(lines) - 1 else 0)
        if raw.strip():
            try:
                rec = json.loads(raw)
            except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
                if n == last:
                    torn = True
                    break
                raise DataError(f"{path}: line {n + 1} is not valid JSON ({exc}); only a torn last line (an "
                                "interrupted append) is skipped: restore the manifest or regenerate the data") from None
            records.append(_manifest_record(rec, path, n + 1))
            good = end
        offset = end
    return Manifest(path, records, good, torn)


_WARNED_TORN: set = set()


def read_manifest(out_dir: str) -> list[dict]:
    """The records of ``out_dir``'s manifest (``scan_manifest``), warning once per file about a torn last line."""
    m = scan_manifest(out_dir)
    if m.torn and (m.path, m.good_bytes) not in _WARNED_TORN:
        _WARNED_TORN.add((m.path, m.good_bytes))
        print(f"warning: {m.path}: its last line is torn (an interrupted append, e.g. a full disk): ignored; the "
              f"{len(m.records)} complete records are used and generation resumes after them", file=sys.stderr)
    return m.records


def manifest_good_bytes(out_dir: str) -> int:
    """Bytes of ``out_dir``'s manifest up to the end of its last complete record (its size without a torn tail)."""
    return scan_manifest(out_dir).good_bytes


def repair_manifest(out_dir: str) -> bool:
    """Truncate a torn tail off the manifest before appending to it (else the next record would be glued to the
    fragment: a damaged line in the middle); a last record without its newline gets one. True if it changed."""
    m = scan_manifest(out_dir)
    if not os.path.isfile(m.path):
        return False
    with open(m.path, "r+b") as f:
        changed = f.seek(0, os.SEEK_END) != m.good_bytes
        f.truncate(m.good_bytes)
        if m.good_bytes:
            f.seek(m.good_bytes - 1)
            if f.read(1) != b"\n":
                f.write(b"\n")
                changed = True
        if changed:
            f.flush()
            os.fsync(f.fileno())
    return changed


def first_out_of_vocab(ids: np.ndarray, vocab_size: int) -> int | None:
    """Flat index of the first id of ``ids`` outside ``[0, vocab_size)``, None when all are inside."""
    arr = np.asarray(ids).reshape(-1)
    bad = np.flatnonzero((arr < 0) | (arr >= vocab_size))
    return int(bad[0]) if bad.size else None


def check_shapes(seqs, hidden_size: int) -> None:
    """DataError naming the first shard (or sequence) whose features are not the teacher's three taps
    (``3 * hidden_size`` wide) or whose top-k ids and logits disagree: data of a teacher with another hidden size
    otherwise reaches the head's ``fc`` and fails inside MindSpore's graph compiler (leaving ``rank_0/`` in the
    working directory)."""
    seen: set[int] = set()
    for s in seqs:
        if isinstance(s, StoredSequence):
            if id(s.shard) in seen:
                continue
            seen.add(id(s.shard))
            where, shape = s.shard.path, {k: s.shard.members[k][2] for k in ("features", "topk_ids", "topk_logits")}
        else:
            where = f"training data: sequence {s.pid}"
            shape = {"features": s.features.shape, "topk_ids": s.topk_ids.shape, "topk_logits": s.topk_logits.shape}
        feat, ids, logits = shape["features"], shape["topk_ids"], shape["topk_logits"]
        if len(feat) != 2 or feat[1] != 3 * hidden_size:
            raise DataError(f"{where}: features of shape {tuple(feat)}, this teacher's are [rows, {3 * hidden_size}] "
                            f"(3 taps x hidden size {hidden_size}): the data of a teacher with another hidden size; "
                            "train on this teacher's own data (another --data, or regenerate it)")
        if len(ids) != 2 or tuple(ids) != tuple(logits) or ids[0] != feat[0]:
            raise DataError(f"{where}: top-k ids {tuple(ids)} and logits {tuple(logits)} do not match the "
                            f"{feat[0]} feature rows; the shard is damaged, regenerate it")


def check_token_ids(seqs, vocab_size: int) -> None:
    """DataError naming the first sequence and id outside the teacher's vocabulary ``[0, vocab_size)`` (numpy
    would raise an IndexError on it, or silently wrap a negative one)."""
    for s in seqs:
        bad = first_out_of_vocab(s.tokens, vocab_size)
        if bad is not None:
            where = s.shard.path if isinstance(s, StoredSequence) else "training data"
            raise DataError(f"{where}: sequence {s.pid}: token id {int(s.tokens[bad])} (position {bad}) is outside "
                            f"the teacher's vocabulary [0, {vocab_size}): the data of another model or a damaged "
                            "shard; regenerate it")


class ShardFile:
    """Random access to the arrays of one shard without reading it whole.

    ``np.savez`` stores every array uncompressed (``ZIP_STORED``) as an ``.npy`` member, so an array's rows sit
    at a fixed byte offset in the ``.npz``: this reads the zip's local headers and the ``.npy`` headers once and
    then serves any row range with one ``pread``. Why: the 2M-token training set is ~10 GB of features; reading
    only the rows of the current batch keeps the trainer's memory at the size of a batch, not of the data.
    A shard with a compressed member is refused with a ``DataError`` naming it (``savez_compressed`` is not
    what ``write_shard`` writes)."""

    def __init__(self, path: str):
        import zipfile

        self.path = path
        self.members: dict[str, tuple[int, np.dtype, tuple[int, ...]]] = {}  # name -> (data offset, dtype, shape)
        try:
            with zipfile.ZipFile(path) as zf, open(path, "rb") as f:
                for info in zf.infolist():
                    if info.compress_type != zipfile.ZIP_STORED:
                        raise DataError(f"{path}: member {info.filename} is compressed; shards are written "
                                        f"uncompressed by train.data.write_shard -- regenerate the shard")
                    f.seek(info.header_offset)
                    local = f.read(30)
                    if local[:4] != b"PK\x03\x04":
                        raise DataError(f"{path}: bad zip local header for {info.filename}; the shard is damaged")
                    name_len = int.from_bytes(local[26:28], "little")
                    extra_len = int.from_bytes(local[28:30], "little")
                    f.seek(info.header_offset + 30 + name_len + extra_len)
                    version = np.lib.format.read_magic(f)
                    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0)
                    shape, fortran, dtype = read_header(f)
                    if fortran or dtype.hasobject:
                        raise DataError(f"{path}: member {info.filename} is not a C-ordered plain array")
                    self.members[info.filename[:-4] if info.filename.endswith(".npy") else info.filename] = (
                        f.tell(), dtype, tuple(shape))
        except (zipfile.BadZipFile, ValueError, OSError) as exc:
            raise DataError(f"{path}: not a readable training shard ({exc}); regenerate it") from None

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of array ``name`` (a fresh array, nothing else of the shard kept)."""
        return self.rows_of((name,), start, stop)[0]

    def rows_of(self, names: tuple[str, ...], start: int, stop: int) -> list[np.ndarray]:
        """Rows ``[start, stop)`` of each array in ``names``, read through one open file (a sequence's features
        and top-k rows come together for every batch entry)."""
        outs = []
        with open(self.path, "rb") as f:
            for name in names:
                offset, dtype, shape = self.members[name]
                if not 0 <= start <= stop <= shape[0]:
                    raise DataError(f"{self.path}: rows [{start}, {stop}) of {name} outside its {shape[0]} rows")
                row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
                out = np.empty((stop - start,) + shape[1:], dtype)
                f.seek(offset + start * row_bytes)
                if f.readinto(memoryview(out).cast("B")) != out.nbytes:
                    raise DataError(f"{self.path}: {name} ends early (truncated shard); regenerate it")
                outs.append(out)
        return outs

    def array(self, name: str) -> np.ndarray:
        return self.rows(name, 0, self.members[name][2][0])


@dataclass(frozen=True)
class StoredSequence:
    """A sequence of a shard as the trainer indexes it: tokens and prompt length in memory (what batching by
    length needs), the feature and top-k rows read from the shard by ``load`` when its batch comes."""

    pid: str
    tokens: np.ndarray  # [N] int32
    prompt_len: int
    shard: ShardFile
    row: int  # its first feature/top-k row in the shard

    def load(self) -> Sequence_:
        n = len(self.tokens) - 1
        return Sequence_(self.pid, self.tokens, self.prompt_len,
                         *self.shard.rows_of(("features", "topk_ids", "topk_logits"), self.row, self.row + n))


def index_sequences(data_dir: str) -> list[StoredSequence]:
    """Every finished sequence of a data directory (only shards listed in the manifest), features left on disk."""
    out = []
    for rec in read_manifest(data_dir):
        shard = ShardFile(os.path.join(data_dir, rec["shard"]))
        ids, lengths, prompt_lens = (shard.array(k) for k in ("ids", "lengths", "prompt_lens"))
        tokens = shard.array("tokens")
        if int(lengths.sum()) != len(tokens) or shard.members["features"][2][0] != int((lengths - 1).sum()):
            raise DataError(f"{shard.path}: lengths do not add up to its token/feature rows; regenerate it")
        t_off = f_off = 0
        for pid, n, p in zip(ids, lengths, prompt_lens):
            n, p = int(n), int(p)
            out.append(StoredSequence(str(pid), tokens[t_off:t_off + n].copy(), p, shard, f_off))
            t_off += n
            f_off += n - 1
    return out


def load_sequences(data_dir: str) -> list[Sequence_]:
    """Every finished sequence with its features in memory (small data sets and tests; the trainer indexes)."""
    return [s.load() for s in index_sequences(data_dir)]


class _Progress:
    """A progress line on stderr every ``every_s`` seconds: conversations, answer tokens, rate, ETA.

    ``token_goal``: the answer tokens this run still has to produce (``--max-answer-tokens`` minus what the
    directory holds); the ETA is then whichever end comes first, the last conversation or the token goal."""

    def __init__(self, total: int, done: int, every_s: float = 5.0, token_goal: int | None = None):
        self.total, self.done0, self.every_s, self.token_goal = total, done, every_s, token_goal
        self.t0 = self.last = time.time()

    def eta_h(self, done: int, tokens: int, elapsed: float) -> float:
        new = done - self.done0
        etas = [(self.total - done) * elapsed / new / 3600] if new > 0 else []
        if self.token_goal is not None and tokens > 0:
            etas.append(max(0, self.token_goal - tokens) * elapsed / tokens / 3600)
        return min(etas) if etas else float("nan")

    def __call__(self, done: int, tokens: int, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.last < self.every_s:
            return
        self.last = now
        el = now - self.t0
        rate = tokens / el if el > 0 else 0.0
        eta = self.eta_h(done, tokens, el)
        bar = "#" * int(30 * done / max(self.total, 1))
        print(f"\r[{bar:<30}] {done}/{self.total} conversations  {tokens} answer tok  {rate:.1f} tok/s  "
              f"{el / 60:.1f} min  ETA {eta:.2f} h ", end="", file=sys.stderr, flush=True)


@contextlib.contextmanager
def on_signal(signum: int, handler):
    """Inside the block signal ``signum`` calls ``handler(signum, frame)``; the previous handler is restored after
    it. A no-op outside the main thread (Python installs signal handlers there only)."""
    try:
        previous = signal.signal(signum, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signum, previous)


def on_sigterm(handler):
    """``on_signal`` for SIGTERM."""
    return on_signal(signal.SIGTERM, handler)


def _sigterm_as_interrupt():
    """Inside the block SIGTERM ends the run like Ctrl-C (the shard buffer is flushed, only the conversations in
    flight are lost)."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    return on_sigterm(handler)


def generate_dataset(model_dir: str, out_dir: str, num_conversations: int | None = None, batch_size: int = 128,
                     max_new_tokens: int = 192, max_prompt_tokens: int = 160, topk: int = 32, seed: int = 0,
                     time_limit_s: float | None = None, per_category: int = 2500, second_turns: bool = True,
                     block: int = 2048, followup_tokens: int = 64, max_answer_tokens: int | None = None,
                     prompts: str = "synthetic", sharegpt_fraction: float | None = None,
                     skip_ledger: str | None = None) -> int:
    """Generate (or resume) the dataset of the training prompt set (``sharegpt.prompt_set(prompts,
    sharegpt_fraction, ...)``); returns the finished conversations in ``out_dir``. ``skip_ledger``: an answer
    ledger (``train.ledger``) of the same identity whose conversations are left out, so that a session continues
    the ledger in a fresh directory (then ``ledger export`` adds a part) instead of first rebuilding every
    conversation it holds (~1.6 h per million answer tokens). First turns longer than
    ``max_prompt_tokens`` are left out. Single-turn conversations run on a cache of ``max_prompt_tokens +
    max_new_tokens + 1`` rows, two-turn ones on ``max_new_tokens +
    followup_tokens`` rows more (the step cost grows with the cache, so the short ones do not pay for the long).
    ``max_answer_tokens``: stop (resumably) once the directory holds that many answer tokens."""
    from ..tokenizer import load_tokenizer
    from .prompts import as_items
    from .sharegpt import prompt_set, source_identity

    check_generation_args(model_dir, num_conversations, batch_size, max_new_tokens, max_prompt_tokens, topk,
                          time_limit_s, per_category, block, followup_tokens, max_answer_tokens, prompts,
                          sharegpt_fraction)
    identity = data_identity(model_dir, topk, max_new_tokens, max_prompt_tokens=max_prompt_tokens,
                             per_category=per_category, seed=seed, second_turns=second_turns,
                             **source_identity(prompts, sharegpt_fraction))
    answered = ledger_conversations(skip_ledger, identity) if skip_ledger is not None else set()
    claim_data_dir(out_dir, identity)  # before anything is written into it
    held = stored_answer_tokens(out_dir)
    if max_answer_tokens is not None and held >= max_answer_tokens:
        print(f"{out_dir} already holds {held} answer tokens (>= {max_answer_tokens}): nothing to generate",
              file=sys.stderr)
        return len(finished_conversations(out_dir))
    tok = load_tokenizer(model_dir)
    convs = prompt_set(prompts, sharegpt_fraction, per_category, seed, second_turns)[:num_conversations]
    write_text(os.path.join(out_dir, CONVERSATIONS_FILE), "".join(json.dumps(c) + "\n" for c in convs))
    finished = finished_conversations(out_dir)
    items, too_long, in_ledger = [], 0, 0
    for item in as_items(convs):
        if item.id in finished:
            continue
        if item.id in answered:
            in_ledger += 1
            continue
        if len(tok.encode_chat([{"role": "user", "content": item.turns[0]}])) <= max_prompt_tokens:
            items.append(item)
        else:
            too_long += 1
    if in_ledger:
        print(f"{in_ledger} conversations left out: answered in ledger {skip_ledger}", file=sys.stderr)
    if too_long:
        print(f"{too_long} conversations left out: first turn longer than {max_prompt_tokens} tokens", file=sys.stderr)
    rows_one = max_prompt_tokens + max_new_tokens + 1
    run_generation(model_dir, out_dir, items, tok, batch_size, max_new_tokens, topk, time_limit_s, block,
                   (rows_one, rows_one + max_new_tokens + followup_tokens), max_answer_tokens, identity)
    return len(finished_conversations(out_dir))


def ledger_conversations(path: str, identity: dict) -> set[str]:
    """The conversation ids answered in ledger ``path``, read before the data directory is claimed (nothing is
    written on an error). The ledger's generation settings must be this run's (IdentityError naming the difference:
    under other settings its conversations are other sequences). Its teacher may be another conversion than this
    run's (a content fingerprint changes with the converter's file layout): its conversations are still left out,
    with a warning, since ``ledger rebuild --retarget`` moves its answers to this teacher, checking every answer
    token against this teacher's greedy choice."""
    from .ledger import read_ledger

    ledger = read_ledger(path)
    keys = sorted((set(ledger.identity) | set(identity)) - {"teacher"})
    if mismatch(ledger.identity, identity, keys):
        raise IdentityError(f"--skip-ledger {path}: its answers were generated with other settings than this run's "
                            f"({mismatch(ledger.identity, identity, keys)}); pass the settings it was generated with "
                            "(python -m mindspore_eagle.train.ledger show --ledger ...)")
    if ledger.identity.get("teacher") != identity.get("teacher"):
        print(f"warning: --skip-ledger {path} holds the answers of teacher {ledger.identity.get('teacher')}, this "
              f"run's is {identity.get('teacher')}: its conversations are left out here; move them to this teacher "
              "with `python -m mindspore_eagle.train.ledger rebuild --retarget`", file=sys.stderr)
    return set(ledger.entries)


def check_prompt_ids(items, vocab_size: int) -> None:
    """ConfigError naming the first conversation, turn and token id outside the teacher's vocabulary ``[0,
    vocab_size)`` among ``items`` given as ids (text turns are checked by the tokenizer)."""
    for item in items:
        for k, turn in enumerate(item.turns_ids):
            bad = first_out_of_vocab(np.asarray(turn, np.int64), vocab_size) if len(turn) else None
            if bad is not None:
                raise ConfigError(f"conversation {item.id}: turn {k + 1}: token id {turn[bad]} (position {bad}) is "
                                  f"outside the teacher's vocabulary [0, {vocab_size})")


def check_generation_args(model_dir: str, num_conversations: int | None, batch_size: int, max_new_tokens: int,
                          max_prompt_tokens: int, topk: int, time_limit_s: float | None, per_category: int,
                          block: int, followup_tokens: int, max_answer_tokens: int | None,
                          prompts: str = "synthetic", sharegpt_fraction: float | None = None) -> None:
    """Refuse, before anything is written or loaded, settings that would crash generation later or run it on
    nothing (ConfigError naming the ``python -m mindspore_eagle.train.data`` flag, the value and what is allowed),
    including a batch whose caches alone need more memory than this machine has, and a ShareGPT source whose
    package is not installed."""
    from ..teacher_config import TeacherConfig
    from .sharegpt import check_prompt_source, find_dataset_file

    check_prompt_source(prompts, sharegpt_fraction)
    if prompts != "synthetic":
        find_dataset_file()

    for flag, value, low in (("--num-conversations", num_conversations, 1), ("--batch-size", batch_size, 1),
                             ("--max-new-tokens", max_new_tokens, 1), ("--max-prompt-tokens", max_prompt_tokens, 1),
                             ("--per-category", per_category, 1), ("--max-answer-tokens", max_answer_tokens, 1),
                             ("block", block, 1), ("followup_tokens", followup_tokens, 0)):
        if value is not None and value < low:
            raise ConfigError(f"{flag} {value}: must be >= {low}")
    if time_limit_s is not None and not (math.isfinite(time_limit_s) and time_limit_s > 0):
        raise ConfigError(f"--time-limit {time_limit_s}: must be a finite number of seconds > 0 (leave it out for "
                          "no limit)")
    if not os.path.isdir(model_dir):
        raise ConfigError(f"teacher {model_dir}: no such directory; pass --teacher DIR (a converted teacher)")
    cfg = TeacherConfig.load(model_dir)
    if not 1 <= topk <= cfg.vocab_size:
        raise ConfigError(f"--topk {topk}: must be in [1, {cfg.vocab_size}] (the teacher's vocabulary)")
    rows_one = max_prompt_tokens + max_new_tokens + 1
    rows_two = rows_one + max_new_tokens + followup_tokens
    if rows_two > cfg.max_position_embeddings:
        raise ConfigError(f"--max-new-tokens {max_new_tokens} with --max-prompt-tokens {max_prompt_tokens}: a "
                          f"two-turn conversation needs {rows_two} cache rows, past the teacher's "
                          f"{cfg.max_position_embeddings} positions (max_position_embeddings)")
    # both teachers' fp32 KV caches (one per cache size: K and V, every layer) and each generator's per-slot fp16
    # features and top-k ids and logits
    kv_row = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4
    need = sum(batch_size * rows * (kv_row + 3 * cfg.hidden_size * 2 + topk * 6) for rows in (rows_one, rows_two))
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > total:
        raise ConfigError(f"--batch-size {batch_size}: {batch_size} slots of up to {rows_two} cache rows need at "
                          f"least {need / 2 ** 30:.1f} GiB, more than this machine's {total / 2 ** 30:.1f} GiB; use a "
                          "smaller --batch-size (or shorter --max-prompt-tokens / --max-new-tokens)")


def stored_answer_tokens(out_dir: str) -> int:
    """Answer tokens of the shards listed in the manifest."""
    return int(sum(rec.get("answer_tokens", 0) for rec in read_manifest(out_dir)))


def finished_conversations(out_dir: str) -> set[str]:
    return {conversation_id(pid) for rec in read_manifest(out_dir) for pid in rec["ids"]}


def prepare_append(out_dir: str) -> list[dict]:
    """Make a claimed data directory ready for more shards; returns its manifest records. Temporary shards of an
    interrupted write are removed and a torn manifest tail is cut off (with a message), so the next record goes
    after the last complete one, not after a fragment."""
    for stale in glob.glob(os.path.join(out_dir, "*.tmp.npz")):
        os.remove(stale)
    read_manifest(out_dir)  # says so if its last line is torn
    if repair_manifest(out_dir):
        print(f"{os.path.join(out_dir, MANIFEST)}: torn last line removed before resuming", file=sys.stderr)
    return read_manifest(out_dir)


def append_shard(out_dir: str, index: int, finished: list) -> dict:
    """Write the conversations ``finished`` (``batch_greedy.Finished``) as shard ``index`` of ``out_dir``, then
    append its manifest record (after the rename: a listed shard is always whole); returns the record."""
    seqs = [s for f in finished for s in f.sequences]
    name = os.path.basename(write_shard(
        out_dir, index, seqs, [st for f in finished for st in f.starts],
        [k for f in finished for k in range(len(f.sequences))],
        [f.item.category for f in finished for _ in f.sequences]))
    rec = {"shard": name, "ids": [f.item.id for f in finished], "sequences": len(seqs),
           "tokens": int(sum(len(s.tokens) for s in seqs)),
           "answer_tokens": int(sum(len(s.tokens) - s.prompt_len for s in seqs)),
           "skipped_turns": int(sum(f.skipped_turns for f in finished))}
    with open(os.path.join(out_dir, MANIFEST), "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
    return rec


def run_generation(model_dir: str, out_dir: str, items: list, tokenizer, batch_size: int, max_new_tokens: int,
                   topk: int, time_limit_s: float | None, block: int, cache_rows: tuple[int, int],
                   max_answer_tokens: int | None = None, identity: dict | None = None) -> None:
    """Generate ``items`` (``EvalItem`` conversations, none of them finished yet) into shards of ``out_dir``.

    Blocks of ``block`` conversations (so every category and both kinds progress together); in each,
    single-turn conversations on a cache of ``cache_rows[0]`` rows, then longer ones on ``cache_rows[1]``
    (at most two teachers for the run). A shard is written every ``batch_size // 4`` finished conversations
    and when the run stops (time limit, answer-token limit, Ctrl-C, SIGTERM), so an interruption loses the
    conversations in flight. ``identity`` (default: ``data_identity`` of the teacher, ``topk`` and
    ``max_new_tokens``) must be the directory's own (``claim_data_dir``), else nothing is generated.
    """
    from ..runtime import RuntimeConfig
    from ..teacher_config import TeacherConfig
    from ..teacher import Teacher
    from .batch_greedy import BatchGreedyGenerator

    check_prompt_ids(items, TeacherConfig.load(model_dir).vocab_size)  # before the teacher loads
    claim_data_dir(out_dir, identity or data_identity(model_dir, topk, max_new_tokens))
    manifest = prepare_append(out_dir)
    done0 = len(finished_conversations(out_dir))
    state = {"shard": len(manifest), "done": done0, "tokens": 0, "buffer": []}
    tokens0 = stored_answer_tokens(out_dir)
    progress = _Progress(done0 + len(items), done0,
                         token_goal=None if max_answer_tokens is None else max_answer_tokens - tokens0)
    flush_every = max(1, batch_size // 4)
    eos = tokenizer.eos_token_ids if tokenizer is not None else ()

    def flush() -> None:
        buf = state["buffer"]
        if not buf:
            return
        append_shard(out_dir, state["shard"], buf)
        state["shard"] += 1
        state["done"] += len(buf)
        state["buffer"] = []

    def on_finished(f) -> None:
        state["buffer"].append(f)
        state["tokens"] += sum(len(a) for a in f.answers)
        if len(state["buffer"]) >= flush_every:
            flush()
        progress(state["done"] + len(state["buffer"]), state["tokens"])

    t0 = time.time()

    def enough_tokens() -> bool:
        return max_answer_tokens is not None and tokens0 + state["tokens"] >= max_answer_tokens

    def over(_=None) -> bool:
        return enough_tokens() or (time_limit_s is not None and time.time() - t0 > time_limit_s)

    generators: dict[int, object] = {}

    def generator(rows: int):
        """One teacher per cache size for the whole run: MindSpore does not free a teacher's weights when it is
        dropped (measured: +0.6 GB per Teacher.load of the default model), so teachers are never rebuilt."""
        if rows not in generators:
            teacher = Teacher.load(model_dir, RuntimeConfig(max_cache_len=rows, batch_size=batch_size, buckets=(1,),
                                                            prefill_chunk=1))
            generators[rows] = BatchGreedyGenerator(teacher, max_new_tokens, eos, topk, tokenizer)
        return generators[rows]

    try:
        with _sigterm_as_interrupt():
            for i in range(0, len(items), block):
                chunk = items[i:i + block]
                for rows, group in ((cache_rows[0], [c for c in chunk if c.num_turns == 1]),
                                    (cache_rows[1], [c for c in chunk if c.num_turns > 1])):
                    if group and not over():
                        generator(rows).run(group, on_finished, should_stop=over)
        if over():
            why = f"{max_answer_tokens} answer tokens" if enough_tokens() else f"time limit {time_limit_s:.0f}s"
            print(f"\n{why} reached; rerun to resume", file=sys.stderr)
    except KeyboardInterrupt:
        print("\ninterrupted; rerun to resume", file=sys.stderr)
        raise
    finally:
        flush()
        progress(state["done"], state["tokens"], force=True)
        print(file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """``python -m mindspore_eagle.train.data [--config RECIPE] [--FIELD VALUE ...]`` (``train_config.DataConfig``)."""
    from ..storage.assets import default_model_dir
    from .train_config import DataConfig, build_data_parser

    ns = build_data_parser().parse_args(argv)
    try:
        c = DataConfig.from_args(ns)
        teacher = c.teacher or default_model_dir()
        if not os.path.isdir(teacher):
            raise ConfigError(f"teacher {teacher}: no such directory; pass --teacher DIR (a converted teacher)")
        out = c.out or default_data_dir(teacher)
        if c.from_ledger is not None:  # a recipe whose answers are kept in git: rebuild them, answer nothing anew
            from .rebuild import rebuild_from_ledger

            print(rebuild_from_ledger(c.from_ledger, teacher, out, time_limit_s=c.time_limit,
                                      retarget=c.retarget).summary(out))
            return 0
        n = generate_dataset(teacher, out, c.num_conversations, c.batch_size, c.max_new_tokens, c.max_prompt_tokens,
                             c.topk, time_limit_s=c.time_limit, per_category=c.per_category,
                             second_turns=c.second_turns, max_answer_tokens=c.max_answer_tokens, prompts=c.prompts,
                             sharegpt_fraction=c.sharegpt_fraction, skip_ledger=c.skip_ledger)
    except KeyboardInterrupt:
        return 130
    except EagleError as exc:  # as the mindspore-eagle CLI: one line, exit 2, no traceback
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # disk full, read-only: the shards written so far are whole and listed; rerun resumes
        print(f"error: {exc} (the data written so far is complete; free space and rerun to resume)", file=sys.stderr)
        return 2
    print(f"{n} conversations in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
