"""The batch engine: every request's tokens equal its batch-1 tokens whatever else runs beside it (prefill chunks
interleaved with decoding, speculation on and off, the EAGLE-3 head growing for several requests in one graph, greedy
beside sampling), cancels free their slots, bad requests are refused before they are queued, and the global budget
ranks candidates across requests.

The reference is the batch-1 ``SpeculativeEngine`` on its own teacher (cache 512), itself tied to HuggingFace
``transformers`` by ``test_default_teacher.py``."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspore_eagle.runtime import Buckets, RuntimeConfig
from mindspore_eagle.draft import hybrid
from mindspore_eagle.draft.budget import VerifyCosts
from mindspore_eagle.engine import SpeculativeEngine
from mindspore_eagle.errors import CacheCapacityError, ConfigError
from mindspore_eagle.serving import BatchEngine, QueueFullError, plan_growth, plan_rows
from mindspore_eagle.drafting import DraftingConfig, Proposer
from mindspore_eagle.serving.stack import build_batch, proposer_factory
from mindspore_eagle.verify import SamplingParams

COPY = "Copy this list exactly: apples, bananas, cherries, dates, elderberries, figs, grapes."
PROMPTS = [COPY,
           "Write a Python function that returns the n-th Fibonacci number.",
           "What is the capital of France?",
           # longer than a prefill chunk: written over several steps while the others decode
           "Summarise the following text in two sentences. " + " ".join(
               f"Sentence {i} says that the river is wide and the boats are slow." for i in range(8))]
SLOT = 320


@pytest.fixture(scope="module")
def stack(default_teacher):
    from tests.helpers import default_model_or_skip

    rt = RuntimeConfig(buckets=Buckets((1, 4, 16, 64)), prefill_chunk=16)
    # hybrid: the suffix index and the shipped head, one draft context per slot (the product's single-request drafting)
    return build_batch(default_model_or_skip(), 4, SLOT, rt, DraftingConfig(proposer=Proposer.HYBRID))


@pytest.fixture(scope="module")
def prompts(default_teacher):
    _, tok = default_teacher
    return [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]


@pytest.fixture(scope="module")
def reference(default_teacher, prompts):
    teacher, tok = default_teacher
    eng = SpeculativeEngine(teacher)
    return [eng.generate(p, 40, tok.eos_token_ids).tokens for p in prompts]


def drain(engine, limit=2000):
    for _ in range(limit):
        if not engine.has_work():
            return
        engine.step()
    raise AssertionError("engine did not finish")


def assert_no_slot_leaked(engine):
    assert not engine.running and engine.num_waiting == 0
    assert sorted(engine.free_slots) == list(range(engine.max_seqs))


def test_plan_rows_ranks_candidates_across_requests():
    costs = VerifyCosts(((1, 20.0), (2, 21.0), (4, 24.0), (8, 40.0)))
    counts, bucket = plan_rows([np.array([0.9, 0.2]), np.array([0.8])], 2, costs)
    assert (counts, bucket) == ([1, 1], 4)  # 0.9 and 0.8 fill bucket 4; 0.2 is not worth bucket 8
    counts, bucket = plan_rows([np.array([0.1]), np.array([0.05])], 2, costs)
    assert (counts, bucket) == ([0, 0], 2)  # weak candidates: plain decoding, the roots only
    with pytest.raises(ConfigError):
        plan_rows([np.zeros(0)] * 9, 9, costs)


def test_heads_grow_only_while_their_drafts_pay_for_the_batched_growth():
    costs = VerifyCosts(((2, 20.0), (4, 22.0), (8, 30.0)))
    suffix, head = [np.zeros(0), np.zeros(0)], [np.array([0.9, 0.8])] * 2
    # none grows: 2 tokens / 20 ms = 0.1. One: bucket 4, 3.7 / (22 + g(1)); both: bucket 8, 5.4 / (30 + g(2))
    assert plan_growth(suffix, head, [0, 1], 2, costs, lambda g: 5.0) == [0, 1]  # 0.154 beats 0.137 and 0.1
    assert plan_growth(suffix, head, [0, 1], 2, costs, lambda g: 10.0 * g) == [0]  # 0.116 beats 0.108 and 0.1
    assert plan_growth(suffix, head, [0, 1], 2, costs, lambda g: 30.0 * g) == []  # 0.071: growth costs too much
    assert plan_growth(suffix, head, [1], 2, costs, lambda g: 5.0) == [1]  # only those that want it
    # the request whose growth is expected to add more goes first; confident suffix drafts leave no room for growth
    weak = [np.array([0.9, 0.8]), np.array([0.3])]
    assert plan_growth(suffix, weak, [0, 1], 2, costs, lambda g: 10.0 * g) == [0]
    full = [np.full(6, 0.99), np.zeros(0)]
    assert plan_growth(full, head, [1], 2, costs, lambda g: 5.0) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.floats(0, 1), max_size=5), st.lists(st.floats(0, 1), max_size=5), st.booleans()),
                min_size=1, max_size=6),
       st.floats(0, 200))
def test_growth_goes_to_wanting_requests_by_expected_gain_and_never_lowers_the_plans_rate(reqs, per_growth):
    """Whatever the estimates: only wanting requests grow, the ones expected to add most first, and the chosen plan's
    rate (growth cost included) is at least the rate of growing none."""
    from mindspore_eagle.serving.batch import _best_plan

    costs = VerifyCosts(((1, 10.0), (2, 11.0), (4, 13.0), (8, 20.0), (16, 30.0), (32, 50.0)))
    suffix = [np.sort(np.array(s, np.float64))[::-1] for s, _, _ in reqs]
    head = [np.sort(np.array(h, np.float64))[::-1] for _, h, _ in reqs]
    wanting = [i for i, (_, _, w) in enumerate(reqs) if w]
    grow_ms = lambda g: per_growth * g
    chosen = plan_growth(suffix, head, wanting, len(reqs), costs, grow_ms)
    assert set(chosen) <= set(wanting) and chosen == sorted(chosen)
    gains = {i: float(head[i].sum()) for i in wanting}
    if chosen:
        assert min(gains[i] for i in chosen) >= max([gains[i] for i in wanting if i not in chosen], default=-1)
        lists = [np.sort(np.concatenate([s, head[i]]))[::-1] if i in chosen else s for i, s in enumerate(suffix)]
        with_growth = _best_plan(lists, len(reqs), costs, grow_ms(len(chosen)))[1][0]
        assert with_growth > _best_plan(suffix, len(reqs), costs, 0.0)[1][0]


def test_cost_prior_interpolates_buckets_it_has_not_measured():
    c = VerifyCosts(((1, 20.0), (8, 48.0))).covering((1, 2, 4, 8, 16))
    assert dict(c.bucket_ms) == {1: 20.0, 2: 24.0, 4: 32.0, 8: 48.0, 16: 96.0}


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "hybrid-drafts"])
def test_every_request_equals_its_batch1_greedy_tokens(stack, prompts, reference, speculative):
    engine = stack.engine
    reqs = [engine.submit(p, 40 - 8 * (i == 2), stack.eos, max_nodes=None if speculative else 1)
            for i, p in enumerate(prompts)]
    drain(engine)
    for i, (req, ref) in enumerate(zip(reqs, reference)):
        assert tuple(req.tokens) == tuple(ref[:len(req.tokens)]), i
        assert req.finish_reason in ("eos", "max_new_tokens")
        assert len(req.tokens) == len(ref[:40 - 8 * (i == 2)]), i  # the short one finished while others ran
    if speculative:
        copy = reqs[0]
        assert copy.stats.accepted > 0 and copy.stats.tau > 1.3, copy.stats  # suffix drafts verified in the batch
    assert_no_slot_leaked(engine)


def test_heads_growing_together_keep_every_request_lossless(stack, prompts, reference, monkeypatch):
    """Every request's head grows every step (explore_every 1, and the engine's veto off), the growing ones in one
    batched graph: requests still equal their batch-1 greedy tokens, heads grew for all of them, and in fewer graphs
    than request-steps."""
    engine = stack.engine
    monkeypatch.setattr(engine, "_plan_growth", lambda decoding, adaptive, caps, wanting, fixed: wanting)
    saved = engine.proposer_factory
    engine.proposer_factory = proposer_factory(engine.buckets, stack.drafting, engine.heads, explore_every=1,
                                               gain_guard=False)
    graphs, grown = engine.heads.growths, engine.heads.grown
    try:
        reqs = [engine.submit(p, 40, stack.eos) for p in prompts]
        drain(engine)
    finally:
        engine.proposer_factory = saved
    for i, (req, ref) in enumerate(zip(reqs, reference)):
        assert tuple(req.tokens) == tuple(ref[:len(req.tokens)]), i
        assert req.stats.head_growths == req.stats.steps > 0, (i, req.stats)
    together = engine.heads.grown - grown
    assert together == sum(r.stats.head_growths for r in reqs)
    assert engine.heads.growths - graphs < together  # several requests' growths shared a graph
    assert_no_slot_leaked(engine)


def test_requests_whose_drafts_do_not_pay_sleep_in_the_batch_and_stay_lossless(stack, prompts, reference,
                                                                               monkeypatch):
    """Draft rows priced far above what an accepted token is worth: the gain guard of every request that runs past
    its probe sends it to sleep (plain steps, nothing looked up or verified), and every request still equals its
    batch-1 greedy tokens."""
    engine = stack.engine
    monkeypatch.setattr(engine, "_row_prices", lambda plan, bucket: (1.0, 1000.0))
    monkeypatch.setattr(hybrid, "WAKE_MATCH", 16)  # no early wake-up on a copy: each sleep runs its course
    made, factory = [], engine.proposer_factory
    monkeypatch.setattr(engine, "proposer_factory", lambda *a: made.append(factory(*a)) or made[-1])
    reqs = [engine.submit(p, 40, stack.eos) for p in prompts]
    drain(engine)
    assert len(made) == len(reqs)
    for i, (req, ref, prop) in enumerate(zip(reqs, reference, made)):
        assert tuple(req.tokens) == tuple(ref[:len(req.tokens)]), i
        assert req.stats.draft_steps <= req.stats.steps - prop.guard.slept_steps  # asleep: nothing verified
    for req, prop in zip(reqs, made):  # a request that ran past its probe slept
        assert (prop.guard.slept_steps > 0) == (req.stats.steps > prop.guard.probe), req.stats
    assert_no_slot_leaked(engine)


def record_guard_charges(engine, monkeypatch, step_tags, tag) -> list:
    """Every charge a gain guard is fed from now on, as (charged step ms - plain row ms, ``tag(guard)``);
    ``step_tags`` (what the test marks about guards during one step) is cleared before each engine step."""
    from mindspore_eagle.draft.budget import GainGuard

    charged: list = []
    observe, forward_step = GainGuard.observe, engine._forward_step

    def recording(self, accepted, step_ms, plain_ms):
        charged.append((step_ms - plain_ms, tag(self)))
        return observe(self, accepted, step_ms, plain_ms)

    def step():
        step_tags.clear()
        return forward_step()

    monkeypatch.setattr(engine, "_forward_step", step)
    monkeypatch.setattr(GainGuard, "observe", recording)
    return charged


def test_a_growing_requests_gain_guard_is_charged_its_share_of_the_batched_growth(stack, prompts, monkeypatch):
    """Every batched growth made 60 ms dearer: on each step a request grew, its gain guard is charged at least its
    share of that growth (60 ms over the requests that grew together) on top of its rows; on steps it did not grow,
    none of it. Draft rows are priced at 0, so the growth share is what the charge holds beyond the host time."""
    import time as _time

    engine, delay_ms = stack.engine, 60.0
    monkeypatch.setattr(engine, "_row_prices", lambda plan, bucket: (1.0, 0.0))
    share: dict[int, float] = {}  # guard -> its share of this step's growth
    grow = engine._grow

    def slow_grow(growing):
        out = grow(growing)
        _time.sleep(delay_ms / 1000)
        share.update({id(r.proposer.guard): delay_ms / len(growing) for r in growing})
        return out

    monkeypatch.setattr(engine, "_grow", slow_grow)
    charged = record_guard_charges(engine, monkeypatch, share, lambda guard: share.pop(id(guard), 0.0))
    reqs = [engine.submit(p, 24, stack.eos) for p in prompts]
    drain(engine)
    grew = [(ms, s) for ms, s in charged if s > 0]
    assert grew and sum(r.stats.head_growths for r in reqs) > 0
    assert all(ms >= s for ms, s in grew), grew
    assert all(ms < delay_ms / len(prompts) for ms, s in charged if s == 0)  # host time only, far below a share
    assert_no_slot_leaked(engine)


# slow: ~16 s on a 2-vCPU Zen 3; the guard's charging stays in the default suite (its share of batched growth, above)
@pytest.mark.slow
def test_a_requests_own_catch_up_is_charged_to_its_own_gain_guard(stack, prompts, monkeypatch):
    """Every head grows every step, and one request's catch-ups are made 600 ms dearer: on the steps its head
    caught up, its gain guard is charged at least those 600 ms; the requests growing beside it only their own
    catch-up and their share of the batched growth (well below; a long prompt's first catch-up took ~80 ms under
    `make test`'s two workers, up to ~240 ms beside a training run, hence 600 and not 400). Before, a step's
    catch-ups were summed with the growth and shared out equally: the slowed request was charged a fraction."""
    import time as _time

    engine, delay_ms = stack.engine, 600.0
    factory = proposer_factory(engine.buckets, stack.drafting, engine.heads, explore_every=1)
    slow: set[int] = set()  # guards whose request caught up slowly this step
    made = []

    def make(*args):
        prop = factory(*args)
        if len(made) == 1:  # the second request's (the first, a copy, is done in two steps)
            catch_up = prop.catch_up

            def slow_catch_up():
                if prop.pending:
                    _time.sleep(delay_ms / 1000)
                    slow.add(id(prop.guard))
                return catch_up()
            prop.catch_up = slow_catch_up
        made.append(prop)
        return prop

    engine.heads.warm_up()  # every growth batch and context bucket compiled: no step is charged a compile
    monkeypatch.setattr(engine, "proposer_factory", make)
    monkeypatch.setattr(engine, "_plan_growth", lambda decoding, adaptive, caps, wanting, fixed: wanting)
    monkeypatch.setattr(engine, "_row_prices", lambda plan, bucket: (1.0, 0.0))
    charged = record_guard_charges(engine, monkeypatch, slow, lambda guard: id(guard) in slow)
    reqs = [engine.submit(p, 24, stack.eos) for p in prompts]
    drain(engine)
    assert sum(r.stats.head_growths for r in reqs[1:]) > 0
    slowed = [ms for ms, was in charged if was]
    others = [ms for ms, was in charged if not was]
    assert slowed and all(ms >= delay_ms for ms in slowed), slowed
    assert others and max(others) < 0.6 * delay_ms, max(others)
    assert_no_slot_leaked(engine)


@pytest.mark.slow  # a benchmark harness's run
def test_bench_batch_compares_every_run_with_c1_greedy_and_the_single_request_engine(stack, prompts):
    from mindspore_eagle.serving.bench import bench_batch
    from mindspore_eagle.serving.stack import single_proposer

    lines = []
    summary = bench_batch(stack.engine, prompts[:3], [1, 2], 6, stack.eos, single_proposer(stack), log=lines.append)
    assert len(lines) == 2 + 4  # the single-request engine without and with drafting, then 2 runs per concurrency
    assert summary["all_lossless"] and [r["lossless"] for r in summary["runs"]] == [3] * 4
    assert set(summary["c1_over_single_engine"]) == {"greedy", "spec"}
    runs = [json.loads(line) for line in lines[2:]]
    assert all(0 <= r["head_growths"] <= r["request_steps"] for r in runs)
    # c = 1 has its one request in flight on every step; at c = 2 the third prompt runs alone at the end
    assert all(r["full_share"] > 0.9 and r["full_tok_s"] > 0 for r in runs if r["concurrency"] == 1)
    assert all(0 < r["full_share"] < 0.98 for r in runs if r["concurrency"] == 2)  # 0.88-0.96 measured
    assert set(summary["spec_over_greedy_full"]) == {1, 2}
    assert all(r["head_growths"] == 0 for r in runs if not r["speculative"])  # plain decoding never grows a head
    assert_no_slot_leaked(stack.engine)


@pytest.mark.slow  # a benchmark harness's run
def test_bench_batch_rounds_pair_the_modes_and_summarise_their_medians(stack, prompts):
    """Each round runs the single-request reference's pair, then every concurrency's pair (plain, then speculative,
    back to back), so a c = 1 run and its reference are a minute apart; the summary's ratios are of the medians and
    every round keeps its own; a rounds value below 1 is refused before anything runs."""
    from mindspore_eagle.serving.bench import bench_batch
    from mindspore_eagle.serving.stack import single_proposer

    lines = []
    summary = bench_batch(stack.engine, prompts[:2], [1, 2], 4, stack.eos, None, log=lines.append, rounds=3)
    logged = [json.loads(line) for line in lines]
    assert [("single" if r.get("single_engine") else r["concurrency"], r["round"]) for r in logged] == [
        (x, k) for k in range(3) for x in ("single", 1, 2)]
    runs = [r for r in logged if not r.get("single_engine")]
    assert summary["rounds"] == 3 and summary["all_lossless"]
    c2 = sorted(r["tok_s"] for r in runs if r["concurrency"] == 2)
    c1 = sorted(r["tok_s"] for r in runs if r["concurrency"] == 1)
    assert summary["throughput_over_c1_greedy"][2] == round(c2[1] / c1[1], 2)  # medians, not the last run
    lines.clear()
    summary = bench_batch(stack.engine, prompts[:2], [1], 4, stack.eos, single_proposer(stack), log=lines.append,
                          rounds=2)
    logged = [json.loads(line) for line in lines]
    singles, runs = [r for r in logged if r.get("single_engine")], [r for r in logged if not r.get("single_engine")]
    assert [bool(r.get("single_engine")) for r in logged] == [True, True, False, False] * 2
    assert [(r["round"], r["speculative"]) for r in singles] == [(0, False), (0, True), (1, False), (1, True)]
    plain = (singles[0]["tok_s"] + singles[2]["tok_s"]) / 2  # the median of two
    assert summary["c1_over_single_engine"]["greedy"] == round(
        (runs[0]["tok_s"] + runs[2]["tok_s"]) / 2 / plain, 3)
    assert [(r["round"], r["speculative"]) for r in runs] == [(0, False), (0, True), (1, False), (1, True)]
    assert summary["spec_over_greedy_by_round"][1] == [round(runs[1]["tok_s"] / runs[0]["tok_s"], 2),
                                                       round(runs[3]["tok_s"] / runs[2]["tok_s"], 2)]
    assert summary["spec_over_greedy"][1] == round((runs[1]["tok_s"] + runs[3]["tok_s"])
                                                   / (runs[0]["tok_s"] + runs[2]["tok_s"]), 2)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="rounds"):
            bench_batch(stack.engine, prompts[:1], [1], 2, stack.eos, rounds=bad)
    assert_no_slot_leaked(stack.engine)


def test_each_request_may_draft_from_its_own_source(stack, prompts, reference, monkeypatch):
    """Sources side by side in one batch: the suffix index alone, the head alone, both; all lossless, and the
    suffix-only request never grows the head. A head source on an engine without a head, or an unknown source, is
    refused at submit."""
    engine = stack.engine
    sources = ["suffix", "eagle", "hybrid", None]
    reqs = [engine.submit(p, 32, stack.eos, proposer=src) for p, src in zip(prompts, sources)]
    drain(engine)
    for i, req in enumerate(reqs):
        assert tuple(req.tokens) == tuple(reference[i][:len(req.tokens)]) and len(req.tokens) > 0, sources[i]
    assert reqs[0].stats.head_growths == 0 and reqs[0].stats.steps > 0
    assert sum(r.stats.head_growths for r in reqs[1:]) > 0  # the head's sources did grow it
    with pytest.raises(ConfigError, match="must be one of"):
        engine.submit(prompts[0], 4, proposer="medusa")
    monkeypatch.setattr(engine, "heads", None)
    with pytest.raises(ConfigError, match="has none"):
        engine.submit(prompts[0], 4, proposer="eagle")
    assert engine.num_waiting == 0
    assert_no_slot_leaked(engine)


def test_more_requests_than_slots_queue_and_each_stays_lossless(stack, prompts, reference):
    engine = stack.engine
    reqs = [engine.submit(prompts[i % 4], 24, stack.eos) for i in range(7)]  # 4 slots: 3 wait
    engine.step()
    assert len(engine.running) == 4 and engine.num_waiting == 3
    drain(engine)
    for i, req in enumerate(reqs):
        assert tuple(req.tokens) == tuple(reference[i % 4][:len(req.tokens)]) and len(req.tokens) <= 24
    assert_no_slot_leaked(engine)


def test_cancel_mid_run_frees_the_slot_and_the_others_continue(stack, prompts, reference):
    engine = stack.engine
    reqs = [engine.submit(p, 40, stack.eos) for p in prompts]
    waiting = engine.submit(prompts[0], 40, stack.eos)
    for _ in range(6):
        engine.step()
    engine.cancel(reqs[1].id)
    engine.cancel(waiting.id)
    engine.step()
    assert reqs[1].finish_reason == "cancelled" and waiting.finish_reason == "cancelled"
    assert reqs[1].slot is None and len(engine.free_slots) >= 1
    drain(engine)
    for i in (0, 2, 3):
        assert tuple(reqs[i].tokens) == tuple(reference[i][:len(reqs[i].tokens)])
    engine.cancel("no-such-request")  # unknown ids are ignored
    engine.step()
    assert_no_slot_leaked(engine)


def test_greedy_and_sampling_requests_share_a_batch(stack, default_teacher, prompts, reference):
    teacher, tok = default_teacher
    s = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
    ref_sampled = SpeculativeEngine(teacher).generate(prompts[1], 24, tok.eos_token_ids, s).tokens
    engine = stack.engine
    sampled = engine.submit(prompts[1], 24, stack.eos, s, max_nodes=1)
    greedy = [engine.submit(prompts[i], 40, stack.eos) for i in (0, 2)]
    spec_sampled = engine.submit(prompts[0], 24, stack.eos, s)  # speculative sampling (suffix drafts)
    ref_spec = SpeculativeEngine(teacher).generate(prompts[0], 24, tok.eos_token_ids, s).tokens
    drain(engine)
    assert tuple(sampled.tokens) == tuple(ref_sampled)  # same seed, same draws, whatever else is in the batch
    for req, i in zip(greedy, (0, 2)):
        assert tuple(req.tokens) == tuple(reference[i][:len(req.tokens)])
    # position-keyed sampling: with drafts in a batch, the batch-1 engine's tokens without drafts
    assert tuple(spec_sampled.tokens) == tuple(ref_spec) and spec_sampled.stats.steps > 0
    assert_no_slot_leaked(engine)


def test_bad_requests_are_refused_before_they_are_queued(stack, prompts):
    engine = stack.engine
    with pytest.raises(ConfigError, match="empty prompt"):
        engine.submit([], 8)
    with pytest.raises(CacheCapacityError, match="does not fit"):
        engine.submit([1] * SLOT, 8)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        engine.submit(prompts[0], 0)
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        engine.submit([10 ** 9], 4)
    with pytest.raises(ConfigError, match="max_nodes"):
        engine.submit(prompts[0], 4, max_nodes=0)
    assert engine.num_waiting == 0


def test_a_full_queue_refuses_with_queue_full(stack, prompts):
    engine = stack.engine
    saved = engine.max_queued
    engine.max_queued = 2
    try:
        a, b = engine.submit(prompts[2], 2), engine.submit(prompts[2], 2)
        with pytest.raises(QueueFullError, match="max_queued"):
            engine.submit(prompts[2], 2)
    finally:
        engine.max_queued = saved
    drain(engine)
    assert a.finished and b.finished
    assert_no_slot_leaked(engine)


def test_a_request_that_reaches_its_slot_end_stops_with_cache_full(stack):
    engine = stack.engine
    req = engine.submit([1] * (SLOT - 3), 50)  # 3 rows left: 3 more tokens written, and the one after them
    drain(engine)
    assert req.finish_reason == "cache_full" and len(req.tokens) == 4  # as the batch-1 engine
    assert_no_slot_leaked(engine)


def test_build_batch_refuses_bad_sizes_before_loading():
    with pytest.raises(ConfigError, match="max-seqs"):
        build_batch(None, 0, 512)
    with pytest.raises(ConfigError, match="max-seqs"):
        build_batch(None, 65, 512)
    with pytest.raises(ConfigError, match="max-cache-len"):
        build_batch(None, 2, 16)
    with pytest.raises(ConfigError, match="--draft oracle: an oracle bound needs the request's greedy output"):
        build_batch(None, 2, 512, drafting=DraftingConfig(head="oracle"))
    with pytest.raises(ConfigError, match="--budget fixed: the batch engine ranks"):
        build_batch(None, 2, 512, drafting=DraftingConfig(proposer="suffix", budget="fixed"))
    with pytest.raises(ConfigError, match=r"--max-nodes=128 does not fit"):
        build_batch(None, 2, 512, drafting=DraftingConfig(proposer="suffix", max_nodes=128))


def test_speculative_sampling_in_a_batch_follows_the_teacher_distribution(hf_tiny):
    """800 requests, 8 at a time in one batch, each with its own seed and its own tree proposer: the 2nd and 3rd
    tokens (tree acceptance) follow the teacher's exact distribution computed with transformers."""
    from mindspore_eagle.teacher import Teacher
    from tests.test_engine_sampling import PARAMS, PROMPT, TopTokensProposer, chi_square_pvalues

    _, ms_dir, model = hf_tiny("qwen2")
    rt = RuntimeConfig(max_cache_len=BatchEngine.cache_rows(8, 24, 64), buckets=(1, 4, 16, 64), prefill_chunk=4)
    teacher = Teacher.load(ms_dir, rt)
    engine = BatchEngine(teacher, 8, 24, lambda slot, source: TopTokensProposer(model), max_queued=1000)
    reqs = [engine.submit(PROMPT, 3, sampling=SamplingParams(seed=s, **PARAMS)) for s in range(800)]
    drain(engine, limit=100000)
    samples = np.array([r.tokens for r in reqs])
    pvalues = chi_square_pvalues(samples, model, PROMPT)
    assert min(pvalues) > 1e-3, pvalues
    assert sum(r.stats.accepted for r in reqs) > 50  # drafts were accepted: acceptance, not only bonus sampling
    assert_no_slot_leaked(engine)


def test_build_batch_refuses_a_cache_larger_than_half_the_memory(monkeypatch):
    """max_seqs x max_cache_len sizes one cache; past half of the machine's memory it is refused before loading
    (the machine pretends to have 1 GiB: 8 slots x 2048 rows of the default teacher need ~0.7 GiB)."""
    from mindspore_eagle.teacher import Teacher
    from tests.helpers import default_model_or_skip

    model = default_model_or_skip()
    monkeypatch.setattr(Teacher, "load", lambda *a, **k: pytest.fail("weights were read"))
    monkeypatch.setattr("os.sysconf", lambda name: 4096 if name == "SC_PAGE_SIZE" else (1 << 30) // 4096)
    with pytest.raises(ConfigError, match=r"--max-seqs 8 x --max-cache-len 2048: the KV cache alone needs 0\.7 GiB, "
                                          r"more than half of this machine's 1\.0 GiB"):
        build_batch(model, 8, 2048)


# bf16 (~80 s on a 2-vCPU Zen 3) with the slow tests: the dense bf16 head stays in the default suite in test_greedy_head
@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_dense_weights_give_every_request_its_logits_greedy_tokens_in_a_batch(dtype, prompts, default_teacher):
    """``--weights dense`` (fp32, or bf16 compute): the batch engine's greedy tokens come from the dense head's Q8
    copy and its bound, for several requests' roots, prompt chunks and suffix-draft trees in one call; each request's
    tokens equal its batch-1 greedy tokens on the same weights taken from the logits (``np.argmax`` on the host: no
    greedy head in the reference)."""
    from mindspore_eagle.teacher import ARGMAX, LOGITS, Teacher
    from tests.helpers import default_model_or_skip, require_kernel

    require_kernel(dtype)
    model = default_model_or_skip()
    _, tok = default_teacher
    ref_teacher = Teacher.load(model, RuntimeConfig(max_cache_len=512, weights="dense", dtype=dtype,
                                                    greedy_output="logits"))
    assert ref_teacher.greedy_output == LOGITS
    ref_engine = SpeculativeEngine(ref_teacher)
    reference = [ref_engine.generate(p, 32, tok.eos_token_ids).tokens for p in prompts]
    rt = RuntimeConfig(buckets=Buckets((1, 4, 16, 64)), prefill_chunk=16, weights="dense", dtype=dtype)
    dense = build_batch(model, 4, SLOT, rt, DraftingConfig(proposer=Proposer.SUFFIX))
    teacher = dense.engine.teacher
    assert teacher.weights == "dense" and teacher.greedy_output == ARGMAX and teacher.cell.greedy_head_ready
    reqs = [dense.engine.submit(p, 32, dense.eos) for p in prompts]
    drain(dense.engine)
    for i, (req, ref) in enumerate(zip(reqs, reference)):
        assert tuple(req.tokens) == tuple(ref), i
    assert reqs[0].stats.accepted > 0  # the copy prompt's suffix drafts were verified as trees in the batch
    assert_no_slot_leaked(dense.engine)
