"""Shared fixtures: tiny random checkpoints in openPangu / Llama / Qwen2 form written by HuggingFace
``transformers`` (the independent reference), and the default SmolLM2 model when it is installed."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("GLOG_v", "3")

from tests.helpers import default_model_or_skip, make_hf_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def hf_tiny(tmp_path_factory):
    """kind -> (hf_dir, converted_dir, torch_model), built once per session per kind."""
    from ckpt_convert import convert_hf

    cache = {}

    def get(kind: str):
        if kind not in cache:
            root = tmp_path_factory.mktemp(f"hf_{kind}")
            model = make_hf_checkpoint(kind, str(root / "hf"))
            convert_hf(str(root / "hf"), str(root / "ms"))
            cache[kind] = (str(root / "hf"), str(root / "ms"), model)
        return cache[kind]

    return get


@pytest.fixture(scope="session")
def default_teacher():
    """(Teacher, tokenizer) for the default SmolLM2 model, graph mode, built once per session."""
    from mindspore_eagle.config import RuntimeConfig
    from mindspore_eagle.teacher import Teacher
    from mindspore_eagle.tokenizer import load_tokenizer

    d = default_model_or_skip()
    return Teacher.load(d, RuntimeConfig(max_cache_len=512)), load_tokenizer(d)
