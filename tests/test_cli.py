"""The command-line tools answer with real output, and with a one-line typed error (exit 2) on bad input."""

import subprocess
import sys

import pytest

from mindspore_eagle.app import cli
from tests.helpers import default_model_or_skip


@pytest.mark.slow  # generate end to end stays in the default suite through its compile-plan test
def test_generate_prints_the_answer_and_speed(capsys):
    model = default_model_or_skip()
    code = cli.main(["generate", "--mode", "greedy", "--model", model, "--prompt", "What is the capital of France?",
                     "--max-new-tokens", "8", "--exec", "reference", "--no-warmup", "--max-cache-len", "128"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "Paris" in out
    assert "tok/s" in err and "time to first token" in err


def test_generate_compiles_its_plan_before_the_request_and_says_how(capsys):
    model = default_model_or_skip()
    code = cli.main(["generate", "--mode", "greedy", "--model", model, "--prompt", "What is the capital of France?",
                     "--max-new-tokens", "8", "--buckets", "1,8", "--prefill-chunk", "8", "--max-cache-len", "128",
                     "--no-compile-cache"])
    out, err = capsys.readouterr()
    assert code == 0 and "Paris" in out
    assert "[2 graphs compiled in" in err, err  # the teacher's forward at each bucket (tests/test_graph_cache.py: cached)


def test_generate_reports_a_prompt_longer_than_the_cache(capsys):
    model = default_model_or_skip()
    code = cli.main(["generate", "--mode", "greedy", "--model", model, "--prompt", "word " * 200, "--exec", "reference",
                     "--max-cache-len", "64", "--no-warmup"])
    _, err = capsys.readouterr()
    assert code == 2 and "CacheCapacityError" in err and "does not fit the cache" in err


def test_converter_cli_fails_cleanly_on_a_missing_file(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ckpt_convert", "gguf", str(tmp_path / "nope.gguf"),
                           str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "CheckpointError" in proc.stderr and "nope.gguf" in proc.stderr
    assert not (tmp_path / "out").exists()


# ----- bad arguments are refused before anything loads (issue 14, item 8) ---------------------------------------
# The model path below does not exist: each of these errors must come first, before any model is read.
NOWHERE = "/nonexistent/model"


def run_cli(*argv):
    proc = subprocess.run([sys.executable, "-m", "mindspore_eagle.app.cli", *argv], capture_output=True, timeout=120)
    return proc.returncode, proc.stderr.decode("utf-8", "replace")


def test_a_token_limit_below_one_is_refused_before_loading(capsys):
    for cmd in (["generate", "--prompt", "hi"], ["bench"]):
        assert cli.main([*cmd, "--model", NOWHERE, "--max-new-tokens", "0"]) == 2
        err = capsys.readouterr().err
        assert "--max-new-tokens 0: must be >= 1" in err and NOWHERE not in err


def test_serve_refuses_a_bad_port_or_shutdown_timeout_before_loading(capsys):
    for flag, value, needle in (("--port", "0", "--port 0: must be in 1..65535"),
                                ("--shutdown-timeout", "-1", "--shutdown-timeout -1.0: must be in 0..3600 seconds")):
        assert cli.main(["serve", "--model", NOWHERE, flag, value]) == 2
        err = capsys.readouterr().err
        assert needle in err and NOWHERE not in err


def test_an_output_file_in_a_missing_directory_is_refused_before_generating(tmp_path, capsys):
    trace = tmp_path / "no" / "such" / "dir" / "steps.jsonl"
    assert cli.main(["generate", "--prompt", "hi", "--model", NOWHERE, "--trace", str(trace)]) == 2
    err = capsys.readouterr().err
    assert f"directory {trace.parent} does not exist" in err and NOWHERE not in err
    assert cli.main(["report", str(tmp_path), "--json", str(tmp_path / "nope" / "r.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_prompt_files_that_are_missing_or_not_utf8_are_refused_before_loading(tmp_path, capsys):
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes('{"prompt": "caf\u00e9"}\n'.encode("latin-1"))
    for path, needle in ((tmp_path / "missing.jsonl", "cannot read"), (latin, "not UTF-8 (byte 0xe9")):
        assert cli.main(["bench", "--prompts", str(path), "--model", NOWHERE]) == 2
        err = capsys.readouterr().err
        assert needle in err and NOWHERE not in err


def test_an_empty_prompt_is_a_typed_error_before_loading(tmp_path, capsys):
    """``generate --raw --prompt ""`` and an eval set whose first turn has no ids crashed the warm-up with a
    ZeroDivisionError (and eval left an empty shard file); both are refused before the model is read."""
    assert cli.main(["generate", "--raw", "--prompt", "", "--model", NOWHERE]) == 2
    err = capsys.readouterr().err
    assert "ConfigError" in err and "empty prompt" in err and NOWHERE not in err
    eval_set = tmp_path / "set.jsonl"
    eval_set.write_text('{"id": "a", "turns_ids": [[]]}\n')
    out = tmp_path / "out"
    assert cli.main(["eval", "--eval-set", str(eval_set), "--out", str(out), "--model", NOWHERE]) == 2
    err = capsys.readouterr().err
    assert "ConfigError" in err and "turns_ids[0] is empty" in err and NOWHERE not in err
    assert not out.exists()


def test_an_argument_that_is_not_utf8_is_named():
    code, err = run_cli("generate", "--model", NOWHERE, "--prompt", b"caf\xe9".decode("utf-8", "surrogateescape"))
    assert code == 2 and "--prompt: not valid UTF-8 (byte 0xe9 at character 3)" in err


def test_a_cache_longer_than_the_models_positions_is_refused_before_allocating(capsys):
    model = default_model_or_skip()
    assert cli.main(["generate", "--mode", "greedy", "--model", model, "--prompt", "hi",
                     "--max-cache-len", "1000000000"]) == 2
    assert "exceeds the model's max_position_embeddings" in capsys.readouterr().err


def test_train_draft_errors_are_typed_exit_2(tmp_path, capsys):
    assert cli.main(["train-draft", "--teacher", NOWHERE, "--out", str(tmp_path / "head")]) == 2
    assert "error: " in capsys.readouterr().err


def test_bad_context_buckets_are_refused_before_loading(capsys):
    for value, match in (("64,x", "--context-buckets='64,x': expected comma-separated integers"),
                         ("64,2048", "[2048] outside [1, max_cache_len=1024]")):
        assert cli.main(["generate", "--prompt", "hi", "--model", NOWHERE, "--context-buckets", value]) == 2
        err = capsys.readouterr().err
        assert match in err and NOWHERE not in err


def test_greedy_output_flag_reaches_the_runtime():
    parser = cli.build_parser()
    args = parser.parse_args(["generate", "--prompt", "hi"])
    assert cli._runtime(args).greedy_kind == "logits"  # CPU default: the host reduces
    args = parser.parse_args(["generate", "--prompt", "hi", "--greedy-output", "argmax"])
    assert cli._runtime(args).greedy_kind == "argmax"


def test_a_prompt_longer_than_the_cache_is_refused_before_the_teacher_loads(capsys, monkeypatch):
    """Only the tokenizer is read: the refusal came after a 107 s warm-up compile before (issue 34)."""
    import mindspore_eagle.app.build as build_module

    def no_build(*a, **k):
        raise AssertionError("the teacher was built before the prompt was checked")

    monkeypatch.setattr(build_module, "build", no_build)
    model = default_model_or_skip()
    code = cli.main(["generate", "--model", model, "--prompt", "word " * 600, "--max-cache-len", "256"])
    _, err = capsys.readouterr()
    assert code == 2 and "CacheCapacityError" in err and "does not fit the cache" in err


def test_an_output_path_that_cannot_be_written_is_one_line_not_a_traceback(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, err = run_cli("report", str(tmp_path), "--json", str(blocker / "r.json"))
    assert code == 2
    assert "Traceback" not in err and err.count("\n") <= 1 and "error:" in err
    model = default_model_or_skip()
    code, err = run_cli("eval", "--model", model, "--out", str(blocker / "out"), "--limit", "1", "--no-plots")
    assert code == 2 and "Traceback" not in err
    assert "NotADirectoryError" in err or "FileExistsError" in err, err
    assert "check the path, its permissions and the free space" in err


def test_drafting_flags_that_would_be_ignored_are_refused(capsys):
    """--draft with --mode greedy or --proposer suffix, and --suffix-calibration online with --proposer eagle, used
    to be ignored silently."""
    for argv, needle in ((["generate", "--prompt", "hi", "--mode", "greedy", "--draft", "h"], "--mode greedy"),
                         (["generate", "--prompt", "hi", "--proposer", "suffix", "--draft", "h"], "uses no head"),
                         (["bench", "--proposer", "eagle", "--suffix-calibration", "online"], "no suffix source")):
        assert cli.main([*argv, "--model", NOWHERE]) == 2
        err = capsys.readouterr().err
        assert "ConfigError" in err and needle in err and NOWHERE not in err
