"""The command-line tools answer with real output, and with a one-line typed error (exit 2) on bad input."""

import subprocess
import sys

from mindspore_eagle import cli
from tests.helpers import default_model_or_skip


def test_generate_prints_the_answer_and_speed(capsys):
    model = default_model_or_skip()
    code = cli.main(["generate", "--mode", "greedy", "--model", model, "--prompt", "What is the capital of France?",
                     "--max-new-tokens", "8", "--exec", "reference", "--no-warmup", "--max-cache-len", "128"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "Paris" in out
    assert "tok/s" in err and "time to first token" in err


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
