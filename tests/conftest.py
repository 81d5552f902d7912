"""Shared fixtures: tiny random checkpoints in openPangu / Llama / Qwen2 form written by HuggingFace
``transformers`` (the independent reference), and the default SmolLM2 model when it is installed."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ.setdefault("GLOG_v", "3")

TINY = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0)

# kind -> (HF class name, config overrides, config.json rewrite)
FORMS = {
    "pangu": ("LlamaForCausalLM", dict(attention_bias=True, tie_word_embeddings=False)),
    "llama": ("LlamaForCausalLM", dict(attention_bias=False, tie_word_embeddings=True)),
    "qwen2": ("Qwen2ForCausalLM", dict(tie_word_embeddings=False)),
}


def _randomize(model, seed: int) -> None:
    """Replace HF's tiny init (std 0.02 -> near-uniform logits) with weights that make tokens distinct."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(p.shape[-1]) * 1.5)


def make_hf_checkpoint(kind: str, out_dir: str, seed: int = 0, dtype: str = "float32"):
    """Write a tiny random HF checkpoint of ``kind`` to ``out_dir``; return the torch model (fp32, eval)."""
    import torch
    import transformers

    cls_name, overrides = FORMS[kind]
    torch.manual_seed(seed)
    if cls_name == "Qwen2ForCausalLM":
        cfg = transformers.Qwen2Config(**TINY, **overrides)
    else:
        cfg = transformers.LlamaConfig(**TINY, **overrides)
    model = getattr(transformers, cls_name)(cfg).eval()
    _randomize(model, seed)
    save_model = model if dtype == "float32" else model.to(getattr(torch, dtype))
    save_model.save_pretrained(out_dir, safe_serialization=True)
    model = model.float()
    if kind == "pangu":
        # Rewrite config.json exactly as openPangu-Embedded ships it (architecture name and `bias` key).
        path = os.path.join(out_dir, "config.json")
        with open(path) as f:
            d = json.load(f)
        d["architectures"] = ["PanguEmbeddedForCausalLM"]
        d["model_type"] = "PanguEmbedded"
        d["bias"] = True
        d.pop("attention_bias", None)
        d.pop("mlp_bias", None)
        with open(path, "w") as f:
            json.dump(d, f)
    return model


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


def torch_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens from a torch model by full recompute each step (no cache: nothing shared with us)."""
    import torch

    seq = list(prompt)
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([seq])).logits[0, -1]
            tok = int(torch.argmax(logits))
            out.append(tok)
            seq.append(tok)
    return out


def default_model_or_skip() -> str:
    """The converted default model dir. Skips when absent, unless MSE_REQUIRE_DEFAULT_MODEL=1 (set by
    `make test`), where a missing model is a failure rather than a silent skip."""
    from mindspore_eagle.assets import default_model_dir

    d = default_model_dir()
    if not os.path.isfile(os.path.join(d, "weights.safetensors")):
        if os.environ.get("MSE_REQUIRE_DEFAULT_MODEL") == "1":
            pytest.fail(f"default model missing at {d}; `make test` should have installed it")
        pytest.skip(f"default model not installed at {d} (run `mindspore-eagle setup`)")
    return d


@pytest.fixture(scope="session")
def default_teacher():
    """(Teacher, tokenizer) for the default SmolLM2 model, graph mode, built once per session."""
    from mindspore_eagle.config import RuntimeConfig
    from mindspore_eagle.teacher import Teacher
    from mindspore_eagle.tokenizer import load_tokenizer

    d = default_model_or_skip()
    return Teacher.load(d, RuntimeConfig(max_cache_len=512)), load_tokenizer(d)
