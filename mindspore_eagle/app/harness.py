"""Greedy vs speculative on the same prompt, side by side: the one comparison harness.

``bench``, ``eval`` and the msrun generation script all measure the same way, through ``warm_up`` and
``compare`` (``generate`` warms up the same way before its one timed request):

* **warm-up** (untimed, never reported): before the first timed request every graph either run can meet is
  compiled -- a prompt of each bucket length up to the prefill chunk (each prefill bucket of the teacher), greedy
  then speculative, the draft head's context forward at every bucket (``Eagle3Proposer.warm_up``: an adaptive
  hybrid proposer catches the head up on many tokens at once, in any bucket), the cache's row-move graph of every
  tree bucket, and
  (primitive attention path) every context bucket a longer request reaches with the token buckets seen so far.
  Without it the first request whose prompt ends in a new bucket pays a compile inside one of its two timed runs
  and reports a bogus speedup (measured: 3.2 instead of 11.5 tok/s greedy).
* **compare**: the teacher-only greedy run, then the speculative run, one after the other on one engine (so on
  one teacher and one cache), each timed over the whole request (prefill included, as in the EAGLE papers).

The draft of a request is made per request by a ``ProposerFactory`` from that request's greedy ``Generation``:
oracles read the greedy output (they are bounds, not drafts); a real head ignores it and returns the proposer it
holds (``begin`` resets it). No state is shared between requests except that proposer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..engine import Generation, Proposer, SpeculativeEngine
from ..errors import ConfigError
from ..verify import SamplingParams

ProposerFactory = Callable[[Generation], Proposer]
"""The draft of one request, given the teacher-only greedy generation of the same request."""


@dataclass(frozen=True)
class Comparison:
    """The greedy and the speculative generation of one prompt, and which draft source the accepted tokens came
    from (``{"eagle": n, "suffix": n, "both": n}``; None for a draft without sources, e.g. an oracle)."""

    greedy: Generation
    spec: Generation
    sources: dict | None = None

    @property
    def lossless(self) -> bool:
        return self.greedy.tokens == self.spec.tokens

    @property
    def speedup(self) -> float:
        return self.spec.tok_s / self.greedy.tok_s


def compare(engine: SpeculativeEngine, prompt: Sequence[int], proposer_for: ProposerFactory, max_new_tokens: int,
            eos: Sequence[int] = (), sampling: SamplingParams = SamplingParams()) -> Comparison:
    """Greedy then speculative on ``prompt`` (timed separately, same sampling parameters)."""
    greedy = engine.generate(prompt, max_new_tokens, eos, sampling)
    proposer = proposer_for(greedy)
    spec = engine.generate(prompt, max_new_tokens, eos, sampling, proposer=proposer)
    return Comparison(greedy, spec, accepted_sources(proposer, spec))


def accepted_sources(proposer: Proposer, spec: Generation) -> dict | None:
    """Accepted draft tokens of ``spec`` by the source that proposed them."""
    from ..draft import Eagle3Proposer, HybridProposer

    if isinstance(proposer, HybridProposer):
        return proposer.accepted_by_source()
    if isinstance(proposer, Eagle3Proposer):
        return {"eagle": sum(s.accepted_len for s in spec.steps), "suffix": 0, "both": 0}
    return None


def warm_up(engine: SpeculativeEngine, proposer_for: ProposerFactory | None, example: Sequence[int],
            max_new_tokens: int, eos: Sequence[int] = ()) -> None:
    """Compile every shape a timed request can meet (see the module docstring). ``example`` is any prompt: it is
    repeated or cut to each bucket length, so it needs at least one token (ConfigError, before anything compiles).
    ``proposer_for`` None: greedy only."""
    example = list(example)
    if not example:
        raise ConfigError("empty prompt: the warm-up repeats the prompt to each bucket length and needs at least one "
                          "token; give a prompt that encodes to one or more tokens")
    rt, max_len = engine.runtime, engine.teacher.max_len
    proposer = None
    for b in rt.buckets.sizes:
        if b > rt.prefill_chunk or b + 16 >= max_len:
            continue
        ids = (example * (b // len(example) + 1))[:b]
        greedy = engine.generate(ids, min(8, max_new_tokens), eos)
        if proposer_for is not None:
            proposer = proposer_for(greedy)
            engine.generate(ids, min(16, max_new_tokens), eos, proposer=proposer)
    _warm_up_context_buckets(engine, example)
    _warm_up_head(proposer)
    if proposer_for is not None:
        for b in rt.buckets.sizes:  # the row-move graph of each tree bucket
            if b >= 3:
                engine.cache.warm_up_commit(b)
        engine.cache.reset()


def _warm_up_head(proposer) -> None:
    """The EAGLE head's context forward at every bucket (``Eagle3Proposer.warm_up``): the requests above reach
    only the buckets their catch-ups happened to need, and an adaptive hybrid proposer may skip growth (hence
    catch-ups) for most of them."""
    from ..draft import Eagle3Proposer, HybridProposer

    head = proposer.eagle if isinstance(proposer, HybridProposer) else proposer
    if isinstance(head, Eagle3Proposer):
        head.warm_up()


def _warm_up_context_buckets(engine: SpeculativeEngine, example: Sequence[int]) -> None:
    """The greedy graph of every (token bucket the requests above used, context bucket) not compiled yet: one
    forward at the end of each context bucket (committed length ``width - tokens``), in a round that is then
    discarded. Nothing to do where the teacher has one mask width (the fused CPU kernels)."""
    from ..tree import ForwardInputs, TreeLayout

    teacher, cache = engine.teacher, engine.cache
    used = sorted({t for _, t, _ in teacher.first_call_s})
    for width in teacher.mask_widths:
        for t in used:
            if t > width or (teacher.greedy_output, t, width) in teacher.first_call_s:
                continue
            cache.reset()
            if width > t:
                cache.begin_round(width - t)
                cache.commit(range(width - t))  # stale rows stand in for a committed prefix: never read back
            L = cache.begin_round(t)
            ids = (list(example) * (t // len(example) + 1))[:t]
            teacher.forward(ForwardInputs.for_tree(TreeLayout.chain(ids), L, t, width), teacher.greedy_output)
            cache.abort_round()
    cache.reset()


__all__ = ["Comparison", "ProposerFactory", "accepted_sources", "compare", "warm_up"]
