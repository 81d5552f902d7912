"""How many nodes a step verifies: a fixed budget, or the adaptive rule that maximises expected tokens per ms.

On this CPU a verification costs rows almost linearly beyond the first few (``VerifyCosts``: a 16-row bucket
costs about 1.8 decode steps, an 8-row one 1.25), so verifying 16 rows when nothing is likely to be accepted is
a loss, and a long confident suffix match deserves a deep chain. The adaptive rule (``plan_budget``) uses the
candidates' acceptance probabilities ``p`` (``draft.merge``: ``1 + sum(p)`` over a tree estimates the tokens it
emits):

    for every verification bucket b:   n_b = min(b, candidates + 1)
                                       E(b) = 1 + (sum of the n_b - 1 largest p)     # expected tokens emitted
                                       rate(b) = E(b) / (c(b) + draft_ms)            # expected tokens per ms
    choose the b with the largest rate (ties to the smaller bucket); verify its n_b most probable nodes.

The best tree with n nodes is the n - 1 most probable candidates (p never increases along a path, so that set
is ancestor-closed), hence E(b) is exact under the estimate, and the depth follows from the selection: a long
confident chain fills a bucket with one deep path, weak candidates lose to the one-row bucket (plain decoding).

Skipping EAGLE growth (``should_grow``). Growth costs ``grow_ms`` (about 6-12 ms of a 25-40 ms cycle with the
fused CPU kernels) before its candidates are known, so the decision uses an estimate of what it would add: the
head's typical candidate probabilities (a running mean of its sorted ``p`` vectors, ``EagleProfile``), discounted
by the chance that the suffix branch's best first token is wrong (``1 - q1``: when that token is accepted, the head's other
depth-1 branches are not). Grow iff the best rate with suffix candidates plus the discounted profile, at cost
``c(b) + grow_ms``, beats the best rate of the suffix candidates alone. The profile needs evidence: the head
grows at its first ``warmup`` opportunities, and the proposer grows at least every ``explore_every`` steps
(``HybridProposer``) so that a profile learnt on a few unlucky steps cannot switch the head off for good.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..runtime import smallest_holding
from ..errors import ConfigError

DEFAULT_BUCKET_MS = ((1, 18.6), (8, 23.4), (16, 33.6), (32, 54.5), (64, 94.9))
"""Verification ms per bucket of the default teacher (SmolLM2-135M, fp32, the fused CPU kernels, 2-core CPU, context
512): ``bench/bench_cycle.py`` (``results/kernels/bench_cycle.json``). Only the prior: ``CostTracker`` follows the
costs the proposer observes (a bucket it has not used yet scales its prior like the used ones). Pass measured costs
for any other set-up."""

DEFAULT_GROW_MS = 8.0
"""One growth of the shipped head at depth 2 (6.5 ms in ``results/kernels/bench_cycle.json``) plus one step's share
of its context catch-up (~1.5 ms)."""


@dataclass(frozen=True)
class VerifyCosts:
    """Measured milliseconds of a step's parts: ``bucket_ms`` the verification forward per bucket
    (ascending buckets, 1 = plain decoding, among them), ``grow_ms`` one EAGLE growth including the head's
    catch-up on the committed tokens, ``suffix_ms`` one suffix proposal."""

    bucket_ms: tuple[tuple[int, float], ...] = DEFAULT_BUCKET_MS
    grow_ms: float = DEFAULT_GROW_MS
    suffix_ms: float = 0.1

    def __post_init__(self) -> None:
        pairs = tuple((int(b), float(ms)) for b, ms in self.bucket_ms)
        buckets = [b for b, _ in pairs]
        if not pairs or buckets != sorted(set(buckets)) or buckets[0] < 1:
            raise ConfigError(f"VerifyCosts.bucket_ms={self.bucket_ms}: need strictly increasing positive buckets")
        if not all(ms > 0 for _, ms in pairs):
            raise ConfigError(f"VerifyCosts.bucket_ms={self.bucket_ms}: every cost must be > 0 ms")
        if not (self.grow_ms >= 0 and self.suffix_ms >= 0):
            raise ConfigError(f"VerifyCosts: grow_ms={self.grow_ms}, suffix_ms={self.suffix_ms} must be >= 0")
        object.__setattr__(self, "bucket_ms", pairs)

    @classmethod
    def from_mapping(cls, bucket_ms: Mapping[int, float], grow_ms: float = DEFAULT_GROW_MS,
                     suffix_ms: float = 0.1) -> "VerifyCosts":
        return cls(tuple(sorted((int(b), float(v)) for b, v in bucket_ms.items())), grow_ms, suffix_ms)

    def restricted(self, buckets: Sequence[int]) -> "VerifyCosts":
        """The costs of the buckets a teacher actually has (ConfigError if one has no measured cost)."""
        known = dict(self.bucket_ms)
        missing = [b for b in buckets if b not in known]
        if missing:
            raise ConfigError(f"VerifyCosts: no cost for buckets {missing} (have {sorted(known)})")
        return VerifyCosts(tuple((b, known[b]) for b in sorted(set(buckets))), self.grow_ms, self.suffix_ms)


    def covering(self, buckets: Sequence[int]) -> "VerifyCosts":
        """The costs of ``buckets``, a bucket without a measured cost priced by linear interpolation between its
        measured neighbours (beyond the largest: that cost scaled by the row ratio). A prior only: the batch
        engine's ``CostTracker`` replaces it with what it measures. Example, {1: 20, 8: 48}: bucket 4 -> 32 ms."""
        known = dict(self.bucket_ms)
        xs = np.array(sorted(known), np.float64)
        ys = np.array([known[int(x)] for x in xs], np.float64)
        out = []
        for b in sorted(set(int(b) for b in buckets)):
            if b in known:
                out.append((b, known[b]))
            elif b > xs[-1]:
                out.append((b, float(ys[-1] * b / xs[-1])))
            else:
                out.append((b, float(np.interp(b, xs, ys))))
        return VerifyCosts(tuple(out), self.grow_ms, self.suffix_ms)


@dataclass(frozen=True)
class BudgetPlan:
    """The adaptive rule's choice for one step."""

    num_nodes: int  # nodes to verify, root included
    bucket: int
    expected_tokens: float  # E(bucket)
    rate: float  # expected tokens per ms


def plan_budget(sorted_probs: np.ndarray, costs: VerifyCosts, draft_ms: float) -> BudgetPlan:
    """The rate-maximising bucket for candidates whose non-root probabilities, largest first, are
    ``sorted_probs``; ``draft_ms`` is the drafting cost already paid or committed to this step.

    Example, costs {1: 70, 8: 125, 16: 126}, draft 0, p = [0.9, 0.8, 0.7]: E = 1 / 3.4 / 3.4, rates 0.0143 /
    0.0272 / 0.0270 -> bucket 8 with 4 nodes."""
    # cum[k] = E with the k best candidates, summed in order as np.cumsum would; Python floats, because this runs
    # several times per request and step on a handful of numbers, where numpy's call overhead dominates
    p = np.asarray(sorted_probs, np.float64).reshape(-1)[:costs.bucket_ms[-1][0] - 1].tolist()
    cum, total = [1.0], 0.0
    for x in p:
        total += x
        cum.append(1.0 + total)
    best = None
    for bucket, ms in costs.bucket_ms:
        n = min(bucket, len(p) + 1)
        e = cum[n - 1]
        rate = e / (ms + draft_ms)
        if best is None or rate > best.rate + 1e-12:
            best = BudgetPlan(n, bucket, e, rate)
    return best


class AcceptanceRatio:
    """How the candidates' estimated acceptance compares with what the teacher accepts: ``factor`` = (accepted
    draft tokens + prior) / (estimated draft tokens + prior) over recent steps (sums decayed by ``decay`` per
    step), which ``scale`` applies to the ``p`` the rule plans with (capped at 1).

    Why: the estimates (the suffix table, the head's softmax) are fitted on other text and another machine's
    regime; where they promise more than the teacher accepts, the rule verifies trees that cost more than they
    emit and speculation runs slower than plain decoding (measured on an AVX2 CPU, where a verified row is dear:
    5 of 12 prompts at 0.83-0.97x of greedy). Scaling by the observed ratio sends such requests back to plain
    decoding after a few steps, and leaves calibrated estimates (factor ~1) alone. Only which nodes are verified
    changes, never what is accepted: lossless either way.

    Example, decay 1, prior 2: estimates summing to 6 of which 1 token was accepted give (1 + 2) / (6 + 2) =
    0.375, so p = 0.8 plans as 0.3."""

    def __init__(self, decay: float = 0.95, prior: float = 2.0):
        if not 0 < decay <= 1:
            raise ConfigError(f"AcceptanceRatio.decay={decay}: must be in (0, 1]")
        if not prior > 0:
            raise ConfigError(f"AcceptanceRatio.prior={prior}: must be > 0")
        self.decay, self.prior = decay, prior
        self.accepted = 0.0
        self.estimated = 0.0

    @property
    def factor(self) -> float:
        return (self.accepted + self.prior) / (self.estimated + self.prior)

    def observe(self, estimated: float, accepted: int) -> None:
        """One verified step: ``estimated`` = the sum of its draft nodes' p, ``accepted`` = draft tokens accepted.
        A step that verified no draft (0, 0) only decays the sums, so a factor that sent the rule to plain
        decoding drifts back towards 1 and the rule tries drafts again (it learns nothing while it drafts
        nothing)."""
        self.accepted = self.decay * self.accepted + float(accepted)
        self.estimated = self.decay * self.estimated + float(estimated)

    def scale(self, sorted_probs: np.ndarray) -> np.ndarray:
        return np.minimum(np.asarray(sorted_probs, np.float64) * self.factor, 1.0)


class EagleProfile:
    """Running mean of the head's sorted candidate probabilities (the prior of ``should_grow``).

    ``update(p)`` after each growth with the candidates' non-root ``p`` (largest first): the plain mean of the
    first ``1 / alpha`` updates, then an exponential average with weight ``alpha``. ``ready`` once ``warmup``
    updates have been seen."""

    def __init__(self, alpha: float = 0.1, warmup: int = 8):
        if not 0 < alpha <= 1:
            raise ConfigError(f"EagleProfile.alpha={alpha}: must be in (0, 1]")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ConfigError(f"EagleProfile.warmup={warmup!r}: must be an integer >= 1")
        self.alpha, self.warmup = alpha, warmup
        self.mean: np.ndarray | None = None
        self.updates = 0

    @property
    def ready(self) -> bool:
        return self.updates >= self.warmup

    def update(self, sorted_probs: np.ndarray) -> None:
        p = np.asarray(sorted_probs, np.float64).reshape(-1)
        if self.mean is None or self.mean.shape != p.shape:
            self.mean, self.updates = p.copy(), 0
        else:
            self.mean += max(self.alpha, 1.0 / (self.updates + 1)) * (p - self.mean)
        self.updates += 1


def head_estimate(q1: float, profile: EagleProfile, factor: float = 1.0) -> np.ndarray:
    """What a growth is expected to add: the head's typical candidate p (``profile.mean``, largest first) discounted
    by the chance ``1 - q1`` that the suffix branch's best first token is wrong, scaled by the acceptance ratio
    ``factor``, capped at 1; empty before the profile has seen a growth."""
    if profile.mean is None:
        return np.zeros(0)
    return np.minimum((1.0 - q1) * profile.mean * factor, 1.0)


def should_grow(suffix_sorted: np.ndarray, q1: float, profile: EagleProfile, costs: VerifyCosts,
                factor: float = 1.0) -> bool:
    """Whether an EAGLE growth is expected to pay this step (rule in the module docstring). ``suffix_sorted``:
    the suffix candidates' non-root p, largest first (already scaled by ``AcceptanceRatio``); ``q1``: the largest
    p among the suffix's depth-1 nodes (0 without a match); ``factor``: the acceptance ratio, applied to the
    head's profile too. Grows until the profile is ``ready``."""
    if not profile.ready:
        return True
    without = plan_budget(suffix_sorted, costs, costs.suffix_ms)
    estimate = np.sort(np.concatenate([np.asarray(suffix_sorted, np.float64), head_estimate(q1, profile, factor)]))[::-1]
    with_growth = plan_budget(estimate, costs, costs.suffix_ms + costs.grow_ms)
    return with_growth.rate > without.rate


class GainGuard:
    """Whether looking for drafts pays this request at all: the realised gain of the speculative steps over plain
    decoding, and a dormant spell (no lookup, no growth, no tree: plain steps at greedy's cost) when it is negative.

    Why: the adaptive rule weighs each tree against a plain step, but the speculative path pays work on every step
    whatever it decides (the suffix lookup, the bookkeeping of ``accept``, the head's growths and their catch-ups),
    and the candidates' estimates may promise more than the teacher accepts. Where nothing is accepted those costs
    make a request slower than greedy (``make demo``'s prompt on an AVX-512 Xeon with native weights: 101-108 vs
    116 decode tok/s at tau 1.05, 30 two-row trees of which 4 accepted a token). No estimate sees that; a measured
    gain does. Only which steps look for drafts changes, never what is accepted: lossless either way.

    The rule, per request. Each verified step of an awake spell adds ``(accepted + 1) * plain_ms - step_ms`` (the
    milliseconds it saved against plain decoding; ``plain_ms`` a plain step's cost, ``step_ms`` the whole step's,
    drafting included) to a sum decayed by ``decay`` per step. After ``probe`` steps of a spell, a negative sum sends
    the request to sleep for ``sleep`` plain steps; it wakes with an empty sum and probes again. Each spell that ends
    asleep doubles the next sleep up to ``max_sleep``; a spell that was ever in profit (sum > 0 after its probe)
    resets it to ``min_sleep``. So a request where drafting never pays looks on about ``probe / (probe + max_sleep)``
    of its steps, and one where it pays never sleeps while it pays.

    Example, probe 2, decay 1, plain 10 ms: steps of 11 ms with nothing accepted (-1, -1) -> asleep for ``min_sleep``
    steps; one of 14 ms accepting 1 (+6) keeps it awake."""

    def __init__(self, probe: int = 8, decay: float = 0.9, min_sleep: int = 8, max_sleep: int = 64):
        for name, v in (("probe", probe), ("min_sleep", min_sleep), ("max_sleep", max_sleep)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"GainGuard.{name}={v!r}: must be an integer >= 1")
        if max_sleep < min_sleep:
            raise ConfigError(f"GainGuard.max_sleep={max_sleep} < min_sleep={min_sleep}")
        if not 0 < decay <= 1:
            raise ConfigError(f"GainGuard.decay={decay}: must be in (0, 1]")
        self.probe, self.decay, self.min_sleep, self.max_sleep = probe, float(decay), min_sleep, max_sleep
        self.reset()

    def reset(self) -> None:
        """A new request: awake, nothing learnt (what pays depends on the conversation)."""
        self.asleep = 0  # plain steps left in the current sleep
        self.next_sleep = self.min_sleep
        self.slept_steps = 0  # plain steps taken asleep in this request
        self._new_spell()

    def _new_spell(self) -> None:
        self.gain_ms = 0.0  # decayed sum of the awake steps' saved ms
        self.awake_steps = 0
        self._paid = False  # the spell was in profit after its probe

    @property
    def dormant(self) -> bool:
        return self.asleep > 0

    def wake(self) -> None:
        """End the sleep now (the caller sees drafts worth a look), with an empty sum and the sleep length kept."""
        if self.asleep > 0:
            self.asleep = 0
            self._new_spell()

    def sleep_step(self) -> None:
        """One plain step taken asleep; the last one wakes the request with an empty sum."""
        if self.asleep > 0:
            self.asleep -= 1
            self.slept_steps += 1
            if self.asleep == 0:
                self._new_spell()

    def observe(self, accepted: int, step_ms: float, plain_ms: float) -> None:
        """One verified awake step: ``accepted`` draft tokens, ``step_ms`` its whole cost, ``plain_ms`` a plain
        step's cost (the verification of one row)."""
        self.gain_ms = self.decay * self.gain_ms + (accepted + 1) * plain_ms - step_ms
        self.awake_steps += 1
        if self.awake_steps < self.probe:
            return
        if self.gain_ms > 0:
            self._paid = True
            return
        if self._paid:
            self.next_sleep = self.min_sleep
        self.asleep = self.next_sleep
        self.next_sleep = min(2 * self.next_sleep, self.max_sleep)


MIN_SAMPLE_MS = 1e-3
"""The shortest step cost ``CostTracker`` learns from: no verification or growth takes under a microsecond."""


class CostTracker:
    """Per-bucket step costs learnt while generating: the median of the last ``window`` observations of each
    bucket (and of growths); a bucket not seen yet, between two seen ones, costs the linear interpolation of their
    costs in rows; below the smallest or above the largest seen bucket, its ``prior`` scaled by how the observed
    buckets compare with theirs (the median ratio: a machine twice as busy is busy for every bucket); then the table
    is made non-decreasing in the bucket, from the top down.

    Why interpolate: the prior's shape is one set-up's (dense fp32 weights, where 8 rows cost 1.26 decode steps);
    with native Q4_1 weights rows are dear (2 / 4 / 8 rows: 1.13 / 1.45 / 2.22 decode steps, Xeon), and the scaled
    prior priced the unseen 2-row bucket above the seen 4-row one, so the rule never chose it and never learnt its
    cost (240 turns: 0 of 20,432 steps in bucket 2). Interpolated between the seen 1 and 4 (or 8) it costs about
    what it measures, and is tried.

    Why the table is made non-decreasing from the top down (a bucket costs at most what the next larger one costs),
    not from the bottom up: a slow sample (a first call, the machine busy) in a bucket the rule then stops choosing
    stays its median, since no new sample comes, and carried upwards it priced every larger bucket as dear and kept
    them unused too. Measured in the single-request engine with native weights on a Zen 4 VM: bucket 8 stuck at a
    95 ms median (it costs ~28 ms) made 16 and 32 cost 95 ms as well, and 686 of 745 steps verified 4-node trees.
    A larger bucket's measured cost bounds the smaller ones instead: slow samples are the noise, fast ones are not.

    A proposer can observe its own steps without help from the engine: the time from the end of ``propose``
    to the start of the next ``accept`` is the engine's checks, mask, verification forward, acceptance and
    commit for a tree of the proposed size, i.e. exactly the cost the adaptive rule trades against tokens.
    Measured costs at start-up drift on a shared machine (two start-up measurements here disagreed by 2x on
    the 16-row bucket); the running medians follow the machine. An observation above ``outlier`` times the
    current estimate is dropped: a graph compiled on first use takes seconds, and one such sample would
    otherwise keep that bucket out of use until ``window`` others arrived, which they never would."""

    def __init__(self, prior: VerifyCosts, window: int = 16, outlier: float = 10.0):
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ConfigError(f"CostTracker.window={window!r}: must be an integer >= 1")
        if not outlier > 1:
            raise ConfigError(f"CostTracker.outlier={outlier!r}: must be > 1")
        self.prior, self.window, self.outlier = prior, window, float(outlier)
        self._prior_ms = dict(prior.bucket_ms)
        self._seen: dict[int, list[float]] = {b: [] for b, _ in prior.bucket_ms}
        self._grow: list[float] = []
        # Medians of the windows, kept as observations arrive, and the table built from them: the proposer asks
        # for the table after every step (np.median over every window each time was ~40% of a root-only step's
        # drafting work on the host).
        self._median: dict[int, float] = {}
        self._grow_median = prior.grow_ms  # the prior until a growth is observed
        self._costs: VerifyCosts | None = None

    def bucket_of(self, num_nodes: int) -> int:
        """The smallest tracked bucket holding ``num_nodes`` (the engine's rule)."""
        return smallest_holding(self._seen, num_nodes, max(self._seen))

    def observe(self, num_nodes: int, ms: float) -> None:
        b = self.bucket_of(num_nodes)
        if self._push(self._seen[b], ms, self._median.get(b, self._prior_ms[b])):
            self._median[b] = _median(self._seen[b])

    def observe_growth(self, ms: float) -> None:
        if self._push(self._grow, ms, self._grow_median):
            self._grow_median = _median(self._grow)

    def _push(self, window: list[float], ms: float, current: float) -> bool:
        """Append ``ms`` to ``window`` (keeping its last ``self.window``) unless it is no sample (under
        ``MIN_SAMPLE_MS``: a clock that did not move; a subnormal sample once made every unseen bucket's scaled prior
        0 ms, a table ``VerifyCosts`` refuses) or an outlier against ``current`` (a compile); True when appended."""
        if not ms >= MIN_SAMPLE_MS or ms > self.outlier * max(current, MIN_SAMPLE_MS):
            return False
        window.append(float(ms))
        del window[:-self.window]
        self._costs = None
        return True

    def costs(self) -> VerifyCosts:
        if self._costs is not None:
            return self._costs
        prior, seen = self._prior_ms, self._median
        buckets = sorted(self._seen)
        scale = _median([seen[b] / prior[b] for b in buckets if b in seen]) if seen else 1.0
        known = [b for b in buckets if b in seen]

        def estimate(b: int) -> float:
            if b in seen:
                return seen[b]
            if known and known[0] < b < known[-1]:
                return float(np.interp(b, known, [seen[k] for k in known]))
            return prior[b] * scale

        ms = list(itertools.accumulate((estimate(b) for b in reversed(buckets)), min))[::-1]
        self._costs = VerifyCosts(tuple(zip(buckets, ms)), self._grow_median, self.prior.suffix_ms)
        return self._costs

    def samples(self, bucket: int) -> int:
        """Observations of ``bucket`` in its window (0: its cost is an estimate)."""
        return len(self._seen[bucket])


def _median(values: Sequence[float]) -> float:
    """numpy's median (the mean of the two middle values of an even count) without numpy's per-call cost."""
    return float(statistics.median(values))


__all__ = ["BudgetPlan", "CostTracker", "DEFAULT_BUCKET_MS", "DEFAULT_GROW_MS", "EagleProfile", "GainGuard",
           "MIN_SAMPLE_MS", "VerifyCosts", "plan_budget", "should_grow"]
