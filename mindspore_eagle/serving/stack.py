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
from ..drafting import SERVING_DRAFTING, BudgetMode, DraftingConfig
from ..errors import ConfigError
from .batch import BatchEngine


@dataclass(frozen=True)
class BatchStack:
    engine: BatchEngine
    tokenizer: object
    eos: tuple[int, ...]
    model_dir: str
    drafting: DraftingConfig | None  # None: no speculation


def proposer_factory(buckets: Buckets, drafting: DraftingConfig, heads=None, explore_every: int | None = None,
                     gain_guard: bool = True):
    """``make(slot, source)``: the ``HybridProposer`` for the request admitted to ``slot``, as ``drafting`` describes
    it or with the request's own draft source (``source``, ``request_drafting``); the engine ranks its candidates
    globally (``build_batch`` refuses a fixed budget). With ``heads`` (``SlotHeads``) its head drafts in the slot's
    region. ``learn_costs`` is off: the engine measures the cost of the batched forward itself. What describes the
    teacher and the head rather than one conversation is shared by every request's proposer, as the single-request
    engine's one proposer keeps it across requests: the ``AcceptanceRatio`` (what the teacher accepts) and the
    ``EagleProfile`` (what the head's candidates are worth, which decides when it grows); a fresh one per request
    would start every request at the prior. ``explore_every``: the proposers' (None: ``HybridProposer``'s default;
    tests set 1 to grow the head every step); ``gain_guard``: theirs (the engine feeds it; tests that need every
    step drafted turn it off)."""
    from ..draft.budget import AcceptanceRatio, EagleProfile, VerifyCosts
    from ..draft.hybrid import HybridProposer

    costs = VerifyCosts().covering(buckets.sizes)
    ratio, profile = AcceptanceRatio(), EagleProfile()
    extra = {"gain_guard": gain_guard} | ({} if explore_every is None else {"explore_every": explore_every})

    def make(slot: int, source: str | None = None):
        config = drafting if source is None else request_drafting(drafting, source)
        eagle = heads.slot(slot) if heads is not None and config.uses_head else None
        prop = HybridProposer(config, eagle, buckets=buckets, costs=costs, learn_costs=False, **extra)
        prop.ratio, prop.profile = ratio, profile
        return prop

    return make


def request_drafting(drafting: DraftingConfig, source: str) -> DraftingConfig:
    """``drafting`` with a request's own draft source: its head directory dropped for "suffix", its online suffix
    calibration dropped for "eagle" (neither applies); everything else, the bound first, the engine's."""
    from ..drafting import CalibrationMode

    fields = {"proposer": source}
    if source == "suffix":
        fields["head"] = None
    if source == "eagle":
        fields["suffix_calibration"] = CalibrationMode.SHIPPED
    return dataclasses.replace(drafting, **fields)


def single_proposer(stack: BatchStack):
    """The proposer the single-request engine (``generate``) would draft with for ``stack``'s drafting: one
    ``HybridProposer`` that learns its own step costs, its head drafting in slot 0's region (``bench-batch`` runs it
    while the batch engine is idle, as the c = 1 reference); None without speculation."""
    from ..draft.hybrid import HybridProposer

    if stack.drafting is None:
        return None
    eagle = stack.engine.heads.slot(0) if stack.engine.heads is not None else None
    return HybridProposer(stack.drafting, eagle, buckets=stack.engine.buckets)


def load_slot_heads(drafting: DraftingConfig, teacher, max_seqs: int, slot_len: int):
    """The ``SlotHeads`` for ``drafting``'s head (the shipped one, or ``drafting.head``): its cache sized for every
    slot, embeddings shared with the teacher, attention and matmul the teacher's."""
    from ..draft.proposer import embed_table_for, load_head, resolve_head_dir
    from .slot_heads import SlotHeads

    budget = drafting.tree_budget()
    rows = SlotHeads.cache_rows(max_seqs, slot_len, budget, teacher.runtime.buckets.largest)
    head = load_head(resolve_head_dir(drafting.head), rows, teacher.compute)
    table = embed_table_for(head, teacher)
    return SlotHeads(head, table, budget, max_seqs, slot_len, teacher.runtime.buckets, teacher.runtime.exec_mode)


def build_batch(model: str | None, max_seqs: int, slot_len: int, runtime: RuntimeConfig | None = None,
                drafting: DraftingConfig | None = SERVING_DRAFTING, max_queued: int = 256,
                tokenizer: bool = True) -> BatchStack:
    """A ``BatchStack``: ``max_seqs`` slots of ``slot_len`` rows (prompt + completion) each. ``runtime`` gives dtype,
    matmul, weights and buckets (its ``max_cache_len`` and ``batch_size`` are replaced); ``drafting`` None: no
    speculation; else the drafting it describes (suffix index, EAGLE-3 head in per-slot draft contexts, or both)
    under the global (adaptive) budget, every request's step at most ``drafting.max_nodes`` nodes (a request may
    lower its own bound)."""
    from .. import deploy
    from ..storage.assets import require_default_model
    from ..teacher import Teacher

    if drafting is not None and drafting.oracle:
        raise ConfigError(f"--draft {drafting.head}: an oracle bound needs the request's greedy output in advance; "
                          "the batch engine serves requests as they come (use `generate` or `eval` for bounds)")
    if drafting is not None and drafting.budget is not BudgetMode.ADAPTIVE:
        raise ConfigError("--budget fixed: the batch engine ranks every request's candidates under one global "
                          "budget (adaptive); bound a request's tree with --max-nodes instead")
    runtime = runtime or RuntimeConfig()
    largest = runtime.buckets.largest
    if isinstance(max_seqs, bool) or not isinstance(max_seqs, int) or not 1 <= max_seqs <= largest:
        raise ConfigError(f"--max-seqs {max_seqs!r}: must be an integer in [1, {largest}] (each running request "
                          "needs a row of the largest bucket every step)")
    if isinstance(slot_len, bool) or not isinstance(slot_len, int) or slot_len <= largest:
        raise ConfigError(f"--max-cache-len {slot_len!r}: must be an integer above the largest bucket {largest}")
    if drafting is not None and drafting.uses_head:
        from ..draft.proposer import resolve_head_dir

        resolve_head_dir(drafting.head)  # AssetError before any weight is read
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
    heads = (load_slot_heads(drafting, teacher, max_seqs, slot_len)
             if drafting is not None and drafting.uses_head else None)
    factory = proposer_factory(runtime.buckets, drafting, heads) if drafting is not None else None
    engine = BatchEngine(teacher, max_seqs, slot_len, factory, max_queued=max_queued,
                         max_nodes=drafting.max_nodes if drafting is not None else None, heads=heads)
    tok = None
    if tokenizer:
        from ..tokenizer import load_tokenizer

        tok = load_tokenizer(model_dir)
    eos = tuple(dict.fromkeys(tuple(cfg.eos_token_ids) + (tuple(tok.eos_token_ids) if tok else ())))
    return BatchStack(engine, tok, eos, model_dir, drafting)


__all__ = ["BatchStack", "SERVING_DRAFTING", "build_batch", "load_slot_heads",
           "proposer_factory", "single_proposer"]
