"""``HybridProposer``: the engine's proposer with two draft sources in one tree and a fixed or adaptive budget.

Modes: ``eagle`` (the EAGLE-3 head alone, today's proposer), ``suffix`` (the suffix index alone: no model, no
forward pass), ``hybrid`` (both, merged by ``draft.merge``). Budgets: ``fixed`` (every step verifies
``max_nodes`` nodes, or fewer when the candidates run out) and ``adaptive`` (``draft.budget``: each step picks
its node count, hence its bucket, from the candidates' acceptance probabilities and the step costs; in hybrid
mode it also skips the head's growth when the suffix branch is confident enough). The costs start from
``VerifyCosts`` and follow what this proposer observes (``CostTracker``: the time from ``propose`` to the next
``accept`` is the engine's verification of the proposed tree). Every tree is a deterministic draft verified by
the one tree-masked forward, so each combination is lossless.

The head's context (``Eagle3Proposer``: one entry per committed token, with the teacher's features) must
follow every committed token, whichever source proposed it. ``accept`` therefore queues the accepted tokens
with the teacher's features of their path nodes, exactly what ``Eagle3Proposer.accept`` receives, and the
queue is written into the head before its next growth, in one chunked context forward (``catch_up``). A run
of steps drafted by the suffix alone thus costs the head nothing until it is needed, and its context is the
same as if it had been extended every step. The suffix index follows the same tokens (``SuffixIndex.extend``).

The suffix candidates' acceptance estimates start from the shipped table and follow what the teacher accepts
(``OnlineCalibration``, opt-in: ``DraftingConfig.suffix_calibration`` online): every verified step labels the
suffix candidates whose parent path was committed, so a teacher or a request that copies less (or more) than the
table's stops being over- (or under-) drafted within a few dozen steps. Off by default: with the default teacher,
whose trace the table was fitted on, it lost 2.4% tau on 48 evaluation turns in the engine
(results/suffix-calibration/hybrid-48-*); it is for teachers the table was not fitted on: replayed over the 240
turns with a table whose odds are 4x too high or too low (``experiments/replay_calibration.py``), it wins back all
of the wrong table's lost ms/token (0.99 and 1.02).

One step:

    propose(root):  suffix candidates (index lookup, < 1 ms)
                    grow?  eagle mode: always; hybrid: fixed budget always, adaptive by should_grow
                           (and at least every explore_every steps)
                    if grow: catch_up(); EAGLE candidates (one growth graph)
                    union (shared prefixes once, comparable p) -> budget (fixed n, or plan_budget) -> select
    accept(acc, aux): observe the step cost; label the suffix candidates by the committed tokens (the online
                      calibration); index.extend(acc.tokens); queue (acc.tokens, aux) for the head;
                      the gain guard weighs the whole step against a plain one

Asleep (adaptive budget: ``budget.GainGuard``, fed by the proposer's own clock or by the batch engine): when the
steps' measured gain over plain decoding turns negative, ``propose`` returns the root alone without looking anything
up for a spell of steps (``accept`` still indexes the tokens and queues them for the head), and wakes early when the
index finds a match of ``WAKE_MATCH`` tokens, where copying starts. Replayed over the 240-turn trace (native Q4_1
weights, AVX-512 Xeon; ``experiments/replay_gain_guard.py``), turns below 0.95x of greedy 16 -> 4 and decode time
over all turns 1.66x -> 1.69x of greedy's; without the early wake-up it slept through copied stretches (1.61x).

``log`` holds one ``StepProposal`` per step of the current request (what was proposed, from which source, and
what was accepted), for traces and ablations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import ConfigError, TreeInvariantError
from ..runtime import Buckets, smallest_holding
from ..drafting import CalibrationMode, DraftingConfig
from ..tree.layout import TreeLayout
from .budget import (AcceptanceRatio, CostTracker, EagleProfile, GainGuard, VerifyCosts, head_estimate,
                     plan_budget, should_grow)
from .grow import select_tree
from .merge import (SOURCE_BOTH, SOURCE_EAGLE, SOURCE_ROOT, SOURCE_SUFFIX, CandidateTree, MergedTree,
                    SourcedCandidates, select, union)
from .online_calibration import OnlineCalibration, labelled_nodes
from .calibration import NodeFeatures, SuffixCalibration, default_calibration
from .native_suffix import new_suffix_index
from .suffix import SuffixConfig, suffix_proposal


@dataclass(frozen=True)
class StepProposal:
    """One step of a ``HybridProposer``: the tree it proposed and, once verified, what was accepted."""

    grew: bool  # the EAGLE head grew candidates this step
    nodes: int  # nodes proposed, root included
    bucket: int | None  # the adaptive rule's bucket (None with a fixed budget)
    expected_tokens: float  # 1 + sum of the proposed nodes' p
    suffix_match: int  # longest suffix match length (0: none, or suffix source off)
    source: tuple[int, ...]  # SOURCE_* flags per proposed node
    accepted: tuple[int, ...] = ()  # SOURCE_* flags of the accepted nodes (root excluded)


class HybridProposer:
    """The engine's ``Proposer`` over an optional ``Eagle3Proposer`` and a ``SuffixIndex`` (module docstring).

    Built from the ``DraftingConfig`` itself, which was validated where it was made: its sources (``proposer``),
    budget rule, bound (``max_nodes``: the fixed budget, root included, and the cap of the adaptive one) and
    ``suffix_calibration`` (online: ``calibration`` is the prior of an ``OnlineCalibration`` that every verified
    step corrects with the suffix candidates it labels; like the profile, it persists across requests). The head's
    growth (``depth``, ``top_k``) is the given ``eagle``'s own. Checked here is only what the config cannot know:
    that a head is given when the proposer grows one, and that ``max_nodes`` fits the teacher's ``buckets``.

    What the config does not hold, from the runtime that builds the proposer: ``buckets``, the teacher's
    verification buckets (the adaptive rule considers those up to ``max_nodes``'s bucket); ``costs``, their
    measured ``VerifyCosts`` (default: the default teacher on a 2-core CPU); ``calibration``, the suffix acceptance
    table (default: the shipped one); ``learn_costs`` (adaptive only): ``costs`` is the prior of a ``CostTracker``
    that follows the step costs this proposer observes (``clock`` is its time source; the batch engine turns it
    off: it measures its batched forward itself).

    Two settings no configuration changes, kept because tests isolate a behaviour with them: ``learn_ratio``
    (adaptive only): scale every estimate by what the teacher accepts (``budget.AcceptanceRatio``, across
    requests). ``explore_every`` (adaptive hybrid): grow the head at least every that many steps even when
    ``should_grow`` says no, to keep the profile it relies on current (the profile and that count persist across
    requests: they describe the head, not the conversation); 1 grows it every step (the always-grow ablation of
    ``scripts/replay_suffix.py``). 128 rather than 32: over the 240 turns with native Q4_1 weights on an AVX-512
    Xeon, a forced growth the rule would have skipped cost more than the fresher profile won (speedup 1.600 ->
    1.649, results/eval-avx512-native-explore128). ``gain_guard`` (adaptive only): sleep while drafting does not pay
    (module docstring); the proposer weighs its own steps with ``learn_costs``, the batch engine otherwise."""

    def __init__(self, drafting: DraftingConfig, eagle=None, *, buckets: Buckets | Sequence[int],
                 costs: VerifyCosts | None = None, calibration: SuffixCalibration | None = None,
                 learn_costs: bool = True, learn_ratio: bool = True, explore_every: int = 128,
                 gain_guard: bool = True, clock: Callable[[], float] = time.perf_counter):
        if not isinstance(drafting, DraftingConfig):
            raise ConfigError(f"HybridProposer: expected a DraftingConfig, got {drafting!r}")
        if drafting.oracle:
            raise ConfigError(f"HybridProposer: head={drafting.head!r} is an oracle, which replaces the proposer "
                              "(build.oracle_factory)")
        mode, budget, max_nodes = drafting.proposer.value, drafting.budget.value, drafting.max_nodes
        if mode != "suffix" and eagle is None:
            raise ConfigError(f"HybridProposer proposer={mode!r} needs an Eagle3Proposer (eagle=...); "
                              "proposer 'suffix' needs none")
        buckets = (buckets if isinstance(buckets, Buckets) else Buckets(tuple(buckets))).sizes
        if max_nodes > buckets[-1]:
            raise ConfigError(f"HybridProposer max_nodes={max_nodes}: exceeds the largest verification bucket "
                              f"{buckets[-1]} of {buckets}")
        if isinstance(explore_every, bool) or not isinstance(explore_every, int) or explore_every < 1:
            raise ConfigError(f"HybridProposer explore_every={explore_every!r}: must be an integer >= 1")
        self.explore_every = explore_every
        self._since_growth = 0
        self.mode, self.budget = mode, budget
        self.eagle = eagle if mode != "suffix" else None
        self.max_nodes = max_nodes
        self.suffix_cfg = SuffixConfig()  # the suffix index's settings: no configuration varies them
        calibration = calibration if calibration is not None else default_calibration()
        learn_acceptance = drafting.suffix_calibration is CalibrationMode.ONLINE  # never with proposer 'eagle'
        self.learner = (OnlineCalibration(calibration) if learn_acceptance
                        and isinstance(calibration, SuffixCalibration) else None)
        self.calibration = self.learner if self.learner is not None else calibration
        self._suffix = None  # (CandidateTree, NodeFeatures) of the last proposal's suffix candidates
        # measured costs must cover every bucket; the prior (DEFAULT_BUCKET_MS) prices the ones it lacks by
        # interpolation, and the CostTracker replaces it with what this machine measures
        costs = costs.restricted(buckets) if costs is not None else VerifyCosts().covering(buckets)
        cap = smallest_holding([b for b, _ in costs.bucket_ms], max_nodes, costs.bucket_ms[-1][0])
        self.costs = VerifyCosts(tuple((b, ms) for b, ms in costs.bucket_ms if b <= cap), costs.grow_ms,
                                 costs.suffix_ms)
        self.tracker = CostTracker(self.costs) if learn_costs and budget == "adaptive" else None
        # the adaptive rule's estimates corrected by what the teacher accepts (persists across requests)
        self.ratio = AcceptanceRatio() if budget == "adaptive" and learn_ratio else None
        # per request: whether looking for drafts pays at all; with learn_costs it weighs its own steps, else the
        # batch engine weighs them (it knows what a row of the batched forward costs)
        self.guard = GainGuard() if gain_guard and budget == "adaptive" else None
        self._step_started: float | None = None  # propose's start of an awake step the guard will weigh
        self._since_baseline = 0  # proposals since the smallest bucket's cost was last observed (learn_costs)
        self._catch_up_excess_ms = 0.0  # the catch-up beyond this step's share (tracker's accounting)
        self._clock = clock
        self._proposed_at: float | None = None
        self.index = new_suffix_index(self.suffix_cfg.max_match)
        self.profile = EagleProfile()
        self.log: list[StepProposal] = []
        self._pending_tokens: list[int] = []
        self._pending_feats: list[np.ndarray] = []
        self._last: MergedTree | None = None
        self._grew = False  # the last draft grew the head
        self._steps_covered = 1  # steps whose committed tokens the next catch-up writes (growth cost accounting)
        self.draft_ms = 0.0  # the last draft's cost (the adaptive rule's draft_ms)

    # ----- the engine's Proposer protocol -----------------------------------------------------------------
    def begin(self, prompt: Sequence[int], aux_hidden: np.ndarray, first_token: int) -> None:
        """A new request: index the prompt and the first root; queue the prompt for the head (``Eagle3Proposer
        .begin``'s entries: token at p + 1 with the features at p)."""
        self.index.reset()
        self.index.extend(list(prompt) + [int(first_token)])
        self.log = []
        self._last = None
        self._suffix = None
        self._proposed_at = None
        self._pending_tokens, self._pending_feats = [], []
        self._step_started = None
        if self.guard is not None:
            self.guard.reset()
        if self.eagle is not None:
            self.eagle.reset()
            self._queue(list(prompt[1:]) + [int(first_token)], aux_hidden)

    def propose(self, root_token: int) -> TreeLayout:
        started = self._clock()
        if self.asleep(root_token):
            return TreeLayout.single(int(root_token))
        if self._baseline_due():
            return self._baseline_step(root_token)
        self._step_started = started if self.guard is not None and self.tracker is not None else None
        self._catch_up_excess_ms = 0.0
        cands = self.draft(root_token)
        if not isinstance(cands, SourcedCandidates):  # eagle + fixed: the head's own tree, already selected
            return cands
        bucket = None
        if self.budget == "fixed":
            n = self.max_nodes
        else:
            plan = plan_budget(self.scaled_probs(cands), self.costs, self.draft_ms)
            n, bucket = min(plan.num_nodes, self.max_nodes), plan.bucket
        return self.finish(cands, n, bucket)

    def _baseline_due(self) -> bool:
        """Whether this step verifies the root alone to measure plain decoding (``BASELINE_SAMPLES``,
        ``BASELINE_EVERY``): only a proposer that learns its own costs, while the smallest bucket has too few
        samples or has not been run for ``BASELINE_EVERY`` of its steps."""
        if self.tracker is None:
            return False
        self._since_baseline += 1
        return (self.tracker.samples(self.costs.bucket_ms[0][0]) < BASELINE_SAMPLES
                or self._since_baseline > BASELINE_EVERY)

    def _baseline_step(self, root_token: int) -> TreeLayout:
        """The root alone, logged and timed as a proposal of one node (``accept`` learns its cost); no lookup, no
        growth, nothing for the gain guard to weigh."""
        self._check_root(root_token)
        self._suffix, self._grew, self._step_started = None, False, None
        self._catch_up_excess_ms = 0.0
        self._since_growth += 1  # its tokens join the next catch-up
        single = select(union(CandidateTree.single(int(root_token)), None), 1)
        return self._record(single, False, self.costs.bucket_ms[0][0], 0)

    def scaled_probs(self, cands: SourcedCandidates) -> np.ndarray:
        """The candidates' non-root acceptance estimates, largest first, as the adaptive rule ranks them (corrected
        by the acceptance ratio when it learns one). The batch engine ranks every request's together."""
        return self._scaled(cands.sorted_probs())

    def finish(self, cands: SourcedCandidates, n: int, bucket: int | None = None) -> TreeLayout:
        """The tree of the ``n`` best candidates (root included, at most ``max_nodes``) of the last ``draft``."""
        n = max(1, min(int(n), self.max_nodes))
        match = self.index.longest_match() if self._suffix is not None else 0
        return self._record(select(cands, n), self._grew, bucket, match)

    def asleep(self, root_token: int) -> bool:
        """Whether this step is an asleep one (``GainGuard``; module docstring): then the root alone is verified,
        nothing looked up or grown, and the step is logged as such; the sleep ends early at a ``WAKE_MATCH``-token
        match. The batch engine asks it for every request before drafting."""
        if self.guard is None or not self.guard.dormant:
            return False
        if self.index.match_at_least(WAKE_MATCH):
            self.guard.wake()
            return False
        self._check_root(root_token)
        self.guard.sleep_step()
        self._suffix, self._last, self._grew, self._step_started = None, None, False, None
        self._since_growth += 1  # its tokens join the next catch-up
        self.log.append(StepProposal(False, 1, 1, 1.0, 0, (SOURCE_ROOT,)))
        return True

    def draft(self, root_token: int):
        """Phase one of ``propose``: the step's candidates (``SourcedCandidates``; ``draft_ms`` their cost), or, for
        the plain EAGLE-3 proposer (eagle mode, fixed budget), its tree (``TreeLayout``) outright."""
        grow = self.wants_growth(root_token)
        grown = None
        if grow:
            t0 = self._clock()
            self.catch_up()
            t1 = self._clock()
            grown = self.eagle.candidates()
            if self.tracker is not None:
                # the cost a growth adds to one step: the growth itself plus one step's share of the catch-up (it
                # writes the tokens of every step since the last growth; charging all of it to this step would
                # make growth look dearer the rarer it is, and rarer still for that)
                self.tracker.observe_growth(((self._clock() - t1) + (t1 - t0) / self._steps_covered) * 1000)
                self._catch_up_excess_ms = (t1 - t0) * (1 - 1 / self._steps_covered) * 1000
        return self.draft_from(root_token, grown)

    def wants_growth(self, root_token: int) -> bool:
        """The first half of ``draft``: look the root up in the suffix index and decide whether the head grows this
        step (eagle mode or a fixed budget: always; adaptive hybrid: ``should_grow``, and at least every
        ``explore_every`` steps). The batch engine calls it for every request, grows the heads that said yes in
        one batched growth (after ``catch_up``), and hands each its candidates through ``draft_from``."""
        self._check_root(root_token)
        self._suffix = (suffix_proposal(self.index, self.suffix_cfg, self.calibration) if self.mode != "eagle"
                        else None)
        suffix = self._suffix[0] if self._suffix is not None else None
        grow = self.eagle is not None and (self.mode == "eagle" or self.budget == "fixed"
                                           or self._since_growth + 1 >= self.explore_every
                                           or should_grow(self._scaled(_sorted(suffix)), _best_child(suffix),
                                                          self.profile, self.costs, self._factor()))
        self._steps_covered = self._since_growth + 1  # steps whose committed tokens the catch-up writes
        self._since_growth = 0 if grow else self._since_growth + 1
        self._grew = grow
        return grow

    def _check_root(self, root_token: int) -> None:
        """TreeInvariantError unless ``root_token`` is the last committed token (every accepted token indexed)."""
        root = int(root_token)
        if self.index.tokens[-1] != root:
            raise TreeInvariantError(f"propose({root}): the committed sequence ends with {self.index.tokens[-1]}; "
                                     "call accept() with every committed token first")

    def growth_estimate(self) -> tuple[np.ndarray, np.ndarray]:
        """After ``wants_growth``: the suffix candidates' p as the rule ranks them (largest first) and what a growth
        of the head is expected to add (``budget.head_estimate``: empty before the profile has seen a growth). The
        batch engine weighs every growing request's growth against the cost of the batched growth with these."""
        suffix = self._suffix[0] if self._suffix is not None else None
        return self._scaled(_sorted(suffix)), head_estimate(_best_child(suffix), self.profile, self._factor())

    def skip_growth(self) -> None:
        """Take back ``wants_growth``'s yes (the batch engine found the growth not worth its cost this step): the
        step drafts from the suffix alone and counts as a step without growth."""
        if self._grew:
            self._grew = False
            self._since_growth = self._steps_covered

    def draft_from(self, root_token: int, grown: tuple[np.ndarray, np.ndarray, np.ndarray] | None):
        """The second half of ``draft``: the candidates of this step from the suffix proposal ``wants_growth``
        looked up and, when it said the head grows, the head's ``(scores, tokens, parents)`` (``grown``)."""
        root = int(root_token)
        if (grown is not None) != self._grew:
            raise ConfigError(f"draft_from: wants_growth said grow={self._grew} but the head's candidates were "
                              f"{'given' if grown is not None else 'not given'}")
        suffix = self._suffix[0] if self._suffix is not None else None
        eagle = None
        if grown is not None:
            scores, tokens, parents = grown
            if self.mode == "eagle" and self.budget == "fixed":  # exactly Eagle3Proposer's tree
                grown_tree = select_tree(root, scores, tokens, parents, self.max_nodes)
                source = np.full(grown_tree.layout.num_nodes, SOURCE_EAGLE, np.int8)
                source[0] = SOURCE_ROOT
                return self._record(MergedTree(grown_tree.layout, CandidateTree.from_grown(grown_tree).probs, source),
                                    True, None, 0)
            eagle = CandidateTree.from_eagle(root, scores, tokens, parents)
            self.profile.update(_sorted(eagle))
        self.draft_ms = ((self.costs.suffix_ms if suffix is not None else 0.0)
                         + (self.costs.grow_ms if grown is not None else 0.0))
        if eagle is None and suffix is None:  # the head alone, its growth declined (``skip_growth``): the root alone
            return union(CandidateTree.single(root), None)
        return union(eagle, suffix)

    def accept(self, acceptance, aux_hidden: np.ndarray) -> None:
        proposed = self._last.layout.num_nodes if self._last is not None else 0
        # fewer when the engine verified the root alone (the end of the cache); 0: not recorded
        verified = acceptance.nodes or proposed
        if self.tracker is not None and self._proposed_at is not None and self._last is not None:
            self.tracker.observe(verified, (self._clock() - self._proposed_at) * 1000)  # the tree that ran
            self.costs = self.tracker.costs()
            if verified == 1:
                self._since_baseline = 0
        self._proposed_at = None
        if self.ratio is not None and self._last is not None and verified == proposed:
            self.ratio.observe(float(self._last.probs[1:].sum()), len(acceptance.path) - 1)
        if self.learner is not None and self._suffix is not None:
            tree, feats = self._suffix
            labelled, accepted = labelled_nodes(tree.tokens, tree.parents, acceptance.tokens)
            self.learner.observe(NodeFeatures(feats.m_eff[labelled], feats.role[labelled], feats.count[labelled]),
                                 accepted[labelled])
        self._suffix = None
        self.index.extend(acceptance.tokens)
        if self.eagle is not None:
            self._queue(acceptance.tokens, aux_hidden)
        if self._last is not None and self.log:
            flags = tuple(int(self._last.source[i]) for i in acceptance.path[1:])
            last = self.log[-1]
            self.log[-1] = StepProposal(last.grew, last.nodes, last.bucket, last.expected_tokens, last.suffix_match,
                                        last.source, flags)
        self._last = None
        if self._step_started is not None:  # an awake step: what it saved against a plain one, drafting included
            step_ms = (self._clock() - self._step_started) * 1000 - self._catch_up_excess_ms
            self.guard.observe(len(acceptance.path) - 1, step_ms, self.costs.bucket_ms[0][1])
            self._step_started = None

    def _factor(self) -> float:
        return self.ratio.factor if self.ratio is not None else 1.0

    def _scaled(self, sorted_probs: np.ndarray) -> np.ndarray:
        return self.ratio.scale(sorted_probs) if self.ratio is not None else sorted_probs

    # ----- the head's context -----------------------------------------------------------------------------
    def catch_up(self) -> None:
        """Write the queued entries into the head's context (one chunked forward); no-op when none is queued."""
        if self.eagle is None or not self._pending_tokens:
            return
        tokens, feats = self._pending_tokens, np.concatenate(self._pending_feats, 0)
        self._pending_tokens, self._pending_feats = [], []
        self.eagle.extend(tokens, feats)

    @property
    def pending(self) -> int:
        """Committed tokens the head has not seen yet."""
        return len(self._pending_tokens)

    def _queue(self, tokens: Sequence[int], feats: np.ndarray) -> None:
        feats = np.asarray(feats, np.float32)
        if feats.ndim != 2 or feats.shape[0] != len(tokens):
            raise ConfigError(f"HybridProposer: {len(tokens)} tokens but features of shape {feats.shape} "
                              "(one row of teacher aux hidden states per token)")
        self._pending_tokens += [int(t) for t in tokens]
        self._pending_feats.append(feats)

    # ----- bookkeeping ------------------------------------------------------------------------------------
    def _record(self, merged: MergedTree, grew: bool, bucket: int | None, match: int) -> TreeLayout:
        self._last = merged
        self.log.append(StepProposal(grew, merged.layout.num_nodes, bucket, merged.expected_tokens, match,
                                     tuple(int(s) for s in merged.source)))
        self._proposed_at = self._clock()
        return merged.layout

    def accepted_by_source(self) -> dict[str, int]:
        """Accepted draft tokens of the current request by source: eagle only, suffix only, both."""
        flags = [f for step in self.log for f in step.accepted]
        return {"eagle": flags.count(SOURCE_EAGLE), "suffix": flags.count(SOURCE_SUFFIX),
                "both": flags.count(SOURCE_BOTH)}


BASELINE_SAMPLES = 3
"""A proposer that learns its own costs verifies the root alone until it has timed this many such steps: every plan
is weighed against plain decoding, so its cost must be measured, not extrapolated. Why: a proposer whose drafts
paid from the first step never ran a root-only step, and the prior's shape (dense fp32, where a 4-row verification
costs 1.1 decode steps) scaled to the seen buckets priced plain decoding at 25 ms where it costs ~12 (native Q4_1,
Zen 4 VM): trees of 4 nodes looked free, 686 of 745 steps verified them and the single-request engine ran at 0.75x of
the batch engine's speed at one request, whose costs come from every step it runs."""

BASELINE_EVERY = 128
"""... and then once every this many of its proposals without a root-only step, so that plain decoding's cost
follows the machine as the other buckets' do (the windows keep the last 16 samples of each)."""

WAKE_MATCH = 4
"""An asleep request wakes when the committed sequence's last ``WAKE_MATCH`` tokens occurred earlier: a copy is
starting (replayed over the 240 turns: 3 wakes too often on chance matches, 6 misses the start of copies)."""


def _sorted(tree: CandidateTree | None) -> np.ndarray:
    return np.zeros(0) if tree is None else np.sort(tree.probs[1:])[::-1]


def _best_child(tree: CandidateTree | None) -> float:
    """Largest p among the root's children (0 when there are none)."""
    if tree is None or tree.num_nodes == 1:
        return 0.0
    first = tree.parents[1:] == 0
    return float(tree.probs[1:][first].max())


__all__ = ["HybridProposer", "StepProposal"]
