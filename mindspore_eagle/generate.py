"""Teacher-only greedy generation: the baseline every speculative result is compared against.

Prefill runs in chunks of ``RuntimeConfig.prefill_chunk`` tokens (each padded to a bucket), then one token
per step. Rows ``[0, L)`` of the cache hold the committed sequence; each step writes row ``L`` and commits it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .errors import CacheCapacityError, ConfigError
from .teacher import Teacher
from .tree.mask import causal_mask


@dataclass(frozen=True)
class GenerationResult:
    """Tokens produced for one prompt and where the time went."""

    prompt_tokens: tuple[int, ...]
    tokens: tuple[int, ...]
    stop_reason: str  # "eos" | "max_new_tokens" | "cache_full"
    ttft_s: float  # prompt submitted -> first new token known
    total_s: float
    steps: int  # teacher forwards after prefill
    extra: dict = field(default_factory=dict)

    @property
    def decode_tok_s(self) -> float:
        """New tokens per second after the first token (prefill excluded)."""
        n = len(self.tokens) - 1
        dt = self.total_s - self.ttft_s
        return n / dt if n > 0 and dt > 0 else float("nan")

    @property
    def tok_s(self) -> float:
        """New tokens per second over the whole request (prefill included)."""
        return len(self.tokens) / self.total_s if self.total_s > 0 else float("nan")


def plan_prefill(num_tokens: int, start: int, teacher: Teacher) -> list[tuple[int, int, int]]:
    """Split a prompt into ``(offset, size, bucket)`` chunks whose padded writes stay inside the cache.

    Example: 70 tokens from row 0, chunk 64, buckets (1, 8, 16, 32, 64), cache 1024 ->
    ``[(0, 64, 64), (64, 6, 8)]``. Near the end of the cache a chunk shrinks to a bucket that fits.
    """
    rt = teacher.runtime
    chunks, off = [], 0
    while off < num_tokens:
        size = min(num_tokens - off, rt.prefill_chunk)
        bucket = rt.bucket_for(size)
        room = teacher.max_len - (start + off)
        if bucket > room:
            bucket = max(b for b in rt.buckets if b <= min(size, room))
            size = bucket
        chunks.append((off, size, bucket))
        off += size
    return chunks


def prefill(teacher: Teacher, prompt: Sequence[int], start: int = 0):
    """Write ``prompt`` into cache rows ``[start, start + len)``; return the last forward's output."""
    ids = np.asarray(prompt, np.int64)[None, :]
    out = None
    for off, size, bucket in plan_prefill(len(prompt), start, teacher):
        pos = start + off + np.arange(size)[None, :]
        out = teacher.forward(ids[:, off:off + size], pos, pos, causal_mask(start + off, size, teacher.max_len),
                              bucket)
    return out


def validate_prompt(prompt: Sequence[int], teacher: Teacher) -> None:
    if len(prompt) == 0:
        raise ConfigError("empty prompt: at least one token is required")
    bad = [t for t in prompt if not 0 <= int(t) < teacher.cfg.vocab_size]
    if bad:
        raise ConfigError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {teacher.cfg.vocab_size})")
    if len(prompt) >= teacher.max_len:
        raise CacheCapacityError(f"prompt of {len(prompt)} tokens does not fit the cache: max_cache_len="
                                 f"{teacher.max_len} must exceed the prompt length")


def greedy_generate(teacher: Teacher, prompt: Sequence[int], max_new_tokens: int,
                    eos_token_ids: Sequence[int] = (), on_token: Callable[[int], None] | None = None
                    ) -> GenerationResult:
    """Greedy decoding with the teacher alone. Stops at EOS (included in the output), ``max_new_tokens``
    or a full cache."""
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens}: must be >= 1")
    validate_prompt(prompt, teacher)
    eos = set(int(e) for e in eos_token_ids)
    t0 = time.perf_counter()
    out = prefill(teacher, prompt)
    tok = int(np.argmax(out.logits[0, -1]))
    ttft = time.perf_counter() - t0
    tokens, L, steps = [tok], len(prompt), 0
    if on_token:
        on_token(tok)
    stop = "eos" if tok in eos else "max_new_tokens"
    while tok not in eos and len(tokens) < max_new_tokens:
        if L >= teacher.max_len:
            stop = "cache_full"
            break
        pos = np.array([[L]])
        out = teacher.forward(np.array([[tok]]), pos, pos, causal_mask(L, 1, teacher.max_len), 1)
        steps += 1
        L += 1
        tok = int(np.argmax(out.logits[0, -1]))
        tokens.append(tok)
        if on_token:
            on_token(tok)
        if tok in eos:
            stop = "eos"
    return GenerationResult(tuple(int(t) for t in prompt), tuple(tokens), stop, ttft,
                            time.perf_counter() - t0, steps)
