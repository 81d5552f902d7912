"""Write a trained head in the public EAGLE-3 format: ``config.json`` + ``model.safetensors``, atomically.

The layout is what SafeAILab EAGLE and SpecForge save and what ``mindspore_eagle/convert/eagle3.py`` reads: tensor names
``fc.weight``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight`` (Linear weights HF-oriented ``[out, in]``),
plus ``d2t`` (int64) and ``t2d`` (bool) when the draft vocabulary is reduced; the config is a Llama config
with ``draft_vocab_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids``, and ``target_hidden_size`` only
when it differs from ``hidden_size``, as the published heads do: SafeAILab EAGLE's loader reads the key's mere
presence as "this head carries its own ``embed_tokens``" and, finding none, silently keeps a random embedding.
``dtype="float16"`` halves the file (the shipped default head); float32 keeps weights bit-exact.
"""

from __future__ import annotations

import json
import os
from typing import Mapping, Sequence

import numpy as np

from ..storage.atomic import atomic_directory, check_output_dir
from ..storage.checkpoint import save_tensors
from ..draft_config import DraftConfig
from ..errors import ConfigError


HEAD_FILES = ("config.json", "model.safetensors")
ARCHITECTURE = "LlamaForCausalLMEagle3"


def is_exported_head(path: str) -> bool:
    """Whether ``path`` is a directory holding exactly a head as ``export_head`` writes it (its two files, an
    EAGLE-3 config): the only non-empty output the trainer replaces without ``--overwrite`` -- a rerun re-exports
    its own head, and no other file can be lost with it."""
    try:
        names = sorted(os.listdir(path))
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return False
    return names == sorted(HEAD_FILES) and isinstance(cfg, dict) and cfg.get("architectures") == [ARCHITECTURE]


def _is_linear(name: str) -> bool:
    return name.endswith("_proj.weight") or name in ("fc.weight", "lm_head.weight")


def public_config(cfg: DraftConfig, dtype: str) -> dict:
    d = {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_act": "silu",
        "num_hidden_layers": 1,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": cfg.max_position_embeddings,
        "attention_bias": cfg.attention_bias,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
    }
    if cfg.target_hidden_size != cfg.hidden_size:
        d["target_hidden_size"] = cfg.target_hidden_size
    if cfg.rope_scaling is not None:
        rs = cfg.rope_scaling
        d["rope_scaling"] = {"rope_type": rs.kind, "factor": rs.factor, "low_freq_factor": rs.low_freq_factor,
                             "high_freq_factor": rs.high_freq_factor,
                             "original_max_position_embeddings": rs.original_max_position_embeddings}
    if cfg.aux_layer_ids:
        d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids)}
    return d


def export_head(out_dir: str, cfg: DraftConfig, weights: Mapping[str, np.ndarray], d2t: np.ndarray | None = None,
                t2d: np.ndarray | None = None, dtype: str = "float32", overwrite: bool = True,
                sources: Sequence[str] = ()) -> str:
    """``weights``: our names and orientation (Linear ``[in, out]``), e.g. ``{p.name: p.asnumpy()}`` of
    ``Eagle3DraftHead.weight_parameters()``. Returns ``out_dir``; the directory appears complete or not at all.
    ``sources`` (the teacher, the training data and run directories) must not overlap ``out_dir``: an overwrite
    would delete them (``check_output_dir``)."""
    check_output_dir(out_dir, overwrite, ConfigError, sources)
    if dtype not in ("float32", "float16"):
        raise ConfigError(f"export dtype={dtype!r}: expected 'float32' or 'float16'")
    if cfg.has_vocab_map and (d2t is None or t2d is None):
        raise ConfigError("export: the draft vocabulary is reduced, so d2t and t2d are required")
    np_dtype = np.float16 if dtype == "float16" else np.float32
    tensors = {}
    for name, arr in weights.items():
        arr = np.asarray(arr, np.float32)
        if _is_linear(name):
            arr = arr.T
        tensors[name] = np.ascontiguousarray(arr.astype(np_dtype))
    if cfg.has_vocab_map:
        tensors["d2t"] = np.asarray(d2t, np.int64)
        tensors["t2d"] = np.asarray(t2d, np.bool_)
    out_dir = os.path.abspath(out_dir)
    with atomic_directory(out_dir, overwrite, ConfigError, sources) as tmp:
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(public_config(cfg, dtype), f, indent=2)
            f.write("\n")
        save_tensors(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})  # sorted header
    return out_dir


__all__ = ["export_head", "is_exported_head", "public_config"]
