"""The one builder: every drafting choice gives the proposer it names, checks come before any weight is read, and
the eval header records what was built."""

import pytest

from mindspore_eagle.build import build
from mindspore_eagle.config import RuntimeConfig
from mindspore_eagle.draft import Eagle3Proposer, HybridProposer
from mindspore_eagle.draft_config import TreeBudget
from mindspore_eagle.errors import ConfigError
from mindspore_eagle.evalset import EvalItem
from mindspore_eagle.evaluate import RunConfig
from tests.helpers import make_tiny_pair

RUNTIME = RuntimeConfig(max_cache_len=96, buckets=(1, 8, 16), prefill_chunk=8)
BUDGET = TreeBudget(max_nodes=8, depth=3, top_k=4)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_tiny_pair(str(tmp_path_factory.mktemp("build_tiny")), "random")


@pytest.fixture(scope="module")
def teacher_only(pair):
    return build(pair[0], RUNTIME, speculative=False, tokenizer=False)


@pytest.mark.parametrize("proposer,mode", [("eagle", "fixed"), ("eagle", "adaptive"), ("suffix", "fixed"),
                                           ("suffix", "adaptive"), ("hybrid", "fixed"), ("hybrid", "adaptive")])
def test_each_drafting_choice_builds_the_proposer_it_names(teacher_only, pair, proposer, mode):
    stack = teacher_only.with_draft(pair[1], BUDGET, None, proposer, mode)
    made = stack.proposer_for(None)
    assert (stack.proposer, stack.budget_mode) == (proposer, mode)
    if (proposer, mode) == ("eagle", "fixed"):
        assert isinstance(made, Eagle3Proposer) and made.max_nodes == BUDGET.max_nodes
    else:
        assert isinstance(made, HybridProposer) and (made.mode, made.budget) == (proposer, mode)
        assert (made.eagle is None) == (proposer == "suffix")
        assert made.max_nodes == (BUDGET.max_nodes if mode == "fixed" else RUNTIME.buckets.largest)
    assert stack.draft_label == ("suffix" if proposer == "suffix" else pair[1])
    item = EvalItem("c", "x", turns_ids=((1, 2),))
    config = RunConfig.for_stack(stack, [item], 8)
    assert (config.proposer, config.budget_mode, config.draft_fingerprint != "") == (proposer, mode,
                                                                                    proposer != "suffix")


@pytest.mark.parametrize("calibration", ["online", "shipped"])
def test_the_suffix_calibration_choice_reaches_the_proposer_and_the_trace_header(teacher_only, pair, calibration):
    stack = teacher_only.with_draft(pair[1], BUDGET, None, "hybrid", "adaptive", calibration)
    made = stack.proposer_for(None)
    assert (made.learner is not None) == (calibration == "online")
    config = RunConfig.for_stack(stack, [EvalItem("c", "x", turns_ids=((1, 2),))], 8)
    assert config.suffix_calibration == calibration


def test_unknown_drafting_or_a_budget_no_bucket_holds_is_refused_before_loading(pair, monkeypatch):
    from mindspore_eagle import teacher

    monkeypatch.setattr(teacher.Teacher, "load", lambda *a, **k: pytest.fail("weights were read"))
    with pytest.raises(ConfigError, match="--proposer 'lookahead'"):
        build(pair[0], RUNTIME, pair[1], BUDGET, proposer="lookahead", tokenizer=False)
    with pytest.raises(ConfigError, match="--budget 'greedy'"):
        build(pair[0], RUNTIME, pair[1], BUDGET, budget_mode="greedy", tokenizer=False)
    with pytest.raises(ConfigError, match="--suffix-calibration 'learnt'"):
        build(pair[0], RUNTIME, pair[1], BUDGET, proposer="hybrid", suffix_calibration="learnt", tokenizer=False)
    with pytest.raises(ConfigError, match=r"TreeBudget.max_nodes=32 does not fit RuntimeConfig.buckets=\(1, 8, 16\)"):
        build(pair[0], RUNTIME, pair[1], TreeBudget(max_nodes=32), tokenizer=False)
    # a depth no bucket can verify (--depth 100000 died of a numpy allocation error while growing the tree)
    with pytest.raises(ConfigError, match=r"--depth \+ 1 \(the root and one node per level\)=100001 does not fit"):
        build(pair[0], RUNTIME, pair[1], TreeBudget(max_nodes=8, depth=100000, top_k=4), tokenizer=False)


def test_an_oracle_replaces_the_proposer_whatever_the_flags(teacher_only, pair):
    stack = teacher_only.with_draft("oracle", BUDGET, None, "hybrid", "adaptive")
    assert stack.proposer == "oracle" and stack.draft_label == "oracle"
