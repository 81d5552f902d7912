"""The batch engine's builder: one teacher whose cache holds every slot, a tokenizer, and per-request drafting.

``serve``, ``bench-batch`` and the tests build through ``build_batch``, so they get the same checks in the same
order, before any weight is read: the slot length against the model's positions, the whole cache against the
machine's memory, ``max_seqs`` against the largest bucket, the drafting against what the batch engine supports.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from ..app.build import check_cache_memory
from ..runtime import Buckets, RuntimeConfig
from ..teacher_config import TeacherConfig
from ..drafting import BudgetMode, DraftingConfig, Proposer
from ..errors import ConfigError
from .batch import BatchEngine

SERVING_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
"""Row buckets of the batched forward. Finer than the single-request default (1, 8, ...): a step's rows are one
root per running request plus the global budget's drafts, and a padded row costs as much as a real one."""

SERVING_DRAFTING = DraftingConfig(proposer=Proposer.SUFFIX)
"""The server's drafting unless told otherwise: the suffix index (the batch engine has no per-slot head cache yet),
ranked across requests by the global budget, the product's bound."""


@dataclass(frozen=True)
class BatchStack:
    engine: BatchEngine
    tokenizer: object
    eos: tuple[int, ...]
    model_dir: str
    drafting: DraftingConfig | None  # None: no speculation


def suffix_factory(buckets: Buckets, drafting: DraftingConfig):
    """Per request, the suffix-index proposer ``drafting`` describes (suffix, adaptive: ``build_batch`` refuses
    anything else), whose candidates the engine ranks globally. ``learn_costs`` is off: the engine measures the cost
    of the batched forward itself. One ``AcceptanceRatio`` is shared by every request's proposer: what the teacher
    accepts is learnt across requests, as the single-request engine's one proposer does (a fresh ratio per request
    would start every request at the prior)."""
    from ..draft.budget import AcceptanceRatio, VerifyCosts
    from ..draft.hybrid import HybridProposer

    costs = VerifyCosts().covering(buckets.sizes)
    ratio = AcceptanceRatio()

    def make():
        prop = HybridProposer(drafting, buckets=buckets, costs=costs, learn_costs=False)
        prop.ratio = ratio
        return prop

    return make


def build_batch(model: str | None, max_seqs: int, slot_len: int, runtime: RuntimeConfig | None = None,
                drafting: DraftingConfig | None = SERVING_DRAFTING, max_queued: int = 256,
                tokenizer: bool = True) -> BatchStack:
    """A ``BatchStack``: ``max_seqs`` slots of ``slot_len`` rows (prompt + completion) each. ``runtime`` gives dtype,
    matmul, weights and buckets (its ``max_cache_len`` and ``batch_size`` are replaced); ``drafting`` None: no
    speculation; else suffix drafting under the global (adaptive) budget, every request's step at most
    ``drafting.max_nodes`` nodes (a request may lower its own bound)."""
    from .. import deploy
    from ..storage.assets import require_default_model
    from ..teacher import Teacher

    if drafting is not None and (drafting.proposer is not Proposer.SUFFIX or drafting.oracle):
        raise ConfigError(f"--proposer {drafting.head if drafting.oracle else drafting.proposer.value}: the batch "
                          "engine drafts with the suffix index only (the EAGLE-3 head needs a head cache per slot: "
                          "not yet in the batch engine; use `generate` for head drafting)")
    if drafting is not None and drafting.budget is not BudgetMode.ADAPTIVE:
        raise ConfigError("--budget fixed: the batch engine ranks every request's candidates under one global "
                          "budget (adaptive); bound a request's tree with --max-nodes instead")
    runtime = runtime or RuntimeConfig(buckets=Buckets(SERVING_BUCKETS))
    largest = runtime.buckets.largest
    if isinstance(max_seqs, bool) or not isinstance(max_seqs, int) or not 1 <= max_seqs <= largest:
        raise ConfigError(f"--max-seqs {max_seqs!r}: must be an integer in [1, {largest}] (each running request "
                          "needs a row of the largest bucket every step)")
    if isinstance(slot_len, bool) or not isinstance(slot_len, int) or slot_len <= largest:
        raise ConfigError(f"--max-cache-len {slot_len!r}: must be an integer above the largest bucket {largest}")
    model_dir = os.path.abspath(model or require_default_model())
    cfg = TeacherConfig.load(model_dir)
    if slot_len > cfg.max_position_embeddings:
        raise ConfigError(f"--max-cache-len {slot_len} exceeds the model's max_position_embeddings="
                          f"{cfg.max_position_embeddings}")
    rows = BatchEngine.cache_rows(max_seqs, slot_len, largest)
    runtime = dataclasses.replace(runtime, max_cache_len=rows, batch_size=1,
                                  prefill_chunk=min(runtime.prefill_chunk, largest))
    check_cache_memory(runtime, cfg, f"--max-seqs {max_seqs} x --max-cache-len {slot_len}")
    if drafting is not None:
        drafting.check_fits(runtime)
        if drafting.max_nodes == 1:
            drafting = None  # the root alone: plain decoding
    choice = deploy.prepare(runtime, drafting, cfg)
    teacher = Teacher.load(model_dir, runtime, choice)
    factory = suffix_factory(runtime.buckets, drafting) if drafting is not None else None
    engine = BatchEngine(teacher, max_seqs, slot_len, factory, max_queued=max_queued,
                         max_nodes=drafting.max_nodes if drafting is not None else None)
    tok = None
    if tokenizer:
        from ..tokenizer import load_tokenizer

        tok = load_tokenizer(model_dir)
    eos = tuple(dict.fromkeys(tuple(cfg.eos_token_ids) + (tuple(tok.eos_token_ids) if tok else ())))
    return BatchStack(engine, tok, eos, model_dir, drafting)


__all__ = ["BatchStack", "SERVING_BUCKETS", "SERVING_DRAFTING", "build_batch", "suffix_factory"]
