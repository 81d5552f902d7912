"""The one builder: teacher, engine, tokenizer and per-request draft for every entry point.

``mindspore-eagle generate / bench / eval``, the msrun generation script, the sweep and ablation scripts and the
MindFormers adapter all build through ``build``, so every one of them gets the same checks in the same order:

1. the deployment plan (``deploy.prepare``: device, Ascend limits, compile cache), which also picks the attention
   core -- the *one* ``AttentionChoice``, passed explicitly to the teacher and to the draft head;
2. the tree budget against the runtime's buckets (``RuntimeConfig.check_tree_size``) before any weight is read;
3. the teacher (strict load), the tokenizer and the end-of-turn ids;
4. the draft: ``proposer`` "eagle" (the shipped EAGLE-3 head or a head directory), "suffix" (model-free suffix
   matches over the conversation) or "hybrid" (both in one tree, ``draft.hybrid``), with a ``budget_mode``
   "fixed" (every step verifies the tree budget's nodes) or "adaptive" (each step picks its bucket from the
   candidates' acceptance estimates and the measured bucket costs); loaded once, reused per request. Or an oracle
   bound ("oracle" / "wrong" as ``draft``, made per request from that request's greedy output). With the suffix
   source on, ``suffix_calibration`` "shipped" (default) scores suffix candidates with the shipped table;
   "online" corrects it by what the teacher accepts (``draft.online_calibration``: for another teacher).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from .config import RuntimeConfig, TeacherConfig
from .draft_config import DraftConfig, TreeBudget
from .engine import SpeculativeEngine
from .errors import ConfigError
from .harness import ProposerFactory
from .teacher import Teacher

ORACLES = ("oracle", "wrong")
PROPOSERS = ("eagle", "suffix", "hybrid")
BUDGET_MODES = ("fixed", "adaptive")
SUFFIX_CALIBRATIONS = ("online", "shipped")


@dataclass(frozen=True)
class Stack:
    """Everything one entry point runs with. ``proposer_for`` is None when built without a draft."""

    teacher: Teacher
    engine: SpeculativeEngine
    tokenizer: object | None  # mindspore_eagle.tokenizer.Tokenizer; None when built without one
    eos: tuple[int, ...]  # end-of-turn ids: the model config's, then the tokenizer's
    model_dir: str  # absolute
    proposer_for: ProposerFactory | None
    draft_label: str  # absolute head directory, "oracle", "wrong", "suffix" (no head), or "none"
    budget: TreeBudget | None
    proposer: str = "eagle"  # PROPOSERS (or the oracle's name)
    budget_mode: str = "fixed"  # BUDGET_MODES
    suffix_calibration: str = "shipped"  # SUFFIX_CALIBRATIONS (unused without the suffix source)

    def with_draft(self, draft: str | None, budget: TreeBudget, window: int | None = None, proposer: str = "eagle",
                   budget_mode: str = "fixed", suffix_calibration: str = "shipped") -> "Stack":
        """This stack (same teacher, engine and tokenizer) with another draft: sweeps load the teacher once."""
        from .draft import HybridProposer, default_head_dir, load_proposer

        check_draft_kind(draft, proposer, budget_mode, suffix_calibration)
        check_draft_fits(self.teacher.runtime, draft, budget)
        if draft in ORACLES:
            factory = oracle_factory(draft, budget.depth, self.teacher.cfg.vocab_size)
            return dataclasses.replace(self, proposer_for=factory, draft_label=draft, budget=budget, proposer=draft,
                                       budget_mode="fixed")
        buckets = self.teacher.runtime.buckets
        head = None if proposer == "suffix" else load_proposer(draft, self.teacher, budget, window)
        if proposer == "eagle" and budget_mode == "fixed":
            made = head  # the plain EAGLE-3 proposer: exactly its trees
        else:
            cap = budget.max_nodes if budget_mode == "fixed" else buckets.largest
            made = HybridProposer(proposer, budget_mode, eagle=head, max_nodes=cap, buckets=buckets.sizes,
                                  learn_acceptance=suffix_calibration == "online")
        label = "suffix" if head is None else os.path.abspath(draft or default_head_dir())
        return dataclasses.replace(self, proposer_for=lambda greedy: made, draft_label=label, budget=budget,
                                   proposer=proposer, budget_mode=budget_mode, suffix_calibration=suffix_calibration)


def build(model: str | None, runtime: RuntimeConfig, draft: str | None = None, budget: TreeBudget | None = None, *,
          speculative: bool = True, window: int | None = None, deployment=None, tokenizer: bool = True,
          proposer: str = "eagle", budget_mode: str = "fixed", suffix_calibration: str = "shipped") -> Stack:
    """Build a ``Stack`` (see the module docstring). ``model`` None: the installed default teacher; ``draft`` None:
    the shipped head for it; ``speculative`` False: teacher only (no draft is loaded)."""
    from . import deploy
    from .assets import require_default_model
    from .draft import default_head_dir

    model_dir = os.path.abspath(model or require_default_model())
    budget = (budget or TreeBudget()) if speculative else None
    if budget is not None:
        check_draft_kind(draft, proposer, budget_mode, suffix_calibration)
        check_draft_fits(runtime, draft, budget)
    teacher_cfg = TeacherConfig.load(model_dir)
    check_cache_fits(runtime, teacher_cfg)
    draft_cfg = None
    if speculative and draft not in ORACLES and runtime.device == "Ascend":
        head_dir = draft or default_head_dir()
        draft_cfg = DraftConfig.load(head_dir) if os.path.isdir(head_dir) else None  # a missing one: reported below
    choice = deploy.prepare(runtime, budget, teacher_cfg, deployment, draft_cfg)
    teacher = Teacher.load(model_dir, runtime, choice)  # Linears: runtime.dtype / runtime.matmul (kernels.matmul_for)
    tok = None
    if tokenizer:
        from .tokenizer import load_tokenizer

        tok = load_tokenizer(model_dir)
    eos = tuple(dict.fromkeys(tuple(teacher.cfg.eos_token_ids) + (tuple(tok.eos_token_ids) if tok else ())))
    stack = Stack(teacher, SpeculativeEngine(teacher), tok, eos, model_dir, None, "none", None)
    return (stack.with_draft(draft, budget, window, proposer, budget_mode, suffix_calibration) if speculative
            else stack)


def check_draft_kind(draft: str | None, proposer: str, budget_mode: str, suffix_calibration: str = "shipped") -> None:
    """ConfigError naming the flag when the proposer, budget mode or suffix calibration is unknown (before anything
    loads). An oracle ``draft`` replaces the proposer altogether (the flags are then ignored)."""
    if proposer not in PROPOSERS:
        raise ConfigError(f"--proposer {proposer!r}: expected one of {PROPOSERS}")
    if budget_mode not in BUDGET_MODES:
        raise ConfigError(f"--budget {budget_mode!r}: expected one of {BUDGET_MODES}")
    if suffix_calibration not in SUFFIX_CALIBRATIONS:
        raise ConfigError(f"--suffix-calibration {suffix_calibration!r}: expected one of {SUFFIX_CALIBRATIONS}")


def check_draft_fits(runtime: RuntimeConfig, draft: str | None, budget: TreeBudget) -> None:
    """ConfigError naming both when the draft's largest tree fits no bucket of ``runtime``: ``budget.max_nodes`` for a
    head, ``depth + 1`` for an oracle chain."""
    if draft in ORACLES:
        runtime.check_tree_size(budget.depth + 1, "oracle chain of TreeBudget.depth + 1")
    else:
        runtime.check_tree_size(budget.max_nodes)
        # a level deeper than the largest bucket can never be verified, and growing it costs memory and time
        # (--depth 100000 died of a numpy allocation error): refused with the bound
        runtime.check_tree_size(budget.depth + 1, "--depth + 1 (the root and one node per level)")


def cache_bytes(runtime: RuntimeConfig, cfg: TeacherConfig) -> int:
    """Bytes of the teacher's static KV cache: K and V, every layer, fp32."""
    return 2 * cfg.num_layers * runtime.batch_size * cfg.num_kv_heads * runtime.max_cache_len * cfg.head_dim * 4


def check_cache_fits(runtime: RuntimeConfig, cfg: TeacherConfig) -> None:
    """ConfigError, before any buffer is allocated, when the cache is longer than the model's positions or larger
    than half of this machine's memory (the draft head's cache and the graphs need the rest)."""
    if runtime.max_cache_len > cfg.max_position_embeddings:
        raise ConfigError(f"--max-cache-len {runtime.max_cache_len} exceeds the model's max_position_embeddings="
                          f"{cfg.max_position_embeddings}: positions past it were never trained; use at most that")
    check_cache_memory(runtime, cfg, f"--max-cache-len {runtime.max_cache_len}")


def check_cache_memory(runtime: RuntimeConfig, cfg: TeacherConfig, what: str) -> None:
    """ConfigError naming ``what`` (the flags that sized the cache) when the teacher's KV cache would take more than
    half of this machine's memory."""
    need = cache_bytes(runtime, cfg)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > total // 2:
        raise ConfigError(f"{what}: the KV cache alone needs {need / 2**30:.1f} GiB, more than half of this machine's "
                          f"{total / 2**30:.1f} GiB; use a shorter cache")


def oracle_factory(mode: str, depth: int, vocab_size: int) -> ProposerFactory:
    """Per request, an ``OracleProposer`` over that request's greedy output (a bound, not a draft)."""
    from .oracle import OracleProposer

    if mode not in ORACLES:
        raise ConfigError(f"oracle mode {mode!r}: expected one of {ORACLES}")
    return lambda greedy: OracleProposer(greedy.tokens, depth, vocab_size, mode)


__all__ = ["BUDGET_MODES", "ORACLES", "PROPOSERS", "Stack", "build", "cache_bytes", "check_cache_fits",
           "check_cache_memory", "check_draft_fits", "check_draft_kind", "oracle_factory"]
