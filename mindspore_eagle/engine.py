"""The one generation loop: prefill, then draft -> check -> pad -> mask -> verify -> accept -> commit -> update.

Teacher-only greedy (or sampling) decoding is the same loop with a proposer that proposes a one-node tree
(just the root), so "speculative == greedy" always compares like with like. Batch size 1. One engine serves a
teacher; the proposer is chosen per request (``generate(..., proposer=...)``; None = teacher only).

One step, with ``L`` the committed length and ``root`` the last emitted token (not yet in the cache):

    layout = proposer.propose(root)                  # grow:    TreeLayout, node 0 = root
    check_tree(layout, vocab)                        # host:    every rule, before any graph runs
    bucket = runtime.buckets.fit(layout.num_nodes)   #          static shapes: one graph per bucket
    L = cache.begin_round(bucket)                    #          the capacity check, before any write
    width = teacher.mask_width(L + bucket)           #          the context bucket attended
    inputs = ForwardInputs.for_tree(layout, L, bucket, width)   # the one padding rule, positions, rows, mask
    out = teacher.forward(inputs, output)            # verify:  argmax (greedy) or logits, + EAGLE-3 features
    acc = accept_greedy(layout, out.argmax)          # host:    accepted path + bonus (sampling:
                                                     #          accept_sampling(layout, out.logits, ...):
                                                     #          position-keyed, the same text with any tree)
    cache.commit(acc.path)                           # commit:  only out-of-place rows move; L += len(path)
    proposer.accept(acc, out.aux_hidden[path])       # update:  the draft catches up on the committed tokens
    emit acc.tokens                                  #          the accepted drafts, then the bonus (next root)

The phases named on the right are the ``StepTrace`` timings (``grow_ms``, ``verify_ms``, ``commit_ms``,
``update_ms``, ``host_ms``). A prefill chunk is the same forward over a ``TreeLayout.chain``.

Greedy requests (``SamplingParams.greedy``) run every forward with ``output=teacher.greedy_output``: on a device
"argmax", the teacher reduces the logits in the graph and only each row's token id crosses to the host; on the
CPU "logits" and ``np.argmax`` on the host, the cheaper reduction there (``RuntimeConfig.greedy_output``). Both
use numpy's tie rule. Sampling needs the whole distribution of a node, so it takes the logits.

*reference* mode (``ExecMode.REFERENCE``) runs the teacher in PyNative and cross-checks every step (the mask
rebuilt by a naive ancestor walk, the accepted path against the tree); *performance* mode runs the same code
compiled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from .cache import BranchableKVCache
from .errors import CacheCapacityError, ConfigError, TreeInvariantError
from .teacher import LOGITS, ForwardOut, Teacher
from .evaluation.trace import StepTrace
from .tree import ForwardInputs, TreeLayout, check_tree
from .tree.mask import MASK_VALUE
from .verify import PositionNoise, SamplingParams, accept_greedy, accept_sampling, sample_token


def _greedy_ids(out: ForwardOut) -> np.ndarray:
    """int32 ``[B, n]`` greedy token of every row: the in-graph argmax, or numpy's over the logits (same tie rule)."""
    return out.argmax if out.argmax is not None else np.argmax(out.logits, -1).astype(np.int32)


class Proposer(Protocol):
    """What the loop needs from a draft: catch up on committed tokens, propose a tree from a root.

    ``max_nodes`` is the largest tree ``propose`` returns (root included): the engine refuses a proposer whose
    trees no runtime bucket holds before the request starts."""

    max_nodes: int

    def begin(self, prompt: Sequence[int], aux_hidden: np.ndarray, first_token: int) -> None:
        """A new request: the teacher prefilled ``prompt`` (features ``aux_hidden [len(prompt), 3H]``) and
        produced ``first_token``, the first root."""

    def propose(self, root_token: int) -> TreeLayout:
        """A tree of draft continuations under ``root_token`` (node 0)."""

    def accept(self, acceptance, aux_hidden: np.ndarray) -> None:
        """The teacher committed ``acceptance.path`` (features ``aux_hidden [len(path), 3H]`` of those nodes);
        ``acceptance.bonus`` is the next root."""


class RootOnlyProposer:
    """Proposes the one-node tree: the loop then is plain teacher-only decoding (the baseline)."""

    max_nodes = 1

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
        return self.prefill_teacher_s + self.seconds("verify")

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
        """Total seconds of one step phase over all steps: "grow", "verify", "commit", "update" or "host"."""
        return float(sum(getattr(s, f"{phase}_ms") for s in self.steps)) / 1000


def validate_request(prompt: Sequence[int], max_new_tokens: int, vocab_size: int, max_len: int) -> list[int]:
    """The prompt as a list of ints, or a typed error naming the bad value (before anything runs)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r}: must be an integer >= 1")
    if isinstance(prompt, (str, bytes)):
        raise ConfigError("prompt must be a sequence of token ids, not text: encode it with the tokenizer first")
    ids = list(prompt)
    if not ids:
        raise ConfigError("empty prompt: at least one token is required")
    bad = [t for t in ids if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer))]
    if bad:
        raise ConfigError(f"prompt token ids must be integers; got {bad[:3]!r}")
    out = [int(t) for t in ids]
    bad = [t for t in out if not 0 <= t < vocab_size]
    if bad:
        raise ConfigError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
    if len(out) >= max_len:
        raise CacheCapacityError(f"prompt of {len(out)} tokens does not fit the cache: max_cache_len={max_len} must "
                                 "exceed the prompt length")
    return out


class SpeculativeEngine:
    """A teacher, the one owner of its cache rows, and ``generate``: the only generation loop."""

    def __init__(self, teacher: Teacher):
        if teacher.runtime.batch_size != 1:
            raise ConfigError(f"SpeculativeEngine supports batch_size=1 (got {teacher.runtime.batch_size})")
        self.teacher = teacher
        self.runtime = teacher.runtime
        self.cache = BranchableKVCache.for_teacher(teacher)
        self.reference = self.runtime.reference

    def check_proposer(self, proposer: Proposer) -> None:
        """ConfigError unless every tree ``proposer`` may return fits a verification bucket of this runtime."""
        self.runtime.check_tree_size(int(proposer.max_nodes), f"{type(proposer).__name__}.max_nodes")

    # ----- prefill ------------------------------------------------------------------------------------
    def _prefill(self, prompt: list[int], output: str) -> tuple[ForwardOut, np.ndarray, float]:
        """Write the prompt into rows [0, len) chunk by chunk (each a chain tree); return (the last chunk's
        ``ForwardOut`` in ``output`` form, aux [len, 3H], teacher forward seconds). Only the prompt's last row has
        its logits computed (``Teacher.forward``'s ``logit_rows``): the first token's; no other row is read."""
        aux, out, seconds, off = [], None, 0.0, 0
        for size, bucket in self.runtime.buckets.chunks(len(prompt), self.runtime.prefill_chunk, self.cache.max_len):
            L = self.cache.begin_round(bucket)
            inputs = ForwardInputs.for_tree(TreeLayout.chain(prompt[off:off + size]), L, bucket,
                                            self.teacher.mask_width(L + bucket))
            out = self.teacher.forward(inputs, output, [size - 1] if off + size == len(prompt) else [])
            self.cache.commit(range(size))
            aux.append(out.aux_hidden[0])
            seconds += out.seconds
            off += size
        return out, np.concatenate(aux, 0), seconds

    # ----- one speculative step -----------------------------------------------------------------------
    def _step(self, root: int, proposer: Proposer, sampling: SamplingParams, noise: PositionNoise,
              step: int) -> StepTrace:
        t0 = time.perf_counter()
        layout = proposer.propose(root)
        t1 = time.perf_counter()
        if int(layout.tokens[0]) != root:
            raise TreeInvariantError(f"proposer returned a tree whose root token {int(layout.tokens[0])} is not "
                                     f"the last emitted token {root}")
        if layout.num_nodes > proposer.max_nodes:
            raise TreeInvariantError(f"proposer returned {layout.num_nodes} nodes, more than its max_nodes="
                                     f"{proposer.max_nodes}")
        check_tree(layout, self.teacher.cfg.vocab_size)
        bucket = self.runtime.buckets.fit(layout.num_nodes)
        if self.cache.committed_len + bucket > self.cache.max_len:
            # Near the end of the cache: verify the root alone if that still fits (raises when it does not).
            layout, bucket = TreeLayout.single(root), 1
        L = self.cache.begin_round(bucket)
        inputs = ForwardInputs.for_tree(layout, L, bucket, self.teacher.mask_width(L + bucket))
        if self.reference:
            _cross_check_mask(layout, inputs.mask, L)
        t2 = time.perf_counter()
        out = self.teacher.forward(inputs, self.teacher.greedy_output if sampling.greedy else LOGITS)
        t3 = time.perf_counter()
        if sampling.greedy:
            acc = accept_greedy(layout, _greedy_ids(out)[0])
        else:
            acc = accept_sampling(layout, out.logits[0], sampling, noise, L + 1)  # the root sits at position L
        if self.reference:
            for a, b in zip(acc.path[:-1], acc.path[1:]):
                if int(layout.parents[b]) != a:
                    raise TreeInvariantError(f"reference cross-check: accepted path {acc.path} is not a tree path")
        t4 = time.perf_counter()
        self.cache.commit(acc.path)
        t5 = time.perf_counter()
        proposer.accept(acc, out.aux_hidden[0, list(acc.path)])
        t6 = time.perf_counter()
        ms = 1000.0
        return StepTrace(step=step, committed_len=L, tree_nodes=layout.num_nodes, bucket=bucket,
                         depth=layout.max_depth, accepted_len=acc.num_accepted, bonus=acc.bonus, path=acc.path,
                         tokens=acc.tokens, grow_ms=(t1 - t0) * ms, verify_ms=(t3 - t2) * ms,
                         commit_ms=(t5 - t4) * ms, update_ms=(t6 - t5) * ms, host_ms=((t2 - t1) + (t4 - t3)) * ms)

    # ----- the loop -----------------------------------------------------------------------------------
    def generate(self, prompt: Sequence[int], max_new_tokens: int, eos_token_ids: Sequence[int] = (),
                 sampling: SamplingParams = SamplingParams(), proposer: Proposer | None = None,
                 on_token: Callable[[int], None] | None = None,
                 on_step: Callable[[StepTrace], None] | None = None) -> Generation:
        """Generate up to ``max_new_tokens`` tokens after ``prompt`` with ``proposer`` (None: teacher only).
        Stops at EOS (included), the token limit or a full cache (tokens so far returned). Errors in the request
        raise before anything is written; the cache is reset at the start of every request, so the engine stays
        usable after an error."""
        ids = validate_request(prompt, max_new_tokens, self.teacher.cfg.vocab_size, self.teacher.max_len)
        proposer = proposer if proposer is not None else RootOnlyProposer()
        self.check_proposer(proposer)
        self.cache.reset()
        eos = {int(e) for e in eos_token_ids}
        noise = PositionNoise(sampling.seed)
        t0 = time.perf_counter()
        last, aux, prefill_s = self._prefill(ids, self.teacher.greedy_output if sampling.greedy else LOGITS)
        if not sampling.greedy:
            root = sample_token(last.logits[0, -1], sampling, noise, len(ids))
        else:  # the prompt's last row only (the chunk's other rows are never read)
            root = int(last.argmax[0, -1]) if last.argmax is not None else int(np.argmax(last.logits[0, -1]))
        ttft = time.perf_counter() - t0
        proposer.begin(ids, aux, root)
        tokens = [root]
        if on_token:
            on_token(root)
        steps: list[StepTrace] = []
        stop = "eos" if root in eos else "max_new_tokens"
        while stop != "eos" and len(tokens) < max_new_tokens:
            try:
                trace = self._step(root, proposer, sampling, noise, len(steps))
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
        return Generation(tuple(ids), tuple(tokens[:max_new_tokens]), stop, ttft, time.perf_counter() - t0,
                          tuple(steps), prefill_s)


def greedy_generate(teacher: Teacher, prompt: Sequence[int], max_new_tokens: int, eos_token_ids: Sequence[int] = (),
                    on_token: Callable[[int], None] | None = None) -> Generation:
    """Teacher-only greedy decoding: the loop above with one-node trees. A convenience for one-off calls (each
    call builds an engine; a server keeps one ``SpeculativeEngine`` per teacher)."""
    return SpeculativeEngine(teacher).generate(prompt, max_new_tokens, eos_token_ids, on_token=on_token)


def _cross_check_mask(layout: TreeLayout, mask: np.ndarray, committed_len: int) -> None:
    """Reference mode: the real rows of the forward's mask equal a naive parent walk, node by node."""
    n, cache_len = layout.num_nodes, mask.shape[-1]
    naive = np.full((n, cache_len), MASK_VALUE, np.float32)
    for i in range(n):
        naive[i, :committed_len] = 0.0
        j = i
        while True:
            naive[i, committed_len + j] = 0.0
            if j == 0:
                break
            j = int(layout.parents[j])
    if not np.array_equal(naive, mask[0, 0, :n]):
        raise TreeInvariantError("reference cross-check: tree_attention_mask differs from a naive ancestor walk")


__all__ = ["Generation", "Proposer", "RootOnlyProposer", "SpeculativeEngine", "greedy_generate", "validate_request"]
