"""Batched greedy generation of training conversations, one token per slot per step, slots refilled at once.

Why this shape. On a 2-core CPU one forward of ``B`` rows costs far less than ``B`` single-row forwards, and
the teacher reads its whole static cache every step, so the cost of a step grows with ``B x max_len``. The
generator therefore keeps ``B`` *slots* busy all the time and sizes the cache to the longest turn it admits:

* every step feeds one token per slot at that slot's next row (= position): a prompt token (teacher forcing:
  the prompt is "prefilled" one row per step, like a decode step) or the slot's last greedy token;
* a slot whose conversation is finished takes the next conversation on the very next step; no slot waits
  for the longest sequence of a batch, and there is no prefill padding;
* a new prompt reuses the rows its slot already holds for the same leading tokens (the chat template's
  system prompt, a shared instruction, and a second turn's whole first turn): those rows were computed from
  exactly these tokens, so only the rows from the first differing position on are fed again;
* the last cache row ``max_len - 1`` is the *idle row*: a slot with nothing to do feeds a dummy token there;
  no sequence ever uses it, and its outputs are dropped.

Why rows may be overwritten freely. Slot ``b`` feeding row ``r`` sees rows ``0..r`` of its own cache only
(``GreedyTopK``), and rows are fed in increasing order from the first differing position, so every row a
query sees was written for the current tokens. Example: a slot held ``[s, y, s, t, e, m, a, b, c]`` (rows 0..8
fed); the next prompt is ``[s, y, s, t, e, m, x]``: the common prefix is 6 rows, so the slot feeds ``x`` at
row 6 and rows 7, 8 (stale) are hidden until they are overwritten.

A conversation is an ``evalset.EvalItem``; turn ``k``'s prompt is ``evaluate.build_prompt`` (the chat
template over the earlier turns and the teacher's own greedy answers, EOS stripped): exactly how the
evaluation builds an MT-Bench second turn. Each finished turn becomes a ``sequence.Sequence_``: turn 1 from row 0,
a later turn from its first newly fed position (its window), so a second turn stores no row twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from ..errors import CacheCapacityError
from ..evaluation.evalset import EvalItem
from ..evaluation.evaluate import build_prompt
from .sequence import Sequence_
from .topk_teacher import GreedyTopK


def turn_pid(item_id: str, k: int) -> str:
    """Sequence id of turn ``k`` (0-based): the conversation id for the first turn, ``{id}-t{k+1}`` after."""
    return item_id if k == 0 else f"{item_id}-t{k + 1}"


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id lists. Example: ([1, 2, 3], [1, 2, 5, 6]) -> 2."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def reused_rows(held: Sequence[int], prompt: Sequence[int]) -> int:
    """Rows a slot whose cache holds the rows of ``held`` keeps for ``prompt``: their common prefix, leaving at least
    one prompt token to feed (its row yields the first answer token). It is also where a later turn's stored window
    starts (``held``: the fed rows of the turn before). Example: ([s, y, s, a, b], [s, y, s, x]) -> 3;
    ([s, y], [s, y]) -> 1."""
    return min(common_prefix(held, prompt), len(prompt) - 1)


@dataclass(frozen=True)
class Finished:
    """One finished conversation: a sequence per generated turn, the answers, and turns left out."""

    item: EvalItem
    sequences: tuple[Sequence_, ...]
    answers: tuple[tuple[int, ...], ...]
    starts: tuple[int, ...]  # position of each stored sequence's first token in the conversation
    skipped_turns: int  # later turns whose prompt + max_new_tokens did not fit the cache


@dataclass
class GenerationStats:
    steps: int = 0
    slot_steps: int = 0  # slot-rows that fed a real token (the rest were idle)
    prompt_rows: int = 0  # rows fed with prompt tokens
    reused_rows: int = 0  # prompt rows not fed because the slot already held them
    answer_tokens: int = 0
    conversations: int = 0
    seconds: float = 0.0

    @property
    def answer_tok_s(self) -> float:
        return self.answer_tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {"steps": self.steps, "slot_steps": self.slot_steps, "prompt_rows": self.prompt_rows,
                "reused_rows": self.reused_rows, "answer_tokens": self.answer_tokens,
                "conversations": self.conversations, "seconds": round(self.seconds, 2),
                "answer_tok_s": round(self.answer_tok_s, 1)}


@dataclass
class _Slot:
    """Host state of one slot. ``tokens[:fed]`` are the tokens whose rows the slot's cache holds."""

    item: EvalItem | None = None
    turn: int = 0
    tokens: list[int] = field(default_factory=list)  # current turn: prompt, then greedy answer so far
    fed: int = 0
    prompt_len: int = 0
    start: int = 0  # first position of this turn's stored window
    answers: list[tuple[int, ...]] = field(default_factory=list)
    sequences: list[Sequence_] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)


class BatchGreedyGenerator:
    """``run(items, on_finished)``: greedy answers to every turn of every conversation, ``B`` slots at a time.

    ``teacher``: a ``Teacher`` (any ``batch_size``, ``max_cache_len`` = the longest turn admitted + 1 idle
    row); ``tokenizer``: needed for text turns (``None`` for ``turns_ids`` items). A turn needs
    ``len(prompt) + max_new_tokens <= max_cache_len``: a first turn that does not fit raises
    ``CacheCapacityError`` (filter prompts before), a later one ends its conversation (``skipped_turns``).
    """

    def __init__(self, teacher, max_new_tokens: int, eos_ids: Iterable[int], topk: int = 32, tokenizer=None):
        if max_new_tokens < 1:
            raise CacheCapacityError(f"max_new_tokens={max_new_tokens}: must be >= 1")
        self.step_fn = GreedyTopK(teacher, topk)
        self.batch_size = teacher.runtime.batch_size
        self.max_len = teacher.max_len
        self.idle_row = self.max_len - 1
        self.max_new_tokens = max_new_tokens
        self.eos = tuple(int(e) for e in eos_ids)
        self._eos_set = set(self.eos)
        self.tokenizer = tokenizer
        width = 3 * teacher.cfg.hidden_size
        b, s = self.batch_size, self.max_len
        self._feats = np.zeros((b, s, width), np.float16)  # [B, S, 3H] outputs by position, per slot
        self._tk_ids = np.zeros((b, s, topk), np.int32)  # [B, S, k]
        self._tk_val = np.zeros((b, s, topk), np.float16)

    def fits(self, prompt_len: int) -> bool:
        return prompt_len + self.max_new_tokens <= self.max_len

    # ---- slot transitions ---------------------------------------------------------------------------
    def _begin_turn(self, slot: _Slot, prompt: list[int], stats: GenerationStats) -> None:
        """Point ``slot`` at ``prompt``, reusing the rows it already holds for the same leading tokens."""
        d = reused_rows(slot.tokens[:slot.fed], prompt)
        stats.reused_rows += d
        slot.tokens, slot.fed, slot.prompt_len = list(prompt), d, len(prompt)
        slot.start = 0 if slot.turn == 0 else d

    def _admit(self, slot: _Slot, queue: Iterator[EvalItem], stats: GenerationStats) -> None:
        item = next(queue, None)
        slot.item, slot.turn, slot.answers, slot.sequences, slot.starts = item, 0, [], [], []
        if item is None:
            return
        prompt = build_prompt(item, 0, [], self.tokenizer, self.eos)
        if not self.fits(len(prompt)):
            raise CacheCapacityError(f"{item.id}: prompt of {len(prompt)} tokens + max_new_tokens="
                                     f"{self.max_new_tokens} exceed max_cache_len={self.max_len}")
        self._begin_turn(slot, prompt, stats)

    def _finish_turn(self, b: int, slot: _Slot, stats: GenerationStats) -> Finished | None:
        """Store the finished turn; start the next one, or return the finished conversation."""
        n, s0 = len(slot.tokens), slot.start
        slot.sequences.append(Sequence_(
            turn_pid(slot.item.id, slot.turn), np.array(slot.tokens[s0:], np.int32), slot.prompt_len - s0,
            self._feats[b, s0:n - 1].copy(), self._tk_ids[b, s0:n - 1].copy(), self._tk_val[b, s0:n - 1].copy()))
        slot.starts.append(s0)
        slot.answers.append(tuple(slot.tokens[slot.prompt_len:]))
        slot.turn += 1
        if slot.turn < slot.item.num_turns:
            prompt = build_prompt(slot.item, slot.turn, slot.answers, self.tokenizer, self.eos)
            if self.fits(len(prompt)):
                self._begin_turn(slot, prompt, stats)
                return None
        stats.conversations += 1
        return Finished(slot.item, tuple(slot.sequences), tuple(slot.answers), tuple(slot.starts),
                        slot.item.num_turns - slot.turn)

    # ---- the loop -----------------------------------------------------------------------------------
    def run(self, items: Iterable[EvalItem], on_finished: Callable[[Finished], None],
            should_stop: Callable[[GenerationStats], bool] | None = None,
            on_step: Callable[[GenerationStats], None] | None = None) -> GenerationStats:
        """Generate until every item is finished or ``should_stop(stats)`` is true (checked every step; the
        conversations in flight are then dropped, never reported half done)."""
        stats = GenerationStats()
        t0 = time.perf_counter()
        queue = iter(items)
        slots = [_Slot() for _ in range(self.batch_size)]
        for slot in slots:
            self._admit(slot, queue, stats)
        ids = np.zeros(self.batch_size, np.int64)
        rows = np.zeros(self.batch_size, np.int64)
        while any(s.item is not None for s in slots):
            active = np.array([s.item is not None for s in slots])
            for b, s in enumerate(slots):
                ids[b], rows[b] = (s.tokens[s.fed], s.fed) if s.item is not None else (0, self.idle_row)
            out = self.step_fn.step(ids, rows)
            act = np.flatnonzero(active)
            self._feats[act, rows[act]] = out.aux_hidden[act]
            self._tk_ids[act, rows[act]] = out.topk_ids[act]
            self._tk_val[act, rows[act]] = out.topk_logits[act]
            stats.steps += 1
            stats.slot_steps += int(act.size)
            for b in act:
                s = slots[b]
                s.fed += 1
                if s.fed < len(s.tokens):  # still feeding the prompt
                    stats.prompt_rows += 1
                    continue
                if s.fed == s.prompt_len:
                    stats.prompt_rows += 1  # the last prompt row (it yields the first answer token)
                tok = int(out.greedy[b])
                s.tokens.append(tok)
                stats.answer_tokens += 1
                if tok in self._eos_set or len(s.tokens) - s.prompt_len >= self.max_new_tokens:
                    done = self._finish_turn(b, s, stats)
                    if done is not None:
                        on_finished(done)
                        self._admit(s, queue, stats)
            stats.seconds = time.perf_counter() - t0
            if on_step:
                on_step(stats)
            if should_stop is not None and should_stop(stats):
                break
        stats.seconds = time.perf_counter() - t0
        return stats


__all__ = ["BatchGreedyGenerator", "Finished", "GenerationStats", "common_prefix", "reused_rows", "turn_pid"]
