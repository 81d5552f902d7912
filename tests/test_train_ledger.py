"""The answer ledger (``train.ledger``, ``train.rebuild``, issue 33): a data directory's answers exported to a ledger
of part files and rebuilt into shards that equal the generator's bit for bit (tokens, prompt lengths, features, top-k
ids and logits), on the tiny teacher with a character-level tokenizer and a prompt set mixing the synthetic set with
ShareGPT-shaped records written here (nothing of the real file). Also: the ledger holds exactly the answer ids (no
prompt id), two sessions' exports union into one ledger, a rebuild resumes past the conversations its directory
holds, another teacher's ledger is refused before any work unless retargeted to a re-conversion whose greedy
answers it still holds (every answer token checked), and a torn part, a part whose answers contradict
another's and an export into a ledger of other settings are refused by name."""

from __future__ import annotations

import json
import os
import shutil
import string

import numpy as np
import pytest

from mindspore_eagle.errors import DataError, IdentityError
from mindspore_eagle.train import ledger as ledger_mod
from mindspore_eagle.train.ledger import Entry, export_ledger, part_paths, read_ledger, read_part, write_part
from mindspore_eagle.train.data import finished_conversations
from mindspore_eagle.train.rebuild import MAX_MISMATCHED, rebuild_from_ledger

NEW = 8  # max_new_tokens
PROMPT = 150  # max_prompt_tokens: with NEW and the generator's 64 follow-up rows the caches fit the 256 positions
TOPK = 8
FIRST, ALL = 6, 12  # conversations asked for by the first session, and by both (a few are left out: too long)

SHAREGPT = [  # ShareGPT-shaped records written for this test: short user turns (the tokenizer spells characters)
    {"id": "a_0", "conversations": [{"from": "human", "value": "How do I keep basil alive in winter?"},
                                    {"from": "gpt", "value": "RECORDED"},
                                    {"from": "human", "value": "And mint?"}]},
    {"id": "b_0", "conversations": [{"from": "human", "value": "Name three grey kittens."}]},
    {"id": "c_0", "conversations": [{"from": "human", "value": "What is a hash map? Short."},
                                    {"from": "gpt", "value": "RECORDED"},
                                    {"from": "human", "value": "Now in Go."}]},
    {"id": "d_0", "conversations": [{"from": "human", "value": "Why is the sky blue at noon?"}]},
    {"id": "e_0", "conversations": [{"from": "human", "value": "Give me a pun about bread."}]},
    {"id": "f_0", "conversations": [{"from": "human", "value": "Sort 5, 2, 9 for me please."},
                                    {"from": "gpt", "value": "RECORDED"},
                                    {"from": "human", "value": "Descending now."}]},
]


def write_char_tokenizer(model_dir: str, vocab_size: int) -> None:
    """A character-level byte-free BPE (``tokenizers``) of exactly ``vocab_size`` ids: ChatML's special tokens, then
    printable ASCII characters; ChatML is the tokenizer's fallback chat format (its vocabulary has ``<|im_start|>``)."""
    from tokenizers import Tokenizer, decoders, models

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {t: i for i, t in enumerate((specials + chars)[:vocab_size])}
    assert len(vocab) == vocab_size
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials)
    tok.save(os.path.join(model_dir, "tokenizer.json"))
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "add_bos_token": False}, f)  # <|endoftext|> ends a turn as well


@pytest.fixture(scope="module")
def teacher_dir(tiny_taps_dir, tmp_path_factory):
    """The tiny teacher with a character tokenizer (a tokenizer is what the prompt sources need)."""
    out = tmp_path_factory.mktemp("ledger") / "teacher"
    shutil.copytree(tiny_taps_dir, out)
    write_char_tokenizer(str(out), json.loads((out / "config.json").read_text())["vocab_size"])
    return str(out)


@pytest.fixture(scope="module")
def sharegpt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("sharegpt") / "sharegpt.json"
    path.write_text(json.dumps(SHAREGPT))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("mindspore_eagle.train.sharegpt.find_dataset_file", lambda: str(path))
        yield str(path)


def generate(teacher: str, out: str, n: int, **kw) -> None:
    from mindspore_eagle.train.data import generate_dataset

    generate_dataset(teacher, out, n, batch_size=4, max_new_tokens=NEW, max_prompt_tokens=PROMPT, topk=TOPK,
                     per_category=2, prompts="mix", sharegpt_fraction=0.5, **kw)


@pytest.fixture(scope="module")
def sessions(teacher_dir, sharegpt_file, tmp_path_factory):
    """Two sessions on one data directory: the first generates FIRST conversations and exports them (its ledger
    copied aside as ``first``), the second generates up to ALL and exports again (``both``: two parts)."""
    root = tmp_path_factory.mktemp("sessions")
    data, book, first = str(root / "data"), str(root / "ledger"), str(root / "ledger-first")
    generate(teacher_dir, data, FIRST)
    r1 = export_ledger(data, book)
    shutil.copytree(book, first)
    generate(teacher_dir, data, ALL)
    r2 = export_ledger(data, book)
    assert r1.conversations >= 3 and r2.conversations >= 3
    return data, book, first, r1, r2


def counts(sessions) -> tuple[int, int]:
    """Conversations of the first session, and of both."""
    r1, r2 = sessions[3:]
    return r1.conversations, r1.conversations + r2.conversations


def by_pid(out: str) -> dict:
    from mindspore_eagle.train.data import load_sequences

    return {s.pid: s for s in load_sequences(out)}


def shard_fields(out: str) -> dict:
    """pid -> (start, turn, category) as the shards store them."""
    from mindspore_eagle.train.data import read_manifest

    got = {}
    for rec in read_manifest(out):
        with np.load(os.path.join(out, rec["shard"])) as z:
            for pid, s, t, c in zip(z["ids"], z["starts"], z["turns"], z["categories"]):
                got[str(pid)] = (int(s), int(t), str(c))
    return got


def assert_same_data(rebuilt: str, original: str) -> None:
    a, b = by_pid(rebuilt), by_pid(original)
    assert sorted(a) == sorted(b)
    for pid, s in b.items():
        r = a[pid]
        assert r.prompt_len == s.prompt_len, pid
        for name in ("tokens", "features", "topk_ids", "topk_logits"):
            x, y = getattr(r, name), getattr(s, name)
            assert x.dtype == y.dtype and np.array_equal(x, y), (pid, name)  # bit for bit, no tolerance
    assert shard_fields(rebuilt) == shard_fields(original)


def test_the_data_covers_both_sources_second_turns_and_early_eos(sessions):
    data, *_ = sessions
    seqs = by_pid(data)
    assert {ledger_mod.source_of(p) for p in seqs} == {"synthetic", "sharegpt"}
    assert any("-t2" in p for p in seqs if p.startswith("sg-")) and any("-t2" in p for p in seqs if "sg-" not in p)
    answers = [len(s.tokens) - s.prompt_len for s in seqs.values()]
    assert min(answers) < NEW == max(answers), "some answers end on EOS, some at max_new_tokens"


def test_a_ledger_rebuilds_the_generated_shards_bit_for_bit(sessions, teacher_dir, tmp_path):
    data, book, *_ = sessions
    out = str(tmp_path / "rebuilt")
    stats = rebuild_from_ledger(book, teacher_dir, out, chunk=16)
    assert stats.conversations == counts(sessions)[1] and stats.skipped == 0
    assert_same_data(out, data)
    with open(os.path.join(out, "identity.json")) as f, open(os.path.join(data, "identity.json")) as g:
        assert json.load(f) == json.load(g)  # the generator may go on adding to the rebuilt directory


@pytest.mark.slow  # a ledger rebuild
def test_a_recipe_naming_a_ledger_rebuilds_it_through_the_data_command(sessions, teacher_dir, tmp_path, capsys):
    """``python -m mindspore_eagle.train.data --from-ledger`` (a recipe's ``"data": {"from_ledger": ...}``, what
    ``scripts/train_default_head.sh data`` runs) writes the generator's shards; a generation setting beside it is
    refused by name before anything is written."""
    from mindspore_eagle.train.data import main as data_main

    data, book, *_ = sessions
    out = str(tmp_path / "from-ledger")
    assert data_main(["--from-ledger", book, "--teacher", teacher_dir, "--out", out]) == 0
    assert_same_data(out, data)
    refused = str(tmp_path / "refused")
    assert data_main(["--from-ledger", book, "--teacher", teacher_dir, "--out", refused, "--prompts", "mix",
                      "--topk", "4"]) == 2
    err = capsys.readouterr().err
    assert "--prompts, --topk cannot apply" in err and not os.path.exists(refused)


def test_the_ledger_holds_the_answer_ids_and_nothing_of_the_prompts(sessions):
    from mindspore_eagle.train.data import stored_answer_tokens
    from mindspore_eagle.train.identity import read_identity

    data, book, *_ = sessions
    ledger = read_ledger(book)
    assert ledger.identity == read_identity(data)
    ids = 0
    for part in part_paths(book):
        with np.load(part) as z:
            assert sorted(z.files) == sorted(["header", "ids", "sources", "turns", "answer_lens", "answers"])
            assert z["answers"].dtype == np.uint16  # the only token ids; the rest are counts and names
            ids += z["answers"].size
    assert ids == ledger.answer_tokens == stored_answer_tokens(data)
    seqs = by_pid(data)
    for cid, entry in ledger.entries.items():
        for k, answer in enumerate(entry.answers):
            s = seqs[cid if k == 0 else f"{cid}-t{k + 1}"]
            assert np.array_equal(answer, s.tokens[s.prompt_len:])


def test_two_sessions_exports_are_two_parts_whose_union_is_the_data(sessions):
    data, book, first, r1, r2 = sessions
    n1, n = counts(sessions)
    assert r1.known == 0 and r2.known == n1  # the second export writes only the second session's conversations
    assert len(part_paths(book)) == 2 and len(part_paths(first)) == 1
    assert len(read_ledger(book).entries) == n == len({p.split("-t")[0] for p in by_pid(data)})
    again = export_ledger(data, book)
    assert again.part is None and again.known == n and len(part_paths(book)) == 2


@pytest.mark.slow  # a ledger rebuild
def test_a_rebuild_resumes_past_the_conversations_its_directory_holds(sessions, teacher_dir, tmp_path, capsys):
    data, book, first, *_ = sessions
    n1, n = counts(sessions)
    out = str(tmp_path / "resumed")
    assert rebuild_from_ledger(first, teacher_dir, out, chunk=16).conversations == n1
    with open(os.path.join(out, "manifest.jsonl")) as f:
        before = f.read()
    stats = rebuild_from_ledger(book, teacher_dir, out, chunk=16)
    assert (stats.conversations, stats.skipped) == (n - n1, n1)
    with open(os.path.join(out, "manifest.jsonl")) as f:
        assert f.read().startswith(before)  # the first conversations' shards and records untouched
    assert_same_data(out, data)
    again = rebuild_from_ledger(book, teacher_dir, out)
    assert (again.conversations, again.skipped) == (0, n)
    assert "already holds all" in capsys.readouterr().err


@pytest.mark.slow  # a ledger rebuild
def test_a_fresh_directory_skipping_the_ledger_generates_only_the_rest_and_exports_as_a_new_part(
        sessions, teacher_dir, tmp_path, capsys):
    """The session workflow without a rebuild: a new directory given the first session's ledger answers only the
    conversations that ledger lacks, exactly as the one directory of both sessions answered them, and its export
    makes the first ledger equal the two-session one."""
    data, book, first, *_ = sessions
    n1, n = counts(sessions)
    cont = str(tmp_path / "continued")
    generate(teacher_dir, cont, ALL, skip_ledger=first)
    assert f"{n1} conversations left out: answered in ledger" in capsys.readouterr().err
    got, original = by_pid(cont), by_pid(data)
    assert {p.split("-t")[0] for p in got} == set(read_ledger(book).entries) - set(read_ledger(first).entries)
    for pid, s in got.items():
        for name in ("tokens", "features", "topk_ids", "topk_logits"):
            assert np.array_equal(getattr(s, name), getattr(original[pid], name)), (pid, name)
    ledger = tmp_path / "ledger"
    shutil.copytree(first, ledger)
    r = export_ledger(cont, str(ledger))
    assert (r.conversations, r.known) == (n - n1, 0) and len(part_paths(str(ledger))) == 2
    both, union = read_ledger(book).entries, read_ledger(str(ledger)).entries
    assert sorted(union) == sorted(both)
    assert all(len(union[c].answers) == len(both[c].answers) and
               all(np.array_equal(a, b) for a, b in zip(union[c].answers, both[c].answers)) for c in both)


def test_skipping_a_ledger_of_another_conversion_of_the_teacher_leaves_its_conversations_out_with_a_warning(
        sessions, capsys):
    from mindspore_eagle.train.data import ledger_conversations
    from mindspore_eagle.train.identity import read_identity

    data, _, first, *_ = sessions
    mine = dict(read_identity(data), teacher="sha256:" + "0" * 64)
    assert ledger_conversations(first, mine) == set(read_ledger(first).entries)
    assert "--retarget" in capsys.readouterr().err
    with pytest.raises(IdentityError, match="topk: 8 -> 9"):
        ledger_conversations(first, dict(mine, topk=TOPK + 1))


def test_skipping_a_ledger_of_other_settings_is_refused_before_anything_is_written(sessions, teacher_dir, tmp_path):
    _, book, *_ = sessions
    header, entries = read_part(part_paths(book)[0])
    other = str(tmp_path / "other-ledger")
    write_part(other, dict(header["identity"], topk=TOPK + 1), entries)
    out = tmp_path / "out"
    with pytest.raises(IdentityError, match="--skip-ledger .*topk: 9 -> 8"):
        generate(teacher_dir, str(out), ALL, skip_ledger=other)
    assert not out.exists()


def test_another_teachers_ledger_is_refused_before_any_work(sessions, teacher_dir, tmp_path, monkeypatch):
    _, book, *_ = sessions
    other = tmp_path / "other"
    shutil.copytree(teacher_dir, other)
    weights = max((p for p in other.iterdir() if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(weights.read_bytes())
    data[-4] ^= 0x01  # the lowest mantissa bit of one weight
    weights.write_bytes(bytes(data))

    def no_load(*a, **k):
        raise AssertionError("the teacher was loaded")

    monkeypatch.setattr("mindspore_eagle.teacher.Teacher.load", no_load)
    out = tmp_path / "out"
    with pytest.raises(IdentityError, match="holds the answers of teacher sha256:"):
        rebuild_from_ledger(book, str(other), str(out))
    assert not out.exists()
    assert ledger_mod.main(["rebuild", "--ledger", book, "--teacher", str(other), "--out", str(out)]) == 2


def reconverted(teacher_dir: str, where) -> str:
    """The same teacher with one more file, as a later converter's output differs from an earlier one's (the
    default teacher gained quantized.safetensors): another content fingerprint, the same function."""
    out = where / "reconverted"
    shutil.copytree(teacher_dir, out)
    (out / "extra.json").write_text('{"written by": "a later converter"}')
    return str(out)


@pytest.mark.slow  # a ledger rebuild
def test_a_ledger_retargets_to_a_reconversion_whose_greedy_answers_it_still_holds(sessions, teacher_dir, tmp_path):
    from mindspore_eagle.storage.fingerprint import directory_fingerprint
    from mindspore_eagle.train.identity import read_identity

    data, book, *_ = sessions
    other = reconverted(teacher_dir, tmp_path)
    out = tmp_path / "out"
    with pytest.raises(IdentityError, match="--retarget"):
        rebuild_from_ledger(book, other, str(out), chunk=16)
    assert not out.exists()
    stats = rebuild_from_ledger(book, other, str(out), chunk=16, retarget=True)
    assert stats.conversations == counts(sessions)[1]
    assert_same_data(str(out), data)  # the same function: the same features, bit for bit
    identity = read_identity(str(out))
    assert identity == dict(read_identity(data), teacher=directory_fingerprint(other))
    moved = tmp_path / "ledger"
    assert export_ledger(str(out), str(moved)).conversations == counts(sessions)[1]
    assert read_ledger(str(moved)).identity["teacher"] == directory_fingerprint(other)


def forge(book: str, where, n: int):
    """A copy of ledger ``book`` (one part) whose first ``n`` conversations have answer token 2 of their first turn
    changed (a printable character; the token after it, EOS or not, stays: still shaped as a generated answer);
    returns (path, forged ids)."""
    whole = read_ledger(book)
    long = [c for c, e in whole.entries.items() if len(e.answers[0]) > 3]
    assert len(long) >= n, len(long)
    out = dict(whole.entries)
    for cid in long[:n]:
        answer = whole.entries[cid].answers[0].copy()
        answer[2] = 10 if answer[2] != 10 else 11
        out[cid] = Entry(whole.entries[cid].source, (answer,) + whole.entries[cid].answers[1:])
    path = where / f"forged-{n}"
    write_part(str(path), whole.identity, out)
    return str(path), long[:n]


def test_an_answer_that_is_not_the_teachers_greedy_choice_is_refused(sessions, teacher_dir, tmp_path):
    _, book, *_ = sessions
    forged, (cid,) = forge(book, tmp_path, 1)
    with pytest.raises(DataError, match=f"ledger conversation {cid} turn 1: answer token 2 is "):
        rebuild_from_ledger(forged, teacher_dir, str(tmp_path / "out"), chunk=16)


@pytest.mark.slow  # a ledger rebuild
def test_a_recipe_retargets_its_ledger_to_a_reconversion_only_when_it_says_so(sessions, teacher_dir, tmp_path, capsys):
    """A recipe's ``"data": {"from_ledger": ..., "retarget": true}`` (``--retarget``) rebuilds a ledger written by
    another conversion of its teacher, the same features, recording this teacher; without it the data command refuses
    and names the flag, before anything is written; ``--retarget`` without a ledger is refused by name."""
    from mindspore_eagle.storage.fingerprint import directory_fingerprint
    from mindspore_eagle.train.data import main as data_main
    from mindspore_eagle.train.identity import read_identity

    data, book, *_ = sessions
    other = reconverted(teacher_dir, tmp_path)
    refused = tmp_path / "refused"
    assert data_main(["--from-ledger", book, "--teacher", other, "--out", str(refused)]) == 2
    assert "--retarget" in capsys.readouterr().err and not refused.exists()
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"data": {"from_ledger": book, "retarget": True}}))
    out = tmp_path / "out"
    assert data_main(["--config", str(recipe), "--teacher", other, "--out", str(out)]) == 0
    assert_same_data(str(out), data)
    assert read_identity(str(out))["teacher"] == directory_fingerprint(other)
    assert data_main(["--teacher", teacher_dir, "--out", str(tmp_path / "gen"), "--retarget"]) == 2
    assert "--retarget applies to a rebuild from a ledger" in capsys.readouterr().err


@pytest.mark.slow  # a ledger rebuild
def test_a_retargeted_rebuild_leaves_out_and_names_a_conversation_another_arithmetic_answered(sessions, teacher_dir,
                                                                                               tmp_path, capsys):
    """A re-conversion computed otherwise flips a greedy token where two logits nearly tie: that conversation is no
    longer this teacher's answer, so it is left out and named; the others are rebuilt."""
    _, book, *_ = sessions
    forged, (cid,) = forge(book, tmp_path, 1)
    stats = rebuild_from_ledger(forged, reconverted(teacher_dir, tmp_path), str(tmp_path / "out"), chunk=16,
                                retarget=True)
    assert stats.mismatched == (cid,)
    assert stats.conversations == len(read_ledger(forged).entries) - 1
    assert cid not in finished_conversations(str(tmp_path / "out"))
    assert f"left out: ledger conversation {cid} turn 1: answer token 2 is " in capsys.readouterr().err


def test_a_retargeted_rebuild_whose_answers_are_not_the_teachers_stops(sessions, teacher_dir, tmp_path):
    _, book, *_ = sessions
    forged, _ = forge(book, tmp_path, MAX_MISMATCHED + 1)
    with pytest.raises(DataError, match="not a re-conversion of the teacher that wrote the ledger"):
        rebuild_from_ledger(forged, reconverted(teacher_dir, tmp_path), str(tmp_path / "out"), chunk=16,
                            retarget=True)


def test_a_torn_part_is_refused_by_name_and_a_stray_temporary_ignored(sessions, tmp_path, capsys):
    _, book, *_ = sessions
    copy = tmp_path / "ledger"
    shutil.copytree(book, copy)
    (copy / ".part-0123.npz.abcd.tmp").write_bytes(b"half a part")  # an export killed before its rename
    assert len(read_ledger(str(copy)).entries) == counts(sessions)[1]
    assert "unfinished ledger write" in capsys.readouterr().err
    part = part_paths(str(copy))[0]
    whole = open(part, "rb").read()
    for damaged in (whole[:len(whole) // 2], whole[:-30]):  # cut in the middle, or its zip directory cut off
        with open(part, "wb") as f:
            f.write(damaged)
        with pytest.raises(DataError, match=f"{os.path.basename(part)}: not a whole ledger part"):
            read_ledger(str(copy))
    with pytest.raises(DataError, match="not a whole ledger part"):
        rebuild_from_ledger(str(copy), "/nonexistent", str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_part_whose_arrays_do_not_match_its_checksum_is_refused(sessions, tmp_path):
    _, book, *_ = sessions
    header, entries = read_part(part_paths(book)[0])
    path = write_part(str(tmp_path), header["identity"], entries)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["answers"] = arrays["answers"].copy()
    arrays["answers"][0] ^= 1  # one answer id changed, the header kept
    np.savez_compressed(path, **arrays)
    with pytest.raises(DataError, match="do not match the header's checksum"):
        read_part(path)


def test_a_conversation_with_other_answers_in_another_part_is_refused(sessions, tmp_path):
    _, book, *_ = sessions
    header, entries = read_part(part_paths(book)[0])
    cid, entry = next(iter(entries.items()))
    changed = Entry(entry.source, (entry.answers[0][::-1].copy(),) + entry.answers[1:])
    copy = tmp_path / "ledger"
    shutil.copytree(book, copy)
    write_part(str(copy), header["identity"], {cid: changed})
    with pytest.raises(DataError, match=f"conversation {cid} has different answers in"):
        read_ledger(str(copy))


def test_an_export_into_a_ledger_of_other_settings_is_refused(sessions, tmp_path):
    data, book, *_ = sessions
    header, entries = read_part(part_paths(book)[0])
    other = dict(header["identity"], topk=TOPK + 1)
    write_part(str(tmp_path / "ledger"), other, entries)
    with pytest.raises(IdentityError, match="topk: 9 -> 8"):
        export_ledger(data, str(tmp_path / "ledger"))
    assert len(part_paths(str(tmp_path / "ledger"))) == 1


def test_data_whose_prompts_were_given_as_ids_cannot_be_exported(teacher_dir, tmp_path):
    from mindspore_eagle.evaluation.evalset import EvalItem
    from mindspore_eagle.train.data import run_generation

    out = str(tmp_path / "ids")
    run_generation(teacher_dir, out, [EvalItem("c0", "test", turns_ids=((5, 6, 7),))], None, 2, 4, TOPK, None, 16,
                   (16, 24))
    with pytest.raises(DataError, match="records no prompt set"):
        export_ledger(out, str(tmp_path / "ledger"))
