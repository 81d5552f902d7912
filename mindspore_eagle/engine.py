"""The one generation loop: prefill, then draft -> check -> pad -> mask -> verify -> accept -> commit -> emit.

Teacher-only greedy (or sampling) decoding is the same loop with a proposer that proposes a one-node tree
(just the root), so "speculative == greedy" always compares like with like. Batch size 1.

One step, with ``L`` the committed length and ``root`` the last emitted token (not yet in the cache):

    layout = proposer.propose(root)               # TreeLayout, node 0 = root
    check_tree(layout, vocab)                     # host, every step, before the teacher runs
    bucket = smallest runtime bucket >= nodes     # static shapes: one graph per bucket
    L = cache.begin_round(bucket)                 # capacity check before any write
    teacher.forward(tokens, L + depth, L + i, tree_attention_mask(layout, L, max_len))
    acc = accept(layout, logits)                  # accepted path + bonus
    cache.commit(acc.path, mode)                  # rows L.. hold root + accepted nodes; L += len(path)
    proposer.accept(acc, aux_hidden[path])        # the draft catches up on the committed tokens
    emit acc.tokens                               # the accepted drafts, then the bonus (the next root)

*reference* mode runs the teacher in PyNative and cross-checks every step (the mask rebuilt by a naive
ancestor walk, the acceptance path against the tree); *performance* mode runs the same code compiled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from .cache import BranchableKVCache, CommitMode
from .errors import CacheCapacityError, ConfigError, EagleError, TreeInvariantError
from .generate import plan_prefill, validate_prompt
from .teacher import Teacher
from .trace import StepTrace
from .tree import TreeLayout, check_tree, tree_attention_mask
from .tree.mask import MASK_VALUE, causal_mask
from .verify import Acceptance, SamplingParams, accept_sampling, sample_token


class Proposer(Protocol):
    """What the loop needs from a draft: catch up on committed tokens, propose a tree from a root."""

    def begin(self, prompt: Sequence[int], aux_hidden: np.ndarray, first_token: int) -> None:
        """A new request: the teacher prefilled ``prompt`` (features ``aux_hidden [len(prompt), 3H]``) and
        produced ``first_token``, the first root."""

    def propose(self, root_token: int) -> TreeLayout:
        """A tree of draft continuations under ``root_token`` (node 0)."""

    def accept(self, acceptance: Acceptance, aux_hidden: np.ndarray) -> None:
        """The teacher committed ``acceptance.path`` (features ``aux_hidden [len(path), 3H]`` of those nodes);
        ``acceptance.bonus`` is the next root."""


class RootOnlyProposer:
    """Proposes the one-node tree: the loop then is plain teacher-only decoding (the baseline)."""

    def begin(self, prompt, aux_hidden, first_token) -> None:
        pass

    def propose(self, root_token: int) -> TreeLayout:
        return TreeLayout.single(root_token)

    def accept(self, acceptance, aux_hidden) -> None:
        pass


@dataclass(frozen=True)
class Generation:
    """Tokens produced for one prompt, why generation stopped, and where the time went."""

    prompt_tokens: tuple[int, ...]
    tokens: tuple[int, ...]
    stop_reason: str  # "eos" | "max_new_tokens" | "cache_full"
    ttft_s: float  # prompt submitted -> first new token known
    total_s: float
    steps: tuple[StepTrace, ...] = field(default=(), repr=False)
    prefill_teacher_s: float = 0.0  # teacher forward time of the prefill chunks

    @property
    def teacher_s(self) -> float:
        """Seconds inside teacher forwards (prefill and verification)."""
        return self.prefill_teacher_s + self.seconds("teacher")

    @property
    def cycles(self) -> int:
        return len(self.steps)

    @property
    def tau(self) -> float:
        """Mean tokens emitted per speculative cycle (accepted drafts + bonus)."""
        return float(np.mean([s.emitted for s in self.steps])) if self.steps else float("nan")

    @property
    def tok_s(self) -> float:
        return len(self.tokens) / self.total_s if self.total_s > 0 else float("nan")

    @property
    def decode_tok_s(self) -> float:
        """New tokens per second after the first (prefill excluded)."""
        dt = self.total_s - self.ttft_s
        return (len(self.tokens) - 1) / dt if len(self.tokens) > 1 and dt > 0 else float("nan")

    def seconds(self, phase: str) -> float:
        """Total seconds spent in ``phase`` ("draft", "verify", "commit" or "teacher") over all steps."""
        return float(sum(getattr(s, f"{phase}_ms") for s in self.steps)) / 1000


class SpeculativeEngine:
    """Teacher + proposer + branchable teacher cache; ``generate`` is the only generation loop."""

    def __init__(self, teacher: Teacher, proposer: Proposer | None = None,
                 commit_mode: CommitMode | None = None):
        if teacher.runtime.batch_size != 1:
            raise ConfigError(f"SpeculativeEngine supports batch_size=1 (got {teacher.runtime.batch_size})")
        self.teacher = teacher
        self.proposer = proposer if proposer is not None else RootOnlyProposer()
        self.cache = BranchableKVCache.for_teacher(teacher)
        # None: LENGTH when the accepted path is already in place (a chain prefix), else PATH_INDEX.
        self.commit_mode = commit_mode
        self.reference = teacher.runtime.exec_mode == "reference"

    # ----- prefill ------------------------------------------------------------------------------------
    def _prefill(self, prompt: Sequence[int]) -> tuple[np.ndarray, np.ndarray, float]:
        """Write the prompt into rows [0, len) chunk by chunk; return (last logits [V], aux [len, 3H],
        teacher forward seconds)."""
        ids = np.asarray(prompt, np.int64)[None, :]
        aux, logits, seconds = [], None, 0.0
        for off, size, bucket in plan_prefill(len(prompt), 0, self.teacher):
            L = self.cache.begin_round(bucket)
            pos = L + np.arange(size)[None, :]
            out = self.teacher.forward(ids[:, off:off + size], pos, pos, causal_mask(L, size, self.teacher.max_len),
                                       bucket)
            self.cache.commit(list(range(size)), CommitMode.LENGTH)
            aux.append(out.aux_hidden[0])
            logits = out.logits[0, -1]
            seconds += out.seconds
        return logits, np.concatenate(aux, 0), seconds

    # ----- one speculative step -----------------------------------------------------------------------
    def _bucket(self, num_nodes: int) -> int:
        return self.teacher.runtime.bucket_for(num_nodes)

    def _check(self, layout: TreeLayout, L: int, mask: np.ndarray) -> None:
        check_tree(layout, self.teacher.cfg.vocab_size)
        if self.reference:
            naive = _naive_tree_mask(layout, L, self.teacher.max_len)
            if not np.array_equal(naive, mask):
                raise TreeInvariantError("reference cross-check: tree_attention_mask differs from a naive "
                                         "ancestor walk")

    def _step(self, root: int, sampling: SamplingParams, rng: np.random.Generator, step: int) -> StepTrace:
        t0 = time.perf_counter()
        layout = self.proposer.propose(root)
        t1 = time.perf_counter()
        if int(layout.tokens[0]) != root:
            raise TreeInvariantError(f"proposer returned a tree whose root token {int(layout.tokens[0])} is not "
                                     f"the last emitted token {root}")
        n = layout.num_nodes
        bucket = self._bucket(n)
        if self.cache.committed_len + bucket > self.cache.max_len:
            # Near the end of the cache: verify the root alone if that still fits (raises when it does not).
            layout, n, bucket = TreeLayout.single(root), 1, 1
        L = self.cache.begin_round(bucket)
        mask = tree_attention_mask(layout, L, self.teacher.max_len)
        self._check(layout, L, mask)
        positions = layout.positions(L)[None, :]
        rows = L + np.arange(n)[None, :]
        out = self.teacher.forward(layout.tokens[None, :], positions, rows, mask, bucket)
        t2 = time.perf_counter()
        logits = out.logits[0]
        acc = accept_sampling(layout, logits, sampling, rng)
        if self.reference:
            for a, b in zip(acc.path[:-1], acc.path[1:]):
                if int(layout.parents[b]) != a:
                    raise TreeInvariantError(f"reference cross-check: accepted path {acc.path} is not a tree path")
        chain = acc.path == tuple(range(len(acc.path)))
        mode = self.commit_mode or (CommitMode.LENGTH if chain else CommitMode.PATH_INDEX)
        if mode is CommitMode.LENGTH and not chain:
            mode = CommitMode.PATH_INDEX  # LENGTH applies only to paths already in place
        self.cache.commit(acc.path, mode)
        self.proposer.accept(acc, out.aux_hidden[0, list(acc.path)])
        t3 = time.perf_counter()
        return StepTrace(step=step, committed_len=L, tree_nodes=n, bucket=bucket,
                         depth=int(layout.depth[: n].max()), accepted_len=acc.num_accepted, bonus=acc.bonus,
                         path=acc.path, tokens=acc.tokens, commit_mode=mode.value,
                         draft_ms=(t1 - t0) * 1000, verify_ms=(t2 - t1) * 1000, commit_ms=(t3 - t2) * 1000,
                         teacher_ms=out.seconds * 1000)

    # ----- the loop -----------------------------------------------------------------------------------
    def generate(self, prompt: Sequence[int], max_new_tokens: int, eos_token_ids: Sequence[int] = (),
                 sampling: SamplingParams = SamplingParams(), on_token: Callable[[int], None] | None = None,
                 on_step: Callable[[StepTrace], None] | None = None) -> Generation:
        """Generate up to ``max_new_tokens`` tokens after ``prompt``. Stops at EOS (included), the token limit or
        a full cache (tokens so far returned). Errors in the request raise before anything is written; the
        engine is reset at the start of every request, so it stays usable after an error."""
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens={max_new_tokens}: must be >= 1")
        validate_prompt(prompt, self.teacher)
        self.cache.reset()
        eos = {int(e) for e in eos_token_ids}
        rng = np.random.default_rng(sampling.seed)
        t0 = time.perf_counter()
        logits, aux, prefill_s = self._prefill(prompt)
        root = sample_token(logits, sampling, rng)
        ttft = time.perf_counter() - t0
        self.proposer.begin(prompt, aux, root)
        tokens = [root]
        if on_token:
            on_token(root)
        steps: list[StepTrace] = []
        stop = "eos" if root in eos else "max_new_tokens"
        while stop != "eos" and len(tokens) < max_new_tokens:
            try:
                trace = self._step(root, sampling, rng, len(steps))
            except CacheCapacityError:
                stop = "cache_full"
                break
            steps.append(trace)
            if on_step:
                on_step(trace)
            for tok in trace.tokens:
                tokens.append(tok)
                if on_token:
                    on_token(tok)
                if tok in eos:
                    stop = "eos"
                    break
                if len(tokens) >= max_new_tokens:
                    break
            root = trace.bonus
        return Generation(tuple(int(t) for t in prompt), tuple(tokens[:max_new_tokens]), stop, ttft,
                          time.perf_counter() - t0, tuple(steps), prefill_s)


def _naive_tree_mask(layout: TreeLayout, committed_len: int, cache_len: int) -> np.ndarray:
    """Reference-mode cross-check: the tree mask by walking parents node by node (no vectorised tables)."""
    n = layout.num_nodes
    mask = np.full((1, 1, n, cache_len), MASK_VALUE, np.float32)
    for i in range(n):
        mask[0, 0, i, :committed_len] = 0.0
        j = i
        while True:
            mask[0, 0, i, committed_len + j] = 0.0
            if j == 0 or not layout.valid[i]:
                break
            j = int(layout.parents[j])
    return mask


__all__ = ["Generation", "Proposer", "RootOnlyProposer", "SpeculativeEngine", "EagleError"]
