"""The gain guard: a request whose speculative steps save nothing against plain decoding stops looking for drafts
for a spell of plain steps (doubling while it keeps losing), wakes early when a copy starts, and stays awake while
drafting pays; the engine's output is the teacher's greedy output either way."""

import numpy as np
import pytest

from mindspore_eagle.draft import hybrid
from mindspore_eagle.draft.budget import GainGuard
from mindspore_eagle.draft.hybrid import BASELINE_EVERY, BASELINE_SAMPLES, WAKE_MATCH, HybridProposer
from mindspore_eagle.drafting import DraftingConfig
from mindspore_eagle.errors import ConfigError
from mindspore_eagle.verify import Acceptance


def test_a_losing_probe_sleeps_and_each_losing_spell_doubles_the_sleep_up_to_the_cap():
    g = GainGuard(probe=2, decay=1.0, min_sleep=3, max_sleep=8)
    g.observe(0, 11.0, 10.0)  # -1 ms: still probing
    assert not g.dormant and g.gain_ms == pytest.approx(-1.0)
    g.observe(0, 11.0, 10.0)  # -2 ms after the probe: asleep for min_sleep steps
    assert g.dormant and g.asleep == 3
    sleeps = []
    for _ in range(4):  # each spell: sleep it out, probe again, lose again
        n = 0
        while g.dormant:
            g.sleep_step()
            n += 1
        sleeps.append(n)
        assert g.gain_ms == 0.0 and g.awake_steps == 0  # woken with an empty sum
        g.observe(0, 11.0, 10.0)
        g.observe(0, 11.0, 10.0)
    assert sleeps == [3, 6, 8, 8] and g.slept_steps == 25


def test_a_paying_step_keeps_the_request_awake_and_a_paid_spell_resets_the_sleep():
    g = GainGuard(probe=2, decay=1.0, min_sleep=2, max_sleep=16)
    g.observe(0, 11.0, 10.0)
    g.observe(1, 14.0, 10.0)  # -1 + 6 = +5: the drafts pay
    assert not g.dormant and g.gain_ms == pytest.approx(5.0)
    for _ in range(4):  # a plain step's overhead eats the credit ms by ms
        g.observe(0, 11.0, 10.0)
    assert not g.dormant and g.gain_ms == pytest.approx(1.0)
    g.observe(0, 11.0, 10.0)  # 0 ms saved is no gain
    assert g.asleep == 2  # the first sleep of the request
    while g.dormant:
        g.sleep_step()
    g.observe(0, 11.0, 10.0)
    g.observe(0, 11.0, 10.0)
    assert g.asleep == 4  # lost again: doubled
    g.wake()  # a copy starts: awake at once, an empty sum
    assert not g.dormant and g.gain_ms == 0.0
    g.observe(2, 15.0, 10.0)
    g.observe(0, 11.0, 10.0)  # +15 - 1: this spell paid
    for _ in range(14):
        g.observe(0, 11.0, 10.0)
    assert g.asleep == 2  # a spell that paid resets the sleep to min_sleep


def test_the_decay_forgets_an_old_profit():
    g = GainGuard(probe=1, decay=0.5, min_sleep=1, max_sleep=1)
    g.observe(5, 10.0, 10.0)  # +50
    for _ in range(7):
        g.observe(0, 12.0, 10.0)  # -2 each; 50 halves every step
    assert g.dormant


@pytest.mark.parametrize("kwargs", [dict(probe=0), dict(min_sleep=True), dict(min_sleep=8, max_sleep=4),
                                    dict(decay=0.0), dict(decay=1.5)])
def test_bad_guard_settings_are_refused(kwargs):
    with pytest.raises(ConfigError, match="GainGuard"):
        GainGuard(**kwargs)


class Clock:
    """A fake clock: every read advances ``tick`` seconds, so every step looks as dear as its clock reads."""

    def __init__(self, tick: float):
        self.t, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.t += self.tick
        return self.t


def _step(prop, root: int, future: list[int]):
    """One engine step against a known future (nothing but the root's bonus accepted unless the tree spells it)."""
    from mindspore_eagle.draft.replay import accepted_path

    layout = prop.propose(root)
    path = accepted_path(layout, future)
    tokens = tuple(future[:len(path)])
    prop.accept(Acceptance(path, tokens, tokens[-1]), np.zeros((len(path), 0), np.float32))
    return layout


def test_an_asleep_proposer_looks_nothing_up_and_wakes_when_a_copy_starts(monkeypatch):
    lookups = []
    real = hybrid.suffix_proposal
    monkeypatch.setattr(hybrid, "suffix_proposal", lambda *a: lookups.append(1) or real(*a))
    # each clock read 10 ms: a step reads it 3-4 times (30-40 ms) and a plain row is learnt at ~20 ms: losing
    prop = HybridProposer(DraftingConfig(proposer="suffix", budget="adaptive", max_nodes=16), buckets=(1, 8, 16),
                          clock=Clock(0.010))
    assert prop.guard is not None
    text = list(range(100, 160))  # no token repeats: nothing to copy, nothing accepted
    prop.begin(text[:4], np.zeros((4, 0), np.float32), text[4])
    pos = 5
    while not prop.guard.dormant:
        _step(prop, text[pos - 1], text[pos:])
        pos += 1
    assert pos - 5 == BASELINE_SAMPLES + prop.guard.probe  # the first steps time plain decoding, unweighed
    before = len(lookups)
    for _ in range(3):  # asleep: the root alone, no lookup
        assert _step(prop, text[pos - 1], text[pos:]).num_nodes == 1
        pos += 1
    assert len(lookups) == before and prop.guard.slept_steps == 3 and len(prop.log) == pos - 5
    # the text now repeats its first WAKE_MATCH + 2 tokens: once WAKE_MATCH of them are committed again, it wakes
    copy = text[:WAKE_MATCH + 2]
    for k in range(WAKE_MATCH):
        _step(prop, ([text[pos - 1]] + copy)[k], copy[k:])
    assert prop.guard.dormant and len(lookups) == before
    layout = _step(prop, copy[WAKE_MATCH - 1], copy[WAKE_MATCH:])
    assert not prop.guard.dormant and len(lookups) == before + 1
    assert layout.num_nodes > 1 and int(layout.tokens[1]) == copy[WAKE_MATCH]  # it drafts the copy at once


def test_without_its_own_costs_a_proposer_leaves_its_guard_to_the_batch_engine_and_a_fixed_budget_has_none():
    batch = HybridProposer(DraftingConfig(proposer="suffix", budget="adaptive", max_nodes=16), buckets=(1, 8, 16),
                           learn_costs=False, clock=Clock(0.010))
    text = list(range(100, 130))
    batch.begin(text[:4], np.zeros((4, 0), np.float32), text[4])
    for pos in range(5, 25):  # steps that would look losing to a proposer timing itself
        _step(batch, text[pos - 1], text[pos:])
    assert batch.guard.awake_steps == 0 and not batch.guard.dormant  # only the batch engine weighs its steps
    assert HybridProposer(DraftingConfig(proposer="suffix", budget="fixed", max_nodes=16),
                          buckets=(1, 8, 16)).guard is None
    assert HybridProposer(DraftingConfig(proposer="suffix", budget="adaptive", max_nodes=16), buckets=(1, 8, 16),
                          gain_guard=False).guard is None


def test_a_proposer_timing_itself_measures_plain_decoding_before_it_drafts_and_again_now_and_then():
    """Every plan is weighed against plain decoding, so a proposer that learns its own costs verifies the root alone
    for its first BASELINE_SAMPLES steps (even with confident drafts) and once more after BASELINE_EVERY steps
    without a root-only one; a proposer the batch engine times (learn_costs=False) never does."""
    text = [11, 12, 13, 14, 15] * 600  # a copy from the first step: the suffix index drafts it confidently
    prop = HybridProposer(DraftingConfig(proposer="suffix", budget="adaptive", max_nodes=16), buckets=(1, 8, 16),
                          clock=Clock(0.010))
    prop.begin(text[:10], np.zeros((10, 0), np.float32), text[10])
    pos, sizes = 11, []
    while len(sizes) < BASELINE_SAMPLES + BASELINE_EVERY + 2:
        layout = _step(prop, text[pos - 1], text[pos:])
        sizes.append(layout.num_nodes)
        pos = len(prop.index.tokens)
    assert sizes[:BASELINE_SAMPLES] == [1] * BASELINE_SAMPLES
    assert prop.tracker.samples(1) >= BASELINE_SAMPLES
    drafting = sizes[BASELINE_SAMPLES:BASELINE_SAMPLES + BASELINE_EVERY]
    assert min(drafting) > 1  # then it drafts, every step while it pays
    assert sizes[BASELINE_SAMPLES + BASELINE_EVERY] == 1 and sizes[-1] > 1  # one root-only step, then drafts again
    batch = HybridProposer(DraftingConfig(proposer="suffix", budget="adaptive", max_nodes=16), buckets=(1, 8, 16),
                           learn_costs=False, clock=Clock(0.010))
    batch.begin(text[:10], np.zeros((10, 0), np.float32), text[10])
    assert _step(batch, text[10], text[11:]).num_nodes > 1
