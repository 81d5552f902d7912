"""Shared fixtures: tiny random checkpoints in openPangu / Llama / Qwen2 form written by HuggingFace
``transformers`` (the independent reference), and the default SmolLM2 model when it is installed."""

from __future__ import annotations

import json
import random
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
    from mindspore_eagle.runtime import RuntimeConfig
    from mindspore_eagle.teacher import Teacher
    from mindspore_eagle.tokenizer import load_tokenizer

    d = default_model_or_skip()
    return Teacher.load(d, RuntimeConfig(max_cache_len=512)), load_tokenizer(d)


@pytest.fixture(scope="session")
def hf_smollm2():
    import torch
    from transformers import AutoModelForCausalLM

    from mindspore_eagle.storage.assets import default_gguf_path

    gguf = default_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                 dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def sp_dir(tmp_path_factory):
    sentencepiece = pytest.importorskip("sentencepiece")
    model_dir = tmp_path_factory.mktemp("pangu_sp")
    rng = random.Random(0)
    words = "the quick brown fox jumps over lazy dog draft tree token 系统 用户 助手 你好 世界 模型 ： 。".split()
    lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(300)]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(model_dir / "tokenizer"), vocab_size=400, model_type="bpe",
        user_defined_symbols=["[unused9]", "[unused10]"], character_coverage=1.0, byte_fallback=True,
        hard_vocab_limit=False, normalization_rule_name="identity", remove_extra_whitespaces=False,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    (model_dir / "tokenizer.vocab").unlink()
    return model_dir


@pytest.fixture(scope="module")
def processor(sp_dir):
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=str(sp_dir / "tokenizer.model"))
