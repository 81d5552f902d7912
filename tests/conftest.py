"""Shared fixtures: tiny random checkpoints in openPangu / Llama / Qwen2 form written by HuggingFace
``transformers`` (the independent reference), and the default SmolLM2 model when it is installed."""

from __future__ import annotations

import json
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
def tiny_taps_dir(hf_tiny, tmp_path_factory):
    """The tiny Llama teacher's directory, with three distinct taps (0, 1, 3) as a real teacher has (its 4
    layers would otherwise give the default taps (2, 2, 1), which repeat a layer)."""
    import shutil

    _, ms_dir, _ = hf_tiny("llama")
    out = tmp_path_factory.mktemp("tiny") / "teacher"
    shutil.copytree(ms_dir, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["aux_layer_ids"] = [0, 1, 3]
    (out / "config.json").write_text(json.dumps(cfg))
    return str(out)


@pytest.fixture(scope="session")
def default_teacher():
    """(Teacher, tokenizer) for the default SmolLM2 model, graph mode, built once per session."""
    from mindspore_eagle.config import RuntimeConfig
    from mindspore_eagle.teacher import Teacher
    from mindspore_eagle.tokenizer import load_tokenizer

    d = default_model_or_skip()
    return Teacher.load(d, RuntimeConfig(max_cache_len=512)), load_tokenizer(d)
