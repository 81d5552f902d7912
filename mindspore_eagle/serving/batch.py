"""``BatchEngine``: many requests in one teacher forward per step, each with its own speculative tree.

Why this shape. On the CPU a forward of ``M`` rows costs far less than ``M`` one-row forwards, and speculation
competes with batching for the same rows. So one step packs, into a single forward of one static bucket:

    every running request's tree   (its root = last emitted token, plus the drafts the global budget gave it)
    prefill chunks                 (prompts written a chunk per step, interleaved with the others' decoding)
    padding                        (to the bucket; rows of a scratch region nobody reads)

The cache is flat: one teacher with batch 1 and ``max_seqs * slot_len + scratch`` cache rows; request slot ``s``
owns rows ``[s * slot_len, (s + 1) * slot_len)`` and its committed tokens sit contiguous at the start of them,
exactly as a batch-1 engine's would. Each row of the forward sees its own slot's committed rows and its tree
ancestors, nothing else (the mask built here), and the fused kernels' result for a row depends only on the
ordered sequence of (k, v) rows it sees, not on which columns they occupy nor on the other rows of the call
(``kernels/attention.cc``, ``kernels/compute.cc``). So every request's logits are bit-identical to its batch-1
logits, whatever else runs, and greedy output is identical token for token (``tests/test_batch_engine.py``
compares with the batch-1 ``SpeculativeEngine``).

Drafting. Every running request has its own ``HybridProposer`` (suffix index over its conversation; with a head,
a draft context in its slot's region of one shared head cache, ``serving.slot_heads``). Each decides whether its
head grows this step (``wants_growth``); the heads that do grow in one batched growth graph (``SlotHeads.grow``),
and each request's candidates come from its suffix match and, if it grew, its head (``draft_from``).

The global budget. Every running request drafts its candidates (``HybridProposer.draft``); their acceptance
estimates are ranked together and the total row count ``M`` is chosen to maximise expected emitted tokens per
millisecond of a forward of ``M`` rows (``plan_rows``; the costs are measured online per bucket). The best
candidates across requests fill ``M``; a request may get none (then it decodes plainly). At one request it is the
single-request adaptive rule; as the batch grows, the roots alone fill the cheap buckets and drafting turns itself
down. A per-request drafting setting is an upper bound (``Request.max_nodes``).

Threads. ``submit`` and ``cancel`` may be called from any thread; ``step`` from one thread only (the server's
engine loop). A cancel takes effect at the next step boundary: the slot is freed before the next forward.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..cache.commit import PathCommit, pad_moves, path_moves
from ..draft.budget import DEFAULT_GROW_MS, CostTracker, VerifyCosts
from ..drafting import PROPOSERS
from ..engine import validate_request
from ..errors import CacheCapacityError, ConfigError
from ..teacher import LOGITS, Teacher
from ..tree import ForwardInputs, TreeLayout, check_tree
from ..tree.mask import MASK_VALUE, tree_visibility
from ..verify import PositionNoise, SamplingParams, accept_greedy, accept_sampling, sample_token

FINISH_REASONS = ("eos", "max_new_tokens", "cache_full", "cancelled")


@dataclass
class RequestStats:
    """Speculation statistics of one request (the server reports them per response)."""

    steps: int = 0  # decode steps (verifications) the request took part in
    draft_steps: int = 0  # steps that verified at least one draft node
    drafted: int = 0  # draft nodes verified (roots excluded)
    accepted: int = 0  # draft nodes accepted
    head_growths: int = 0  # steps whose candidates include the EAGLE-3 head's (it grew for this request)

    @property
    def tau(self) -> float:
        """Mean tokens per step (accepted drafts + the bonus)."""
        return (self.accepted + self.steps) / self.steps if self.steps else float("nan")


@dataclass
class Request:
    """One request's host state. Created by ``BatchEngine.submit``; read by the caller, written by the engine."""

    id: str
    prompt: list[int]
    max_new_tokens: int
    eos: frozenset
    sampling: SamplingParams
    max_nodes: int  # nodes a step may verify for this request, root included (1 = no speculation)
    source: str | None = None  # this request's draft source ("eagle", "suffix", "hybrid"; None: the engine's)
    proposer: object | None = None
    slot: int | None = None
    written: int = 0  # rows of this request in its slot (prompt rows prefilled, then committed tokens)
    root: int | None = None  # last emitted token, not yet in the cache
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: RequestStats = field(default_factory=RequestStats)
    submitted_s: float = 0.0
    first_token_s: float | None = None
    finished_s: float | None = None
    noise: PositionNoise | None = None  # the request's position-keyed sampling noise (verify.PositionNoise)
    _aux: list = field(default_factory=list, repr=False)  # prompt rows' EAGLE-3 features (for the proposer)
    _draft_ms: float = field(default=0.0, repr=False)  # this step's drafting ms: its proposer's, its growth share
    _awake: bool = field(default=False, repr=False)  # this step drafted by the adaptive rule (the guard weighs it)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def prefilling(self) -> bool:
        return self.slot is not None and self.root is None


@dataclass(frozen=True)
class Event:
    """What one step produced for one request: new tokens (may be empty) and, at the end, the finish reason."""

    request: Request
    tokens: tuple[int, ...]
    finish_reason: str | None


def plan_rows(per_request: Sequence[np.ndarray], fixed_rows: int, costs: VerifyCosts) -> tuple[list[int], int]:
    """The global budget: how many draft nodes each request verifies this step, and the bucket.

    ``per_request[i]``: request i's candidates' acceptance estimates, largest first (its root not included);
    ``fixed_rows``: rows every plan has (each request's root, prefill chunks). The bucket ``b`` maximises
    ``(R + sum of the best b - fixed_rows estimates across all requests) / cost(b)``, R = number of requests (each
    root emits one token). Returns (drafts per request, bucket). Example: two requests with [0.9, 0.2] and [0.8],
    fixed 2, costs {1: 20, 2: 21, 4: 24, 8: 40}: bucket 4 takes 0.9 and 0.8 (E = 3.7, 0.154 tokens/ms) -> ([1, 1], 4).
    """
    flat, (_, bucket, k) = _best_plan(per_request, fixed_rows, costs, 0.0)
    counts = [0] * len(per_request)
    for _, i in flat[:k]:
        counts[i] += 1
    return counts, bucket


def _best_plan(per_request: Sequence[np.ndarray], fixed_rows: int, costs: VerifyCosts, extra_ms: float):
    """``plan_rows``' search: the candidates ranked across requests, and (rate, bucket, drafts taken) of the best
    bucket, its cost plus ``extra_ms``."""
    flat = [(float(p), i) for i, ps in enumerate(per_request) for p in np.asarray(ps, np.float64).reshape(-1)]
    flat.sort(key=lambda x: -x[0])
    cum = np.concatenate([[0.0], np.cumsum([p for p, _ in flat])])
    return flat, _best_bucket(cum, len(per_request), fixed_rows, costs, extra_ms)


def _best_bucket(cum: np.ndarray, requests: int, fixed_rows: int, costs: VerifyCosts, extra_ms: float):
    """(rate, bucket, drafts taken) of the bucket with the most expected tokens per ms: ``cum[k]`` is the sum of the
    ``k`` best candidates' estimates (``cum[0] = 0``), each request's root one token more."""
    best = None
    for bucket, ms in costs.bucket_ms:
        if bucket < fixed_rows:
            continue
        k = min(bucket - fixed_rows, cum.shape[0] - 1)
        rate = (requests + cum[k]) / (ms + extra_ms)
        if best is None or rate > best[0] + 1e-12:
            best = (rate, bucket, k)
    if best is None:
        raise ConfigError(f"{fixed_rows} rows exceed the largest bucket {costs.bucket_ms[-1][0]}")
    return best


def plan_growth(suffix: Sequence[np.ndarray], head: Sequence[np.ndarray], wanting: Sequence[int], fixed_rows: int,
                costs: VerifyCosts, growth_ms: Callable[[int], float]) -> list[int]:
    """The global budget's say on the head: which of the requests whose proposers want their head grown
    (``wanting``, indices) grow this step.

    ``suffix[i]``: request i's candidates without growth (largest first); ``head[i]``: what a growth is expected
    to add (``HybridProposer.growth_estimate``); ``growth_ms(g)``: the measured cost of growing ``g`` requests
    together (their catch-up and one batched growth). The wanting requests are taken in order of their expected
    gain and the number that grows, ``g``, maximises the plan's rate ``plan_rows`` would reach with their
    estimates, at the bucket's cost plus ``growth_ms(g)`` (``g = 0``: none grows). Why: each proposer decides on
    the single-request costs, where a growth's drafts get the rows they ask for; in a batch the rows are shared,
    the drafts of one request compete with every other's, and a growth that pays alone can cost more than its
    drafts win (measured: hybrid drafting at 4-8 requests ran at 0.74-0.82x of plain decoding without this rule).
    Example: two requests without suffix candidates, both wanting growth, head estimates [0.9, 0.8] each, fixed 2,
    costs {2: 20, 4: 22, 8: 30}: none grows at 0.1 tokens/ms; growing both, bucket 8, E = 5.4 in 30 ms + growth,
    beats that while their growth costs under 24 ms.
    """
    if not wanting:
        return []
    gain = {i: float(np.sum(head[i])) for i in wanting}
    order = sorted(wanting, key=lambda i: -gain[i])
    # the best plan's rate depends only on every candidate's estimate, not on whose it is: rank them all at once
    suffix_all = [np.asarray(s, np.float64).reshape(-1) for s in suffix]

    def rate(grown: list[int], extra_ms: float) -> float:
        values = np.sort(np.concatenate(suffix_all + [np.asarray(head[i], np.float64).reshape(-1) for i in grown]))
        cum = np.concatenate([[0.0], np.cumsum(values[::-1])])
        return _best_bucket(cum, len(suffix), fixed_rows, costs, extra_ms)[0]

    best_rate, best_g = rate([], 0.0), 0
    for g in range(1, len(order) + 1):
        r = rate(order[:g], float(growth_ms(g)))
        if r > best_rate + 1e-12:
            best_rate, best_g = r, g
    return sorted(order[:best_g])


class BatchEngine:
    """Continuous batching over one teacher (module docstring).

    ``teacher``: batch 1, fused attention (the custom kernels), ``max_cache_len >= max_seqs * slot_len + largest
    bucket`` (``BatchEngine.cache_rows`` says how many). ``proposer_factory(slot, source)``: a new proposer for the
    request admitted to ``slot``, drafting from ``source`` (None: the engine's drafting; else one of ``PROPOSERS``):
    a ``HybridProposer`` in an adaptive mode for the global budget, anything with ``propose`` otherwise; or None for
    teacher-only decoding. ``heads``: the ``SlotHeads`` the proposers' heads
    draft in, so that the heads growing in one step grow in one graph (None: no head, or each grows alone).
    ``prefill_rows``: prompt rows a step may write (default the runtime's ``prefill_chunk``).
    """

    def __init__(self, teacher: Teacher, max_seqs: int, slot_len: int,
                 proposer_factory: Callable[[int, str | None], object] | None = None, prefill_rows: int | None = None,
                 costs: VerifyCosts | None = None, max_queued: int = 256, max_nodes: int | None = None,
                 heads=None):
        rt = teacher.runtime
        largest = rt.buckets.largest
        for name, value in (("max_seqs", max_seqs), ("slot_len", slot_len), ("max_queued", max_queued)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"BatchEngine {name}={value!r}: must be an integer >= 1")
        if max_seqs > largest:
            raise ConfigError(f"--max-seqs {max_seqs}: every running request needs a row per step and the largest "
                              f"bucket holds {largest}; use at most {largest}")
        if rt.batch_size != 1:
            raise ConfigError(f"BatchEngine packs requests into rows of one batch entry; build the teacher with "
                              f"batch_size=1 (got {rt.batch_size})")
        if not teacher.cell.fused_attention:
            raise ConfigError("BatchEngine needs the fused attention kernels (a row's result must not depend on the "
                              "other requests' rows); use --matmul custom on a CPU the kernels support")
        need = self.cache_rows(max_seqs, slot_len, largest)
        if teacher.max_len < need:
            raise ConfigError(f"BatchEngine: max_seqs={max_seqs} slots of {slot_len} rows need a teacher cache of "
                              f"{need} rows (BatchEngine.cache_rows); it has {teacher.max_len}")
        self.teacher = teacher
        self.max_seqs, self.slot_len, self.largest = max_seqs, slot_len, largest
        # the bound on the nodes a step verifies for one request, root included (DraftingConfig.max_nodes)
        self.max_nodes = largest if max_nodes is None else int(max_nodes)
        if not 1 <= self.max_nodes <= largest:
            raise ConfigError(f"BatchEngine max_nodes={max_nodes!r}: must be in [1, {largest}] (the largest bucket)")
        self.scratch = max_seqs * slot_len  # padding rows write [scratch, scratch + largest)
        self.prefill_rows = int(prefill_rows or rt.prefill_chunk)
        if not 1 <= self.prefill_rows <= largest:
            raise ConfigError(f"prefill_rows={self.prefill_rows}: must be in [1, {largest}]")
        self.proposer_factory = proposer_factory
        self.heads = heads
        self.buckets = rt.buckets
        self.costs = CostTracker((costs or VerifyCosts()).covering(rt.buckets.sizes))
        # ms of growing g requests' heads in one step (catch-up + growth), by g; the prior: one growth of the shipped
        # head, each further request ~0.4 of it (measured on a 2-vCPU Xeon: the batched graph's fixed cost dominates)
        self.growth_costs = CostTracker(VerifyCosts(tuple((g, DEFAULT_GROW_MS * (0.6 + 0.4 * g))
                                                          for g in range(1, max_seqs + 1)), 0.0, 0.0))
        self.max_queued = max_queued
        self.commit_cell = PathCommit(teacher.cell.cache_parameters())
        self._commit = rt.exec_mode.compile(self.commit_cell)
        self._lock = threading.Lock()
        self._waiting: deque[Request] = deque()
        self._cancel: set[str] = set()
        self.running: list[Request] = []
        self.free_slots: list[int] = list(range(max_seqs))
        self._ids = itertools.count()
        self.steps = 0

    @staticmethod
    def cache_rows(max_seqs: int, slot_len: int, largest_bucket: int) -> int:
        """Teacher cache rows the engine needs: the slots plus a scratch region for padding rows."""
        return max_seqs * slot_len + largest_bucket

    def warm_up(self, sampling: bool = True) -> float:
        """Compile every graph a step can meet before the first request (``warm_up_steps``); returns the seconds it
        took."""
        t0 = time.perf_counter()
        for _, run in self.warm_up_steps(sampling):
            run()
        return time.perf_counter() - t0

    def warm_up_steps(self, sampling: bool = True) -> list[tuple[str, Callable[[], None]]]:
        """The warm-up as labelled steps in one fixed order, one graph each (``app.compile_plan.run_plan`` runs them
        through the compile cache): each bucket's forward (greedy output, and logits for sampling) over scratch rows
        only and its row-move graph (a scratch row onto itself), then the heads' (``SlotHeads.warm_up_steps``).
        Writes scratch rows only."""
        import mindspore as ms

        outputs = sorted({self.teacher.greedy_output} | ({LOGITS} if sampling else set()))

        def forward(bucket: int, output: str) -> Callable[[], None]:
            def run() -> None:
                rows = (self.scratch + np.arange(bucket, dtype=np.int32))[None, :]
                mask = np.full((1, 1, bucket, self.teacher.max_len), MASK_VALUE, np.float32)
                mask[0, 0, np.arange(bucket), rows[0]] = 0.0
                self.teacher.forward(ForwardInputs(np.zeros((1, bucket), np.int32), np.zeros((1, bucket), np.int32),
                                                   rows, mask, bucket), output)
            return run

        def row_move(bucket: int) -> Callable[[], None]:
            def run() -> None:
                rows = ms.Tensor((self.scratch + np.arange(bucket, dtype=np.int32))[None, :])
                self._commit(rows, rows)
            return run

        steps = []
        for bucket in self.buckets.sizes:
            steps += [(f"teacher {output} t={bucket} w={self.teacher.max_len}", forward(bucket, output))
                      for output in outputs]
            if self.proposer_factory is not None:
                steps.append((f"slot row-move b={bucket}", row_move(bucket)))
        if self.heads is not None:
            steps += self.heads.warm_up_steps()
        return steps

    # ----- requests (any thread) ----------------------------------------------------------------------------
    def submit(self, prompt: Sequence[int], max_new_tokens: int, eos: Sequence[int] = (),
               sampling: SamplingParams = SamplingParams(), max_nodes: int | None = None,
               request_id: str | None = None, proposer: str | None = None) -> Request:
        """Queue a request; typed errors (ConfigError, CacheCapacityError) before anything is queued.
        ``max_nodes``: this request's bound on the nodes a step verifies (1: no speculation; None: the engine's).
        ``proposer``: this request's draft source, "eagle", "suffix" or "hybrid" (None: the engine's); the head's
        sources need an engine built with a head."""
        ids = validate_request(prompt, max_new_tokens, self.teacher.cfg.vocab_size, self.slot_len)
        if not isinstance(sampling, SamplingParams):
            raise ConfigError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        cap = self.max_nodes if self.proposer_factory is not None else 1
        if max_nodes is None:
            max_nodes = cap
        if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
            raise ConfigError(f"max_nodes={max_nodes!r}: must be an integer >= 1")
        if proposer is not None:
            if proposer not in PROPOSERS:
                raise ConfigError(f"proposer={proposer!r}: must be one of {PROPOSERS}")
            if self.proposer_factory is None:
                raise ConfigError(f"proposer={proposer!r}: this engine runs without speculation")
            if proposer != "suffix" and self.heads is None:
                raise ConfigError(f"proposer={proposer!r} drafts with the EAGLE-3 head and this engine has none; "
                                  "use 'suffix', or start the engine with a head (--drafting hybrid or eagle)")
        req = Request(request_id or f"req-{next(self._ids)}", ids, int(max_new_tokens),
                      frozenset(int(e) for e in eos), sampling, min(max_nodes, cap), proposer,
                      submitted_s=time.perf_counter())
        with self._lock:
            if len(self._waiting) >= self.max_queued:
                raise QueueFullError(f"{len(self._waiting)} requests are already waiting (max_queued="
                                     f"{self.max_queued}); retry later")
            self._waiting.append(req)
        return req

    def cancel(self, request_id: str) -> None:
        """Finish a request as "cancelled" at the next step boundary (its slot is then free). Unknown or finished
        ids are ignored (a client may disconnect after its request ended)."""
        with self._lock:
            self._cancel.add(request_id)

    @property
    def num_waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def has_work(self) -> bool:
        with self._lock:
            return bool(self.running or self._waiting or self._cancel)

    # ----- one step (one thread) ----------------------------------------------------------------------------
    def step(self) -> list[Event]:
        """Admit, cancel, run one forward over every running request, commit; return what each produced."""
        events: list[Event] = []
        with self._lock:
            cancel, self._cancel = self._cancel, set()
            if cancel:
                kept = deque()
                for req in self._waiting:
                    if req.id in cancel:
                        events.append(self._finish(req, "cancelled"))
                    else:
                        kept.append(req)
                self._waiting = kept
            for req in list(self.running):
                if req.id in cancel:
                    events.append(self._finish(req, "cancelled"))
            while self.free_slots and self._waiting:
                req = self._waiting.popleft()
                req.slot = self.free_slots.pop(0)
                req.noise = PositionNoise(req.sampling.seed)
                if self.proposer_factory is not None and req.max_nodes > 1:
                    req.proposer = self.proposer_factory(req.slot, req.source)
                self.running.append(req)
        if self.running:
            events += self._forward_step()
        return events

    def _finish(self, req: Request, reason: str) -> Event:
        req.finish_reason = reason
        req.finished_s = time.perf_counter()
        if req in self.running:
            self.running.remove(req)
        if req.slot is not None:
            self.free_slots.append(req.slot)
            self.free_slots.sort()
            req.slot = None
        req.proposer = None
        req._aux = []
        return Event(req, (), reason)

    def _plan(self) -> tuple[list[tuple[Request, TreeLayout, int]], int, float]:
        """Every running request's rows this step: (request, layout, kind), kind 0 = prefill chunk, 1 = tree;
        the bucket; and the milliseconds the heads' catch-up and growth took. A root per decoding request first,
        then prefill chunks, then drafts: a fixed-budget proposer's tree while it fits, the adaptive proposers'
        candidates by the global budget (``plan_rows``)."""
        decoding = [r for r in self.running if not r.prefilling]
        chunks, budget = [], min(self.prefill_rows, self.largest - len(decoding))
        for req in (r for r in self.running if r.prefilling):
            if budget <= 0:
                break
            size = min(len(req.prompt) - req.written, budget)
            chunks.append((req, TreeLayout.chain(req.prompt[req.written:req.written + size]), 0))
            budget -= size
        fixed = len(decoding) + sum(layout.num_nodes for _, layout, _ in chunks)
        caps = [min(req.max_nodes, self.slot_len - req.written) for req in decoding]  # bound, and rows left
        adaptive = [cap > 1 and req.proposer is not None and hasattr(req.proposer, "wants_growth")
                    and getattr(req.proposer, "budget", "") == "adaptive" for req, cap in zip(decoding, caps)]
        asleep = [False] * len(decoding)
        wanting = []
        for i, (req, a) in enumerate(zip(decoding, adaptive)):
            t = time.perf_counter()
            asleep[i] = a and req.proposer.asleep(req.root)
            if a and not asleep[i] and req.proposer.wants_growth(req.root):
                wanting.append(i)
            req._draft_ms, req._awake = (time.perf_counter() - t) * 1000, a and not asleep[i]
        adaptive = [a and not s for a, s in zip(adaptive, asleep)]
        kept = set(self._plan_growth(decoding, adaptive, caps, wanting, fixed))
        for i in wanting:
            if i not in kept:
                decoding[i].proposer.skip_growth()
        growing = [decoding[i] for i in sorted(kept)]
        t0 = time.perf_counter()
        candidates, caught_up = self._grow(growing)
        grown = dict(zip((r.id for r in growing), candidates))
        grow_ms = (time.perf_counter() - t0) * 1000
        if growing:
            self.growth_costs.observe(len(growing), grow_ms)
        shared = (grow_ms - sum(caught_up)) / max(len(growing), 1)
        for req, own in zip(growing, caught_up):  # for its gain guard: its own catch-up, its share of the growth
            req._draft_ms += own + shared
        drafted: list[object] = []  # per decoding request: None (root only), a TreeLayout, or candidates
        ranked: list[np.ndarray] = []
        for req, cap, a, s in zip(decoding, caps, adaptive, asleep):
            prop, c, p = req.proposer, None, np.zeros(0)
            t = time.perf_counter()
            if cap > 1 and prop is not None and not s:
                c = prop.draft_from(req.root, grown.get(req.id)) if a else prop.propose(req.root)
                req.stats.head_growths += req.id in grown
                if isinstance(c, TreeLayout):
                    if c.num_nodes > cap or fixed + c.num_nodes - 1 > self.largest:
                        c = None  # no room this step: plain decoding (the proposer sees a root-only acceptance)
                    else:
                        fixed += c.num_nodes - 1
                else:
                    p = prop.scaled_probs(c)[:cap - 1]
            req._draft_ms += (time.perf_counter() - t) * 1000
            drafted.append(c)
            ranked.append(p)
        counts, _ = plan_rows(ranked, fixed, self.costs.costs())
        plan = []
        for req, c, n in zip(decoding, drafted, counts):
            if c is None:
                layout = TreeLayout.single(req.root)
            elif isinstance(c, TreeLayout):
                layout = c
            else:
                layout = req.proposer.finish(c, 1 + n)
            plan.append((req, layout, 1))
        plan += chunks
        return plan, self.buckets.fit(sum(layout.num_nodes for _, layout, _ in plan)), grow_ms

    def _plan_growth(self, decoding: list[Request], adaptive: list[bool], caps: list[int], wanting: list[int],
                     fixed: int) -> list[int]:
        """Which wanting requests grow (``plan_growth``); all of them while the head's profile has no evidence yet
        (its proposers' own rule grows then, to learn what the head is worth)."""
        if not wanting or any(not decoding[i].proposer.profile.ready for i in wanting):
            return wanting
        suffix, head = [], []
        for req, a, cap in zip(decoding, adaptive, caps):
            s, h = req.proposer.growth_estimate() if a else (np.zeros(0), np.zeros(0))
            suffix.append(s[:cap - 1])
            head.append(h[:cap - 1])
        table = dict(self.growth_costs.costs().bucket_ms)
        return plan_growth(suffix, head, wanting, fixed, self.costs.costs(), table.__getitem__)

    def _grow(self, growing: list[Request]) -> tuple[list, list[float]]:
        """The head candidates of every request whose proposer grows this step: each head's context catches up
        with its committed tokens, then one batched growth (``SlotHeads.grow``), or one growth each without
        ``heads``; and each request's catch-up in ms. Why timed apart: a request's first catch-up writes its whole
        prompt (~20 ms for 150 tokens on a 2-vCPU Zen 4, a few steps' worth), which its own gain guard should
        weigh rather than share with the requests growing beside it."""
        caught_up = []
        for req in growing:
            t = time.perf_counter()
            req.proposer.catch_up()
            caught_up.append((time.perf_counter() - t) * 1000)
        drafts = [req.proposer.eagle for req in growing]
        if self.heads is not None:
            return self.heads.grow(drafts), caught_up
        return [d.candidates() for d in drafts], caught_up

    def _forward_step(self) -> list[Event]:
        t0 = time.perf_counter()
        plan, bucket, grow_ms = self._plan()
        vocab = self.teacher.cfg.vocab_size
        width = self.teacher.max_len
        ids = np.zeros((1, bucket), np.int32)
        positions = np.zeros((1, bucket), np.int32)
        rows = np.zeros((1, bucket), np.int32)
        mask = np.full((1, 1, bucket, width), MASK_VALUE, np.float32)
        off = 0
        spans = []
        logit_rows = []  # what is read: every tree row, and a prompt's last row
        for req, layout, kind in plan:
            if kind == 1:
                check_tree(layout, vocab)
                if int(layout.tokens[0]) != req.root:
                    raise ConfigError(f"request {req.id}: tree root {int(layout.tokens[0])} is not its last token")
            n, base, L = layout.num_nodes, req.slot * self.slot_len, req.written
            if L + n > self.slot_len:
                raise CacheCapacityError(f"request {req.id}: {n} rows at {L} exceed its slot of {self.slot_len}")
            ids[0, off:off + n] = layout.tokens
            positions[0, off:off + n] = layout.positions(L)
            rows[0, off:off + n] = base + L + np.arange(n)
            block = mask[0, 0, off:off + n]
            block[:, base:base + L] = 0.0
            block[:, base + L:base + L + n] = np.where(tree_visibility(layout), 0.0, MASK_VALUE)
            spans.append((off, n))
            if kind == 1:
                logit_rows.extend(range(off, off + n))
            elif req.written + n == len(req.prompt):
                logit_rows.append(off + n - 1)
            off += n
        for j in range(off, bucket):  # padding: a scratch row each, seeing only itself
            rows[0, j] = self.scratch + j
            mask[0, 0, j, self.scratch + j] = 0.0
        sampling = any(not req.sampling.greedy for req, _, _ in plan)
        output = LOGITS if sampling else self.teacher.greedy_output
        out = self.teacher.forward(ForwardInputs(ids, positions, rows, mask, off), output, logit_rows)
        greedy_ids = out.argmax[0] if out.argmax is not None else None
        events, src, dst = [], [], []
        prices = self._row_prices(plan, bucket)
        for (req, layout, kind), (o, n) in zip(plan, spans):
            if kind == 0:
                events += self._after_prefill(req, layout, out, o, n, greedy_ids)
                continue
            if req.sampling.greedy:
                g = greedy_ids[o:o + n] if greedy_ids is not None else np.argmax(out.logits[0, o:o + n], -1)
                acc = accept_greedy(layout, g)
            else:
                acc = accept_sampling(layout, out.logits[0, o:o + n], req.sampling, req.noise, req.written + 1)
            s, d = path_moves(np.asarray(acc.path, np.int64), req.slot * self.slot_len + req.written)
            src.append(s)
            dst.append(d)
            req.written += len(acc.path)
            req.stats.steps += 1
            req.stats.drafted += layout.num_nodes - 1
            req.stats.draft_steps += layout.num_nodes > 1
            req.stats.accepted += acc.num_accepted
            if req.proposer is not None:
                t = time.perf_counter()
                req.proposer.accept(acc, out.aux_hidden[0, [o + i for i in acc.path]])
                req._draft_ms += (time.perf_counter() - t) * 1000
                self._weigh_gain(req, layout, acc.num_accepted, prices)
            events.append(self._emit(req, list(acc.tokens)))
        moves = sum(s.size for s in src)
        if moves:
            s, d = pad_moves([np.concatenate(src)], [np.concatenate(dst)], self.buckets.fit(moves))
            import mindspore as ms

            self._commit(ms.Tensor(s), ms.Tensor(d))
        # the step's cost by its bucket, without the heads' growth: that is a per-request drafting cost, not the
        # rows' (it would otherwise make whichever bucket ran beside a growth look dearer)
        self.costs.observe(bucket, (time.perf_counter() - t0) * 1000 - grow_ms)
        self.steps += 1
        return [e for e in events if e.tokens or e.finish_reason]

    def _row_prices(self, plan, bucket: int) -> tuple[float, float]:
        """What the gain guards weigh this step with (``_weigh_gain``): a plain row's ms (the cost of the step's
        rows without drafts, over their count) and a draft row's (what the drafts added to the forward, over their
        count; 0 when they only filled the bucket's padding)."""
        table = dict(self.costs.costs().bucket_ms)
        fixed = sum(1 if kind == 1 else lay.num_nodes for _, lay, kind in plan)
        drafts = sum(lay.num_nodes - 1 for _, lay, kind in plan if kind == 1)
        base = table[self.buckets.fit(fixed)]
        return base / fixed, (table[bucket] - base) / drafts if drafts else 0.0

    def _weigh_gain(self, req: Request, layout: TreeLayout, accepted: int, prices: tuple[float, float]) -> None:
        """Feed ``req``'s gain guard (``budget.GainGuard``) what its drafting saved this step, in milliseconds of
        the batch's throughput: each accepted draft is a token the batch emitted without a step, worth a plain row
        (``prices``); against it, its draft rows and its drafting time (``Request._draft_ms``: its proposer's host
        time, its own catch-up and its share of the heads' growth). Why here: the proposer cannot time its share of a
        batched forward. Asleep and fixed-budget steps weigh nothing."""
        guard = getattr(req.proposer, "guard", None)
        if guard is None or not req._awake:
            return
        plain, row = prices
        guard.observe(accepted, plain + (layout.num_nodes - 1) * row + req._draft_ms, plain)

    def _after_prefill(self, req: Request, layout: TreeLayout, out, o: int, n: int, greedy_ids) -> list[Event]:
        req.written += n
        if req.proposer is not None:
            req._aux.append(np.asarray(out.aux_hidden[0, o:o + n]))
        if req.written < len(req.prompt):
            return []
        last = o + n - 1
        if req.sampling.greedy:
            root = int(greedy_ids[last]) if greedy_ids is not None else int(np.argmax(out.logits[0, last]))
        else:
            root = sample_token(out.logits[0, last], req.sampling, req.noise, len(req.prompt))
        req.first_token_s = time.perf_counter()
        if req.proposer is not None:
            req.proposer.begin(req.prompt, np.concatenate(req._aux, 0), root)
            req._aux = []
        return [self._emit(req, [root])]

    def _emit(self, req: Request, new: list[int]) -> Event:
        """Append ``new`` (stopping at EOS or the token limit); finish the request when it stops."""
        out = []
        reason = None
        for tok in new:
            req.tokens.append(tok)
            out.append(tok)
            if tok in req.eos:
                reason = "eos"
                break
            if len(req.tokens) >= req.max_new_tokens:
                reason = "max_new_tokens"
                break
        req.root = req.tokens[-1]
        if reason is None and req.written + 1 > self.slot_len:
            reason = "cache_full"
        if reason is not None:
            self._finish(req, reason)
        return Event(req, tuple(out), reason)


class QueueFullError(ConfigError):
    """The engine's queue is full (the server answers 429)."""


__all__ = ["BatchEngine", "Event", "FINISH_REASONS", "QueueFullError", "Request", "RequestStats", "plan_growth",
           "plan_rows"]
