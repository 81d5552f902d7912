"""The fixed compile plan: every graph a single-request run can meet, compiled in one canonical order before any
request, through MindSpore's compile cache when that is safe (``storage.graph_cache``).

The graphs (fused-attention teacher: one mask width; the default on every CPU with kernels):

1. the teacher's forward at every token bucket, for each output the run asks for ("argmax" for greedy requests,
   "logits" for sampled ones), one forward of a chain in a round that is then discarded;
2. the cache's row-move graph of every tree bucket of 3 rows or more (a path ``[0, 2]``; smaller trees never move
   a row);
3. the draft head's context forward at every bucket (``Eagle3Proposer.warm_up_steps``) and its growth graph.

Why a plan and not the harness's warm-up alone: the warm-up runs requests, and which tree buckets a request meets
first depends on the adaptive budget's measured times, so its compile order changes from run to run -- and the
compile cache hands out graphs by order. The warm-up still runs after the plan (it teaches the adaptive budget
this machine's costs); every graph it meets is then already compiled.

The primitive attention path (no kernel library: one graph per token bucket and *context* bucket) has no plan:
it compiles as before, without the cache.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..storage.graph_cache import GraphCache, compiled_graphs, source_digest


@dataclass(frozen=True)
class PlanStep:
    label: str
    run: Callable[[], None]


def plan_steps(engine, proposer=None, outputs: tuple[str, ...] = ("argmax",)) -> list[PlanStep]:
    """The plan of ``engine`` (a ``SpeculativeEngine`` on a fused-attention teacher) and ``proposer`` (None, an
    ``Eagle3Proposer``, or a ``HybridProposer``), in its canonical order (module docstring)."""
    from ..draft import Eagle3Proposer, HybridProposer

    teacher, cache = engine.teacher, engine.cache
    sizes = [b for b in teacher.runtime.buckets.sizes if b <= teacher.max_len]
    width = teacher.max_len
    steps = [PlanStep(f"teacher {out} t={t} w={width}", _teacher_forward(engine, out, t))
             for out in outputs for t in sizes]
    if proposer is not None:
        steps += [PlanStep(f"cache row-move b={b}", lambda b=b: cache.warm_up_commit(b)) for b in sizes if b >= 3]
    head = proposer.eagle if isinstance(proposer, HybridProposer) else proposer
    if isinstance(head, Eagle3Proposer):
        steps += [PlanStep(label, run) for label, run in head.warm_up_steps()]
        steps.append(PlanStep(f"head growth {head.budget}", _head_growth(head)))
    return steps


def _teacher_forward(engine, output: str, t: int) -> Callable[[], None]:
    def run() -> None:
        from ..tree import ForwardInputs, TreeLayout

        engine.cache.reset()
        L = engine.cache.begin_round(t)
        ids = [0] * t
        engine.teacher.forward(ForwardInputs.for_tree(TreeLayout.chain(ids), L, t, engine.teacher.max_len), output)
        engine.cache.reset()
    return run


def _head_growth(head) -> Callable[[], None]:
    def run() -> None:
        head.reset()
        head.extend([0], np.zeros((1, 3 * head.head.cfg.target_hidden_size), np.float32))
        head.candidates()
        head.reset()
    return run


def key_parts(teacher, model_dir: str, head_dir: str | None, drafting, **extra) -> dict:
    """What the graphs depend on besides the plan's labels: MindSpore, this package's code, the kernel library and
    path, the greedy output (the greedy Q8 head's graph where it is fast: every SIMD path, AVX-512 with or without
    VNNI, AVX2 and NEON), the model's and head's content, the runtime, compute and
    drafting configs, and ``extra`` (the batch engine's slots)."""
    import mindspore

    from ..kernels.build import current_isa, load
    from ..storage.fingerprint import directory_fingerprint

    lib = load().library
    return {"mindspore": mindspore.__version__, "sources": source_digest(),
            "kernels": os.path.basename(lib.path) if lib else "", "isa": current_isa(),
            "greedy": teacher.greedy_output + ("+q8head" if getattr(teacher.cell, "greedy_head_ready", False) else ""),
            "model": directory_fingerprint(model_dir),
            "head": directory_fingerprint(head_dir) if head_dir else "",
            "runtime": repr(teacher.runtime), "compute": repr(teacher.compute), "drafting": repr(drafting), **extra}


@dataclass(frozen=True)
class PlanReport:
    """What ``compile_ahead`` did: ``mode`` "fill" / "load" / "off" (``reason``), graphs and seconds."""

    mode: str
    reason: str
    graphs: int
    seconds: float
    path: str

    def line(self) -> str:
        what = {"fill": "compiled and cached", "load": "loaded from the compile cache",
                "off": "compiled"}[self.mode]
        why = f" (compile cache off: {self.reason})" if self.mode == "off" and self.reason else ""
        return f"{self.graphs} graphs {what} in {self.seconds:.1f} s{why}"


def compile_ahead(stack, proposer=None, sampled: bool = False, cache_root: str | None = None) -> PlanReport | None:
    """Run the plan of ``stack`` (an ``app.build.Stack``) and ``proposer`` before any request, through the compile
    cache under ``cache_root`` (None: no cache). None when the teacher has no plan (the primitive attention
    path, or PyNative "reference" mode: nothing compiles)."""
    from ..runtime import ExecMode

    engine = stack.engine
    if not engine.teacher.cell.fused_attention or engine.runtime.exec_mode is not ExecMode.PERFORMANCE:
        return None
    outputs = (engine.teacher.greedy_output,) + (("logits",) if sampled and engine.teacher.greedy_output != "logits"
                                                 else ())
    label = stack.draft_label
    head_dir = label if os.path.isabs(label) and os.path.isdir(label) else None
    return run_plan(plan_steps(engine, proposer, outputs), cache_root,
                    lambda: key_parts(stack.teacher, stack.model_dir, head_dir, stack.drafting))


def compile_batch_ahead(stack, cache_root: str | None = None) -> PlanReport:
    """The batch engine's warm-up (``BatchEngine.warm_up_steps``: already one fixed order) for ``stack`` (a
    ``serving.stack.BatchStack``), through the compile cache under ``cache_root`` (None: no cache)."""
    from ..draft.proposer import resolve_head_dir

    engine, drafting = stack.engine, stack.drafting
    head_dir = resolve_head_dir(drafting.head) if drafting is not None and drafting.uses_head else None
    return run_plan(engine.warm_up_steps(), cache_root,
                    lambda: key_parts(engine.teacher, stack.model_dir, head_dir, drafting, max_seqs=engine.max_seqs,
                                      slot_len=engine.slot_len))


def run_plan(steps, cache_root: str | None, key: Callable[[], dict]) -> PlanReport:
    """Run ``steps`` (``PlanStep``s, or ``(label, run)`` pairs) in order, through the compile cache under
    ``cache_root`` keyed by ``key()`` and the labels (None: no cache)."""
    steps = [s if isinstance(s, PlanStep) else PlanStep(*s) for s in steps]
    start = time.perf_counter()
    before = compiled_graphs()
    if cache_root is None:
        for step in steps:
            step.run()
        return PlanReport("off", "", compiled_graphs() - before, time.perf_counter() - start, "")
    cache = GraphCache(cache_root, key(), [s.label for s in steps])
    with cache.open() as use:
        for step in steps:
            n = compiled_graphs()
            step.run()
            if use.mode != "off":
                use.step_done(step.label, compiled_graphs() - n)
    return PlanReport(use.mode, use.reason, compiled_graphs() - before, time.perf_counter() - start, use.path)


def default_cache_root() -> str:
    from ..storage.paths import home

    return os.path.join(home(), "graph_cache")


__all__ = ["PlanReport", "PlanStep", "compile_ahead", "default_cache_root", "key_parts", "plan_steps",
           "compile_batch_ahead", "run_plan"]
