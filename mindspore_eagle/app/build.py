"""The one builder: teacher, engine, tokenizer and per-request draft for every entry point.

``mindspore-eagle generate / bench / eval``, the msrun generation script, the sweep and ablation scripts and the
MindFormers adapter all build through ``build``, so every one of them gets the same checks in the same order:

1. the deployment plan (``deploy.prepare``: device, Ascend limits, compile cache), which also picks how the models
   compute -- the *one* ``compute.ComputeChoice`` (attention core and matmul), passed explicitly to the teacher and
   to the draft head;
2. the drafting (``DraftingConfig``, validated where it was made) against the runtime's buckets
   (``DraftingConfig.check_fits``) before any weight is read;
3. the teacher (strict load), the tokenizer and the end-of-turn ids;
4. the draft the ``DraftingConfig`` describes: proposer "eagle" (the shipped EAGLE-3 head or a head directory),
   "suffix" (model-free suffix matches over the conversation) or "hybrid" (both in one tree, ``draft.hybrid``),
   with the fixed or adaptive budget, every step at most ``max_nodes`` nodes; loaded once, reused per request.
   Or an oracle bound ("oracle" / "wrong" as the head, made per request from that request's greedy output).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from ..draft_config import DraftConfig
from ..drafting import ORACLES, BudgetMode, DraftingConfig, Proposer
from ..engine import SpeculativeEngine
from ..errors import ConfigError
from ..runtime import RuntimeConfig
from ..teacher import Teacher
from ..teacher_config import TeacherConfig
from .harness import ProposerFactory


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
    drafting: DraftingConfig | None  # None: teacher only

    def with_drafting(self, drafting: DraftingConfig) -> "Stack":
        """This stack (same teacher, engine and tokenizer) with another drafting: sweeps load the teacher once."""
        from ..draft import HybridProposer, default_head_dir, load_proposer

        drafting.check_fits(self.teacher.runtime)
        budget = drafting.tree_budget()
        if drafting.oracle:
            factory = oracle_factory(drafting.head, drafting.depth, self.teacher.cfg.vocab_size)
            return dataclasses.replace(self, proposer_for=factory, draft_label=drafting.head, drafting=drafting)
        head = load_proposer(drafting.head, self.teacher, budget) if drafting.uses_head else None
        if drafting.proposer is Proposer.EAGLE and drafting.budget is BudgetMode.FIXED:
            made = head  # the plain EAGLE-3 proposer: exactly its trees
        else:
            made = HybridProposer(drafting, head, buckets=self.teacher.runtime.buckets)
        label = "suffix" if head is None else os.path.abspath(drafting.head or default_head_dir())
        return dataclasses.replace(self, proposer_for=lambda greedy: made, draft_label=label, drafting=drafting)


def build(model: str | None, runtime: RuntimeConfig, drafting: DraftingConfig | None = DraftingConfig(), *,
          deployment=None, tokenizer: bool = True) -> Stack:
    """Build a ``Stack`` (see the module docstring). ``model`` None: the installed default teacher; ``drafting``
    None: teacher only (no draft is loaded); its ``head`` None: the shipped head for the default teacher."""
    from .. import deploy
    from ..storage.assets import require_default_model
    from ..draft import default_head_dir

    model_dir = os.path.abspath(model or require_default_model())
    if drafting is not None:
        drafting.check_fits(runtime)  # before anything is read
    teacher_cfg = TeacherConfig.load(model_dir)
    check_cache_fits(runtime, teacher_cfg)
    draft_cfg = None
    if drafting is not None and drafting.uses_head and runtime.device == "Ascend":
        head_dir = drafting.head or default_head_dir()
        draft_cfg = DraftConfig.load(head_dir) if os.path.isdir(head_dir) else None  # a missing one: reported below
    choice = deploy.prepare(runtime, drafting, teacher_cfg, deployment, draft_cfg)  # compute.choose
    teacher = Teacher.load(model_dir, runtime, choice)
    tok = None
    if tokenizer:
        from ..tokenizer import load_tokenizer

        tok = load_tokenizer(model_dir)
    eos = tuple(dict.fromkeys(tuple(teacher.cfg.eos_token_ids) + (tuple(tok.eos_token_ids) if tok else ())))
    stack = Stack(teacher, SpeculativeEngine(teacher), tok, eos, model_dir, None, "none", None)
    return stack.with_drafting(drafting) if drafting is not None else stack


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
    from ..oracle import OracleProposer

    if mode not in ORACLES:
        raise ConfigError(f"oracle mode {mode!r}: expected one of {ORACLES}")
    return lambda greedy: OracleProposer(greedy.tokens, depth, vocab_size, mode)


__all__ = ["ORACLES", "Stack", "build", "cache_bytes", "check_cache_fits", "check_cache_memory", "oracle_factory"]
