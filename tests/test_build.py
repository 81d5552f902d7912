"""The one builder: every drafting choice gives the proposer it names, its ``max_nodes`` binds in every mode, checks
come before any weight is read, and the eval header records what was built."""

import numpy as np
import pytest

from mindspore_eagle.app.build import build
from mindspore_eagle.runtime import RuntimeConfig
from mindspore_eagle.draft import Eagle3Proposer, HybridProposer
from mindspore_eagle.drafting import DraftingConfig
from mindspore_eagle.errors import ConfigError
from mindspore_eagle.evaluation.evalset import EvalItem
from mindspore_eagle.evaluation.evaluate import RunConfig
from tests.helpers import make_tiny_pair

RUNTIME = RuntimeConfig(max_cache_len=96, buckets=(1, 8, 16), prefill_chunk=8)
MODES = [("eagle", "fixed"), ("eagle", "adaptive"), ("suffix", "fixed"), ("suffix", "adaptive"), ("hybrid", "fixed"),
         ("hybrid", "adaptive")]


def drafting(head, proposer="hybrid", mode="adaptive", **kw) -> DraftingConfig:
    kw = {"max_nodes": 8, "depth": 3, "top_k": 4, **kw}
    return DraftingConfig(proposer=proposer, budget=mode, head=None if proposer == "suffix" else head, **kw)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_tiny_pair(str(tmp_path_factory.mktemp("build_tiny")), "copy")


@pytest.fixture(scope="module")
def teacher_only(pair):
    return build(pair[0], RUNTIME, None, tokenizer=False)


@pytest.mark.parametrize("proposer,mode", MODES)
def test_each_drafting_choice_builds_the_proposer_it_names(teacher_only, pair, proposer, mode):
    stack = teacher_only.with_drafting(drafting(pair[1], proposer, mode))
    made = stack.proposer_for(None)
    if (proposer, mode) == ("eagle", "fixed"):
        assert isinstance(made, Eagle3Proposer)
    else:
        assert isinstance(made, HybridProposer) and (made.mode, made.budget) == (proposer, mode)
        assert (made.eagle is None) == (proposer == "suffix")
    assert made.max_nodes == 8  # the bound, in every mode (adaptive used to get the largest bucket, 16)
    assert stack.draft_label == ("suffix" if proposer == "suffix" else pair[1])
    item = EvalItem("c", "x", turns_ids=((1, 2),))
    config = RunConfig.for_stack(stack, [item], 8)
    assert (config.proposer, config.budget_mode, config.max_nodes, config.draft_fingerprint != "") == (
        proposer, mode, 8, proposer != "suffix")


# the fixed budgets of eagle and hybrid (~17 s on a 2-vCPU Zen 3) run with the slow tests: the bound binds in the
# same code for every budget, and the adaptive ones (which want the largest bucket) stay in the default suite
@pytest.mark.parametrize("proposer,mode", [pytest.param(p, m, marks=pytest.mark.slow) if m == "fixed" and p != "suffix"
                                           else (p, m) for p, m in MODES])
def test_no_step_verifies_more_nodes_than_max_nodes_on_repetitive_multi_turn_prompts(teacher_only, pair, proposer,
                                                                                      mode):
    """A repetitive conversation is where suffix chains grow long and the adaptive rule wants its largest bucket;
    with ``max_nodes`` 5 no step may verify more than 5 nodes, and the tokens stay the teacher's greedy ones."""
    stack = teacher_only.with_drafting(drafting(pair[1], proposer, mode, max_nodes=5))
    made = stack.proposer_for(None)
    engine = stack.engine
    rng = np.random.default_rng(0)
    phrase = [int(t) for t in rng.integers(3, 100, 6)]
    conversation = phrase * 3
    for turn in range(3):  # each turn repeats the conversation so far: long suffix matches
        prompt = conversation + [int(t) for t in rng.integers(3, 100, 2)] + phrase
        want = engine.generate(prompt, 10).tokens
        got = engine.generate(prompt, 10, proposer=made)
        assert list(got.tokens) == list(want)
        nodes = [s.tree_nodes for s in got.steps]
        assert max(nodes) <= 5, (turn, nodes)
        conversation = prompt + list(got.tokens)
    assert max(nodes) > 1  # it drafted: the bound is what held it


@pytest.mark.parametrize("calibration", ["online", "shipped"])
def test_the_suffix_calibration_choice_reaches_the_proposer_and_the_trace_header(teacher_only, pair, calibration):
    stack = teacher_only.with_drafting(drafting(pair[1], suffix_calibration=calibration))
    made = stack.proposer_for(None)
    assert (made.learner is not None) == (calibration == "online")
    config = RunConfig.for_stack(stack, [EvalItem("c", "x", turns_ids=((1, 2),))], 8)
    assert config.suffix_calibration == calibration


@pytest.mark.parametrize("kwargs,message", [
    ({"proposer": "lookahead"}, r"DraftingConfig.proposer='lookahead' \(--proposer\): expected one of"),
    ({"budget": "greedy"}, r"DraftingConfig.budget='greedy' \(--budget\)"),
    ({"suffix_calibration": "learnt"}, r"DraftingConfig.suffix_calibration='learnt' \(--suffix-calibration\)"),
    ({"max_nodes": 0}, r"DraftingConfig.max_nodes=0 \(--max-nodes\): must be an integer >= 1"),
    ({"top_k": True}, r"DraftingConfig.top_k=True \(--top-k\)"),
    ({"proposer": "suffix", "head": "some/head"}, "proposer 'suffix' uses no head"),
    ({"proposer": "eagle", "suffix_calibration": "online"}, "proposer 'eagle' has no suffix source to calibrate"),
])
def test_a_drafting_config_is_validated_where_it_is_made(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DraftingConfig(**kwargs)


def test_yaml_keys_map_to_the_fields_and_an_unknown_key_is_refused():
    d = DraftingConfig.from_mapping({"proposer": "suffix", "max_nodes": 12})
    assert (d.proposer.value, d.max_nodes, d.budget.value) == ("suffix", 12, "adaptive")
    assert DraftingConfig.from_mapping(d.to_dict()) == d
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['window'\]"):
        DraftingConfig.from_mapping({"window": 4})


def test_a_request_may_lower_the_bound_never_raise_it():
    d = DraftingConfig(max_nodes=16)
    assert d.bounded(4).max_nodes == 4 and d.bounded(64).max_nodes == 16 and d.bounded(None) is d


def test_a_bound_or_depth_no_bucket_holds_is_refused_before_loading(pair, monkeypatch):
    from mindspore_eagle import teacher

    monkeypatch.setattr(teacher.Teacher, "load", lambda *a, **k: pytest.fail("weights were read"))
    with pytest.raises(ConfigError, match=r"--max-nodes=32 does not fit RuntimeConfig.buckets=\(1, 8, 16\)"):
        build(pair[0], RUNTIME, drafting(pair[1], max_nodes=32), tokenizer=False)
    # a depth no bucket can verify (--depth 100000 died of a numpy allocation error while growing the tree)
    with pytest.raises(ConfigError, match=r"--depth \+ 1 \(the root and one node per level\)=100001 does not fit"):
        build(pair[0], RUNTIME, drafting(pair[1], depth=100000), tokenizer=False)


def test_an_ascend_plan_whose_bound_exceeds_the_query_token_limit_is_refused_when_built(pair, monkeypatch):
    """The fused attention op takes at most ``max_query_tokens`` query tokens a round: a bound above it is refused
    by ``build`` before any weight is read and before an NPU is even looked for (this machine has none)."""
    from mindspore_eagle import deploy, teacher
    from mindspore_eagle.deploy import AscendDeployment

    monkeypatch.setattr(teacher.Teacher, "load", lambda *a, **k: pytest.fail("weights were read"))
    monkeypatch.setattr(deploy, "require_ascend", lambda: pytest.fail("the device was probed first"))
    ascend = RuntimeConfig(max_cache_len=96, buckets=(1, 8, 16, 32), prefill_chunk=8, device="Ascend")
    with pytest.raises(ConfigError, match=r"--max-nodes 32 \(the nodes one step verifies\) exceeds max_query_tokens"
                                          r"=16"):
        build(pair[0], ascend, drafting(pair[1], max_nodes=32), deployment=AscendDeployment(), tokenizer=False)


def test_an_oracle_replaces_the_proposer_whatever_the_flags(teacher_only, pair):
    stack = teacher_only.with_drafting(DraftingConfig(proposer="hybrid", budget="adaptive", head="oracle", depth=3))
    assert stack.draft_label == "oracle"
    config = RunConfig.for_stack(stack, [EvalItem("c", "x", turns_ids=((1, 2),))], 8)
    assert (config.proposer, config.budget_mode) == ("oracle", "fixed")
