"""Prefill planning and the teacher-only greedy baseline.

Prefill runs in chunks of ``RuntimeConfig.prefill_chunk`` tokens (each padded to a bucket). Greedy decoding is
not a second loop: it is ``engine.SpeculativeEngine`` with one-node trees, so the baseline every speculative
result is compared against runs exactly the same code.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .errors import CacheCapacityError, ConfigError
from .teacher import Teacher


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
                    eos_token_ids: Sequence[int] = (), on_token: Callable[[int], None] | None = None):
    """Teacher-only greedy decoding: the speculative loop with one-node trees (``engine.SpeculativeEngine``).
    Stops at EOS (included in the output), ``max_new_tokens`` or a full cache; returns a ``Generation``."""
    from .engine import SpeculativeEngine

    return SpeculativeEngine(teacher).generate(prompt, max_new_tokens, eos_token_ids, on_token=on_token)
