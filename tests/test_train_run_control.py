"""What decides how long a head trains and on what: the plateau stop on held-out tau, the fixed held-out
sample, and the smaller same-mix subsets of the data-scaling runs (whole conversations only)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mindspore_eagle.errors import ConfigError
from mindspore_eagle.train.sequence import Sequence_
from mindspore_eagle.train.trainer import Plateau, _first_answer_tokens, fixed_sample


def _hist(*taus):
    return [{"tau": t, "step": 50 * (i + 1)} for i, t in enumerate(taus)]


def test_plateau_stops_only_when_the_trend_of_the_last_evaluations_gains_too_little():
    rule = Plateau(patience=2, min_delta=0.01)
    assert not rule.reached(_hist(1.5, 1.6))  # too few evaluations to judge
    assert not rule.reached(_hist(1.5, 1.6, 1.7, 1.65))  # the line through the last three still gains 0.05
    assert rule.reached(_hist(1.5, 1.7, 1.705, 1.69))  # falling
    assert not rule.reached(_hist(1.5, 1.7, 1.69, 1.72))  # +0.02 across the window counts
    # a slow rise under one lucky evaluation: no new best by +0.003 in four evaluations (what stopped the shipped
    # head's run too early), but the trend gains 0.0032 > 0.003: go on
    slow = _hist(2.040, 2.046, 2.042, 2.044, 2.046, 2.048)
    assert not Plateau(4, 0.003).reached(slow)
    assert Plateau(4, 0.004).reached(slow)
    assert not Plateau(0, 0.0).reached(_hist(2.0, 1.0, 1.0, 1.0))  # patience 0: never stops
    with pytest.raises(ConfigError, match="patience"):
        Plateau(-1, 0.0)


def _s(pid, answer, prompt=3):
    return Sequence_(pid, np.zeros(prompt + answer, np.int32), prompt, np.zeros((0, 1)), np.zeros((0, 1)),
                     np.zeros((0, 1)))


def test_an_evaluation_sample_is_fixed_and_order_independent():
    seqs = [_s(f"{i:04x}", 5) for i in range(300)]
    a = fixed_sample(seqs, 40)
    b = fixed_sample(list(reversed(seqs)), 40)
    assert len(a) == 40 and [s.pid for s in a] == [s.pid for s in b]
    assert fixed_sample(seqs[:10], 40) == seqs[:10] and len(fixed_sample(seqs, 0)) == 300


def test_a_scaling_subset_is_a_prefix_of_whole_conversations_with_enough_answer_tokens():
    seqs = [_s("a", 10), _s("a-t2", 10), _s("b", 10), _s("c", 10), _s("c-t2", 10), _s("d", 10)]
    assert [s.pid for s in _first_answer_tokens(seqs, 25)] == ["a", "a-t2", "b"]
    assert [s.pid for s in _first_answer_tokens(seqs, 31)] == ["a", "a-t2", "b", "c", "c-t2"]  # c-t2 stays with c
    assert len(_first_answer_tokens(seqs, 10 ** 6)) == 6
    with pytest.raises(ConfigError, match="max-answer-tokens"):
        _first_answer_tokens(seqs, 0)


def test_a_config_file_sets_the_run_and_flags_given_override_it(tmp_path):
    """Values: TrainConfig's defaults (the recipe's), then the "train" section of --config FILE, then the flags
    typed; every shipped recipe file parses."""
    import glob
    import json

    from mindspore_eagle.train.trainer import check_train_flags

    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"_comment": "x", "data": {"prompts": "mix"},
                               "train": {"_note": "y", "lr": 2e-4, "patience": 0, "prompt_loss": False}}))
    a = check_train_flags(["--config", str(cfg), "--out", "h", "--patience", "2"])
    assert (a.lr, a.patience, a.prompt_loss, a.ttt_steps, a.eval_every) == (2e-4, 2, False, 3, 50)
    assert check_train_flags(["--config", str(cfg), "--out", "h", "--prompt-loss"]).prompt_loss is True
    for recipe, error in (({"train": {"ttt_step": 3}}, r"unknown key\(s\) \['ttt_step'\] in section 'train'"),
                          ({"lr": 2e-4}, r"unknown section\(s\) \['lr'\]"),  # the fields belong in a section
                          ({"train": [1]}, "expected a JSON object, got list"),
                          ({"train": {"lr": -1}}, "--lr -1: must be a finite number > 0")):
        cfg.write_text(json.dumps(recipe))
        with pytest.raises(ConfigError, match=error):
            check_train_flags(["--config", str(cfg), "--out", "h"])
    with pytest.raises(ConfigError, match="--out: the output head directory is required"):
        check_train_flags([])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = glob.glob(os.path.join(root, "configs", "train", "*.json"))
    assert files
    for path in files:  # a recipe without init_head starts from the head scripts/train_default_head.sh passes
        assert check_train_flags(["--config", path, "--out", "h", "--init-head", "x"]).init_head


def test_a_config_file_sets_the_data_generation_and_flags_given_override_it(tmp_path, monkeypatch):
    """The data generator reads the "data" section of the same recipe file: DataConfig's defaults, then the file,
    then the flags typed, handed to generate_dataset as they are; a key of another type or another section is
    refused in one line before any work; every shipped recipe's data section parses."""
    import glob
    import json

    import mindspore_eagle.train.data as data
    from mindspore_eagle.train.train_config import DataConfig, build_data_parser

    seen = {}

    def fake(teacher, out, num_conversations, batch_size, max_new_tokens, max_prompt_tokens, topk, **kw):
        seen.update(out=out, batch_size=batch_size, max_new_tokens=max_new_tokens, topk=topk, **kw)
        return 0

    monkeypatch.setattr(data, "generate_dataset", fake)
    cfg = tmp_path / "recipe.json"
    cfg.write_text(json.dumps({"data": {"prompts": "mix", "sharegpt_fraction": 0.5, "max_answer_tokens": 1000,
                                        "batch_size": 16, "second_turns": False}, "train": {"lr": 1e-4}}))
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    argv = ["--config", str(cfg), "--teacher", str(teacher), "--out", str(tmp_path / "d")]
    assert data.main(argv + ["--batch-size", "8", "--second-turns"]) == 0
    assert seen == {"out": str(tmp_path / "d"), "batch_size": 8, "max_new_tokens": 192, "topk": 32,
                    "time_limit_s": None, "per_category": 2500, "second_turns": True, "max_answer_tokens": 1000,
                    "prompts": "mix", "sharegpt_fraction": 0.5, "skip_ledger": None}
    for recipe, error in (({"data": {"batch_size": "128"}}, "--batch-size '128': must be an integer"),
                          ({"data": {"second_turns": 1}}, "--second-turns 1: must be true or false"),
                          ({"data": {"max_new_token": 8}}, r"unknown key\(s\) \['max_new_token'\] in section 'data'")):
        cfg.write_text(json.dumps(recipe))
        seen.clear()
        with pytest.raises(ConfigError, match=error):
            DataConfig.from_args(build_data_parser().parse_args(["--config", str(cfg)]))
        assert data.main(argv) == 2 and not seen
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for path in glob.glob(os.path.join(root, "configs", "train", "*.json")):  # bounded: tokens, or a ledger (part) here
        c = DataConfig.from_args(build_data_parser().parse_args(["--config", path]))
        assert c.max_answer_tokens or (c.from_ledger and os.path.exists(os.path.join(root, c.from_ledger))), path
