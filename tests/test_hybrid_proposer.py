"""HybridProposer in the engine: every mode and budget is lossless (output == teacher-only greedy, token for
token, against transformers), the draft head's context stays exactly what the committed tokens and the
teacher's features make it even when the suffix branch proposed them (eagerly or after a lazy catch-up), and
the offline replay reproduces the engine's steps."""

import numpy as np
import pytest

from mindspore_eagle.runtime import RuntimeConfig
from mindspore_eagle.draft import Eagle3Proposer, draft_cache_len
from mindspore_eagle.draft.budget import VerifyCosts
from mindspore_eagle.draft.hybrid import HybridProposer
from mindspore_eagle.draft.replay import replay
from mindspore_eagle.draft_config import TreeBudget
from mindspore_eagle.drafting import DraftingConfig
from mindspore_eagle.engine import SpeculativeEngine
from mindspore_eagle.errors import ConfigError, TreeInvariantError
from mindspore_eagle.models.eagle3 import Eagle3DraftHead
from mindspore_eagle.teacher import Teacher
from tests.helpers import torch_greedy, write_public_head

RUNTIME = dict(max_cache_len=160, buckets=(1, 8, 16, 32), prefill_chunk=16)
BUDGET = TreeBudget(max_nodes=16, depth=3, top_k=3)
HEAD_CONFIG = dict(architectures=["LlamaForCausalLMEagle3"], hidden_size=64, intermediate_size=96,
                   num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1, rms_norm_eps=1e-5,
                   rope_theta=10000.0, vocab_size=101, draft_vocab_size=48, hidden_act="silu",
                   max_position_embeddings=256, tie_word_embeddings=False)
# The last prompt is periodic: the tiny teacher's continuation of it has runs the suffix branch predicts.
PROMPTS = [[3, 17, 42, 5], [9, 9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 20], [5, 6, 7, 8] * 5]
N = 40
CHEAP_GROWTH = VerifyCosts(((1, 70.0), (8, 125.0), (16, 126.0), (32, 176.0)), grow_ms=5.0)
COSTLY_GROWTH = VerifyCosts(((1, 70.0), (8, 125.0), (16, 126.0), (32, 176.0)), grow_ms=5000.0)


@pytest.fixture(scope="module")
def parts(hf_tiny, tmp_path_factory):
    """Teacher (transformers-checked tiny Llama), a factory of proposers over one random EAGLE-3 head's weights
    (each call a new head instance: its own cache and graphs), and the teacher's greedy futures of PROMPTS."""
    from ckpt_convert import convert_eagle3

    _, ms_dir, torch_model = hf_tiny("llama")
    teacher = Teacher.load(ms_dir, RuntimeConfig(**RUNTIME))
    root = tmp_path_factory.mktemp("hybrid_head")
    write_public_head(str(root / "public"), HEAD_CONFIG, seed=3)
    convert_eagle3(str(root / "public"), str(root / "ours"))

    def make_eagle():
        head = Eagle3DraftHead.load(str(root / "ours"), max_len=draft_cache_len(teacher.max_len, BUDGET))
        return Eagle3Proposer.for_teacher(head, teacher, BUDGET)

    return teacher, make_eagle, [torch_greedy(torch_model, p, N) for p in PROMPTS]


@pytest.fixture(scope="module")
def setup(parts):
    """The teacher, two proposers (two head instances over the same weights) and the greedy futures."""
    teacher, make_eagle, futures = parts
    return teacher, make_eagle(), make_eagle(), futures


# hybrid-fixed (~18 s on a 2-vCPU Zen 3) with the slow tests: the default, hybrid-adaptive, stays
@pytest.mark.parametrize("mode, budget", [("suffix", "fixed"), ("suffix", "adaptive"),
                                          pytest.param("hybrid", "fixed", marks=pytest.mark.slow),
                                          ("hybrid", "adaptive"), ("eagle", "adaptive")])
def test_every_mode_and_budget_equals_greedy_token_for_token(setup, mode, budget):
    teacher, eagle, _, futures = setup
    for prompt, future in zip(PROMPTS, futures):
        prop = HybridProposer(DraftingConfig(proposer=mode, budget=budget, max_nodes=16), eagle,
                              buckets=teacher.runtime.buckets, costs=CHEAP_GROWTH)
        gen = SpeculativeEngine(teacher).generate(prompt, N, proposer=prop)
        assert list(gen.tokens) == future
        assert len(prop.log) == gen.cycles
        if budget == "adaptive":
            assert {s.bucket for s in prop.log} <= {1, 8, 16}
            assert all(s.nodes <= s.bucket for s in prop.log)
    if mode != "eagle":  # the periodic prompt: the suffix branch got drafts accepted
        assert prop.accepted_by_source()["suffix"] + prop.accepted_by_source()["both"] > 0


def test_a_head_only_proposer_whose_growth_the_batch_engine_declines_decodes_the_root_alone(setup):
    """The batch engine may decline a head's growth (``plan_growth``); a request drafting from the head alone then has
    no candidates at all this step and must decode plainly (it raised "union: at least one candidate tree is
    required", a 500 in the server, once measured costs made the engine decline)."""
    teacher, eagle, _, futures = setup
    prop = HybridProposer(DraftingConfig(proposer="eagle", max_nodes=16), eagle, buckets=teacher.runtime.buckets,
                          costs=CHEAP_GROWTH)
    prompt, future = PROMPTS[0], futures[0]
    engine = SpeculativeEngine(teacher)

    def declined(root):  # what BatchEngine._plan does with a growth it does not keep
        assert prop.wants_growth(root)
        prop.skip_growth()
        return prop.draft_from(root, None)

    prop.draft = declined
    gen = engine.generate(prompt, N, proposer=prop)
    assert list(gen.tokens) == future
    assert all(step.tree_nodes == 1 for step in gen.steps) and not any(s.grew for s in prop.log)


def test_eagle_fixed_mode_proposes_exactly_the_head_trees(setup):
    teacher, eagle, plain, futures = setup
    prop = HybridProposer(DraftingConfig(proposer="eagle", budget="fixed", max_nodes=BUDGET.max_nodes), eagle,
                          buckets=teacher.runtime.buckets)
    a = SpeculativeEngine(teacher).generate(PROMPTS[2], N, proposer=prop)
    b = SpeculativeEngine(teacher).generate(PROMPTS[2], N, proposer=plain)
    assert [(s.tree_nodes, s.path) for s in a.steps] == [(s.tree_nodes, s.path) for s in b.steps]
    assert list(a.tokens) == futures[2]


class CaptureFeatures:
    """Keeps the prefill's teacher features (``generate(seq, 1)`` runs no speculative step)."""

    max_nodes = 1

    def begin(self, prompt, aux, first):
        self.aux = np.asarray(aux)

    def propose(self, root):
        raise AssertionError("unexpected step")

    def accept(self, acc, aux):
        raise AssertionError("unexpected step")


@pytest.mark.parametrize("costs", [CHEAP_GROWTH, COSTLY_GROWTH], ids=["growth-each-step", "lazy-catch-up"])
def test_head_context_equals_a_head_fed_the_whole_sequence_when_the_suffix_branch_drafted(setup, costs):
    teacher, eagle, ref, _ = setup
    prompt = PROMPTS[2]
    prop = HybridProposer(DraftingConfig(proposer="hybrid", budget="adaptive", max_nodes=16), eagle,
                          buckets=teacher.runtime.buckets, costs=costs, learn_costs=False)  # costs decide the growth
    gen = SpeculativeEngine(teacher).generate(prompt, N, proposer=prop)
    by_source = prop.accepted_by_source()
    assert by_source["suffix"] > 0, by_source
    grew = [s.grew for s in prop.log]
    if costs is COSTLY_GROWTH:  # growth only while learning the profile (8 steps) and to refresh it (every 32)
        assert grew[:8] == [True] * 8 and not any(grew[8:8 + 31]) and len(grew) > 12
        assert prop.pending > 5  # the tokens committed since the last growth wait in the queue
    prop.catch_up()
    seq = list(prompt) + list(gen.tokens[:-1])  # committed tokens; the last emitted token is the next root
    assert prop.pending == 0 and eagle.committed_len == len(seq) and eagle.root_token == gen.tokens[-1]
    capture = CaptureFeatures()
    SpeculativeEngine(teacher).generate(seq, 1, proposer=capture)
    ref.begin(seq, capture.aux, gen.tokens[-1])  # one prefill's features for the whole committed sequence
    n = len(seq)
    for (k, v), (k_ref, v_ref) in zip(eagle.head.cache_parameters(), ref.head.cache_parameters()):
        np.testing.assert_allclose(k.asnumpy()[:, :, :n], k_ref.asnumpy()[:, :, :n], atol=2e-4, rtol=1e-3)
        np.testing.assert_allclose(v.asnumpy()[:, :, :n], v_ref.asnumpy()[:, :, :n], atol=2e-4, rtol=1e-3)
    scores, tokens, parents = eagle.candidates()
    ref_scores, ref_tokens, ref_parents = ref.candidates()
    np.testing.assert_array_equal(tokens, ref_tokens)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-3)


def test_the_suffix_calibration_learns_from_the_engine_steps_and_the_output_stays_greedy(setup):
    teacher, eagle, _, futures = setup
    prompt, future = PROMPTS[-1], futures[-1]  # the periodic prompt: suffix candidates every step
    online = DraftingConfig(proposer="hybrid", budget="adaptive", max_nodes=16, suffix_calibration="online")
    learnt = HybridProposer(online, eagle, buckets=teacher.runtime.buckets, costs=CHEAP_GROWTH)
    assert list(SpeculativeEngine(teacher).generate(prompt, N, proposer=learnt).tokens) == future
    assert learnt.learner is learnt.calibration and learnt.learner.labels > 0
    assert not np.allclose(learnt.learner.ratio, 1.0)  # the steps moved it
    labels = learnt.learner.labels
    learnt.begin(prompt, np.zeros((len(prompt), 3 * teacher.cfg.hidden_size), np.float32), future[0])
    assert learnt.learner.labels == labels  # a new request keeps what was learnt (it describes the teacher too)
    shipped = HybridProposer(DraftingConfig(proposer="hybrid", budget="adaptive", max_nodes=16,
                                            suffix_calibration="shipped"), eagle,
                             buckets=teacher.runtime.buckets, costs=CHEAP_GROWTH)
    assert list(SpeculativeEngine(teacher).generate(prompt, N, proposer=shipped).tokens) == future
    assert shipped.learner is None


@pytest.mark.parametrize("budget", ["fixed", "adaptive"])
def test_offline_replay_reproduces_the_engine_steps(setup, budget):
    teacher, _, _, _ = setup
    drafting = DraftingConfig(proposer="suffix", budget=budget, max_nodes=16)
    for prompt in PROMPTS:  # the same cost table on both sides (no learning from wall-clock time)
        gen = SpeculativeEngine(teacher).generate(
            prompt, N, proposer=HybridProposer(drafting, buckets=teacher.runtime.buckets, learn_costs=False))
        steps = replay(HybridProposer(drafting, buckets=teacher.runtime.buckets, learn_costs=False), prompt, gen.tokens)
        # Every step but the last is the engine's; the last one is cut where the known output ends.
        assert len(steps) == gen.cycles
        assert [(s.nodes, s.emitted) for s in steps[:-1]] == [(s.tree_nodes, s.emitted) for s in gen.steps[:-1]]
        assert steps[-1].nodes == gen.steps[-1].tree_nodes


def test_bad_configurations_and_a_foreign_root_are_refused(setup):
    """Only what a DraftingConfig cannot know is checked here (an unknown proposer or budget, or max_nodes 0, is
    refused where the config is made: tests/test_build.py)."""
    teacher, eagle, _, _ = setup
    suffix = DraftingConfig(proposer="suffix", max_nodes=16)
    buckets = teacher.runtime.buckets
    with pytest.raises(ConfigError, match="expected a DraftingConfig, got 'hybrid'"):
        HybridProposer("hybrid", buckets=buckets)
    with pytest.raises(ConfigError, match="proposer='hybrid' needs an Eagle3Proposer"):
        HybridProposer(DraftingConfig(), buckets=buckets)
    with pytest.raises(ConfigError, match="head='oracle' is an oracle"):
        HybridProposer(DraftingConfig(head="oracle"), eagle, buckets=buckets)
    with pytest.raises(ConfigError, match=r"max_nodes=64: exceeds the largest verification bucket 32"):
        HybridProposer(DraftingConfig(proposer="suffix", max_nodes=64), buckets=buckets)
    with pytest.raises(ConfigError, match="explore_every=0"):
        HybridProposer(suffix, buckets=buckets, explore_every=0)
    with pytest.raises(ConfigError, match="no cost for buckets"):
        HybridProposer(suffix, costs=VerifyCosts(((1, 70.0), (8, 100.0))), buckets=(1, 8, 16))
    prop = HybridProposer(suffix, buckets=buckets)
    prop.begin([1, 2, 3], np.zeros((3, 0), np.float32), 4)
    with pytest.raises(TreeInvariantError, match="ends with 4"):
        prop.propose(5)


def test_after_warm_up_no_catch_up_of_the_head_compiles_inside_a_request(parts):
    """An adaptive hybrid proposer that stops growing writes everything committed meanwhile into the head in one
    catch-up at its next growth, in whatever context bucket that needs. The warm-up's own requests reach only the
    buckets their catch-ups happen to need (prompts stop at the prefill chunk, 16, and growth stops once the
    profile is learnt); ``harness.warm_up`` must compile the rest, so that a catch-up beyond 16 rows in a later
    request compiles nothing, and the warm-up must leave the proposer lossless."""
    from mindspore_eagle.app.harness import warm_up

    teacher, make_eagle, futures = parts
    eagle = make_eagle()
    assert eagle.first_call_s == {}
    prop = HybridProposer(DraftingConfig(proposer="hybrid", budget="adaptive", max_nodes=32), eagle,
                          buckets=teacher.runtime.buckets, costs=COSTLY_GROWTH, learn_costs=False, explore_every=1000)
    engine = SpeculativeEngine(teacher)
    warm_up(engine, lambda greedy: prop, PROMPTS[0], N)
    compiled = dict(eagle.first_call_s)
    assert set(compiled) == set(teacher.runtime.buckets.sizes)

    gen = engine.generate(PROMPTS[2], N, proposer=prop)
    assert list(gen.tokens) == futures[2]
    assert not any(step.grew for step in prop.log) and prop.pending > 16  # the catch-up below needs bucket 32
    prop.catch_up()
    assert prop.pending == 0 and eagle.committed_len == len(PROMPTS[2]) + len(gen.tokens) - 1
    assert eagle.first_call_s == compiled


def test_acceptance_ratio_scales_estimates_by_what_the_teacher_accepts_and_recovers():
    from mindspore_eagle.draft.budget import AcceptanceRatio

    r = AcceptanceRatio(decay=1.0, prior=2.0)
    assert r.factor == 1.0
    r.observe(6.0, 1)
    assert r.factor == pytest.approx(3 / 8)
    np.testing.assert_allclose(r.scale(np.array([0.8, 0.4])), [0.3, 0.15])
    r = AcceptanceRatio(decay=0.5, prior=2.0)
    r.observe(8.0, 0)
    low = r.factor
    for _ in range(10):  # steps that verify no draft: the sums decay, the factor returns towards 1
        r.observe(0.0, 0)
    assert low < 0.5 < r.factor <= 1.0
    assert AcceptanceRatio().scale(np.array([0.9]))[0] <= 1.0
    r.observe(1.0, 5)  # more accepted than estimated: estimates scale up, capped at p = 1
    assert r.factor > 1.0 and r.scale(np.array([0.9]))[0] == 1.0


def test_a_request_the_gain_guard_puts_to_sleep_still_equals_greedy(setup):
    """A clock that makes every step look dearer than the tokens it saves: the guard sleeps (plain steps) and wakes
    (drafts again) within the request, and the output is still the teacher's greedy output token for token."""
    from tests.test_gain_guard import Clock

    teacher, eagle, _, futures = setup
    slept = []
    for prompt, future in zip(PROMPTS, futures):
        prop = HybridProposer(DraftingConfig(proposer="hybrid", budget="adaptive", max_nodes=16), eagle,
                              buckets=teacher.runtime.buckets, costs=CHEAP_GROWTH, clock=Clock(0.010))
        gen = SpeculativeEngine(teacher).generate(prompt, N, proposer=prop)
        assert list(gen.tokens) == future
        assert len(prop.log) == gen.cycles
        slept.append(prop.guard.slept_steps)
        assert sum(s.nodes > 1 for s in prop.log) > 0  # awake spells drafted
    assert min(slept) > 0
