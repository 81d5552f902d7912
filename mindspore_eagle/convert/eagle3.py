"""Import a published EAGLE-3 draft head (SafeAILab EAGLE, SpecForge) into a mindspore_eagle head directory.

Source: a directory with the trainer's ``config.json`` and ``model.safetensors`` (single or sharded), or
``pytorch_model.bin`` when torch is installed. Tensor names are the public ones (``fc.weight``,
``midlayer.*``, ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``; see ``mindspore_eagle.models.eagle3``),
HF orientation ``[out, in]``. Output: ``config.json`` (our ``DraftConfig``), ``weights.safetensors`` (Linear weights
``[in, out]``) and, for a reduced draft vocabulary, ``d2t.npy`` (int64) / ``t2d.npy`` (bool).

Same strictness as the teacher converter: every missing, unexpected or mis-shaped tensor is listed in one
``CheckpointError`` before anything is written; the vocabulary map is checked for consistency; the output
appears atomically. ``load_public_head`` builds a head from such a directory in memory, with the same checks.
Known extras that are dropped: ``embed_tokens.weight`` when the head shares the teacher's width (the teacher's
embeddings are used; SpecForge saves a frozen copy), ``d2t``/``t2d`` when the draft vocabulary is the full
vocabulary (no map; the reference code deletes them too), rotary ``inv_freq``.
"""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from ..storage.atomic import check_output_dir
from ..storage.checkpoint import checked_weight
from ..fields import read_config_json
from ..draft_config import DraftConfig
from ..errors import CheckpointError
from ..models.eagle3 import (D2T_FILE, T2D_FILE, Eagle3DraftHead, check_vocab_map,
                                           expected_head_shapes)

from .teacher import check_tensors, write_model_dir
from .name_map import HF_STALE_SUFFIXES
from .readers import contained_file, read_safetensors

VOCAB_MAP = ("d2t", "t2d")


def _is_linear(name: str) -> bool:
    return name.endswith("_proj.weight") or name in ("fc.weight", "lm_head.weight")


def _as_numpy(path: str, name: str, arr) -> np.ndarray:
    """Weights -> float32 (fp16/bf16 sources too; finite floats only, ``checked_weight``); the vocabulary map
    keeps its integer / bool dtype (``check_vocab_map`` validates it)."""
    arr = np.asarray(arr)
    if name in VOCAB_MAP:
        return arr
    return checked_weight(path, name, arr)


def read_head_tensors(src: str) -> dict[str, np.ndarray]:
    """Every tensor of a head checkpoint directory, by source name (safetensors first, then pytorch_model.bin)."""
    has_st = any(os.path.isfile(os.path.join(src, f)) for f in ("model.safetensors", "model.safetensors.index.json"))
    bin_path = os.path.join(src, "pytorch_model.bin")
    if not has_st and os.path.isfile(bin_path):
        return _read_torch_bin(contained_file(src, "pytorch_model.bin", src))
    return read_safetensors(src, _as_numpy)


def _read_torch_bin(path: str) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError:
        raise CheckpointError(f"{path}: reading pytorch_model.bin needs torch, which is not installed; convert "
                              "the head to model.safetensors or install torch") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot read torch checkpoint ({type(exc).__name__}: {exc})") from None
    out = {}
    for name, t in state.items():
        t = t.detach()
        out[name] = _as_numpy(path, name, t.float().numpy() if t.is_floating_point() else t.numpy())
    return out


def hf_head_to_ours(tensors: Mapping[str, np.ndarray], cfg: DraftConfig) -> dict[str, np.ndarray]:
    """Drop known extras and transpose Linear weights to ``[in, out]``; names are otherwise unchanged."""
    out: dict[str, np.ndarray] = {}
    for name, arr in tensors.items():
        if name.endswith(HF_STALE_SUFFIXES):
            continue
        if name == "embed_tokens.weight" and cfg.target_hidden_size == cfg.hidden_size:
            continue  # the teacher's embeddings are used
        if name in VOCAB_MAP and not cfg.has_vocab_map:
            continue
        out[name] = np.ascontiguousarray(arr.T) if _is_linear(name) and arr.ndim == 2 else arr
    return out


def load_hf_config(src: str) -> DraftConfig:
    if not os.path.isfile(os.path.join(src, "config.json")):
        raise CheckpointError(f"{src}: no config.json")
    return DraftConfig.from_hf_dict(read_config_json(src))


def read_checked_head(src: str) -> tuple[DraftConfig, dict[str, np.ndarray], np.ndarray | None, np.ndarray | None]:
    """Read and validate a public head directory: ``(cfg, tensors in our layout, d2t, t2d)``; the map is None
    when the draft vocabulary is the full vocabulary. Raises before returning anything partial."""
    cfg = load_hf_config(src)
    tensors = hf_head_to_ours(read_head_tensors(src), cfg)
    expected = dict(expected_head_shapes(cfg))
    if cfg.has_vocab_map:
        expected.update(d2t=(cfg.draft_vocab_size,), t2d=(cfg.vocab_size,))
    check_tensors(tensors, expected, src)
    d2t = t2d = None
    if cfg.has_vocab_map:
        d2t, t2d = tensors.pop("d2t"), tensors.pop("t2d")
        check_vocab_map(cfg, d2t, t2d, src)
    return cfg, tensors, d2t, t2d


def convert_eagle3(src: str, out_dir: str, overwrite: bool = False) -> DraftConfig:
    """Public EAGLE-3 head directory -> our head directory (strict, atomic). Returns the DraftConfig."""
    check_output_dir(out_dir, overwrite, CheckpointError, (src,))
    cfg, tensors, d2t, t2d = read_checked_head(src)

    def write_vocab_map(tmp: str) -> None:
        if cfg.has_vocab_map:
            np.save(os.path.join(tmp, D2T_FILE), np.asarray(d2t).astype(np.int64))
            np.save(os.path.join(tmp, T2D_FILE), np.asarray(t2d).astype(np.bool_))

    write_model_dir(out_dir, cfg, tensors, write_vocab_map, overwrite, (src,))
    return cfg


def load_public_head(src: str, batch_size: int = 1, max_len: int = 1024, compute=None) -> Eagle3DraftHead:
    """Build a head straight from a public directory (in memory, same checks as ``convert_eagle3``); ``compute``: its
    ``compute.ComputeChoice`` (default primitives and MindSpore's MatMul; a custom kernel is packed here, or falls
    back to MindSpore's MatMul with a message where it cannot run)."""
    from mindspore import Tensor

    from ..compute import ComputeChoice
    from ..kernels import pack_weights

    cfg, tensors, d2t, t2d = read_checked_head(src)
    head = Eagle3DraftHead(cfg, batch_size, max_len, (compute or ComputeChoice()).runnable())
    for name, param in head.weight_parameters().items():  # names and shapes were checked against these
        param.set_data(Tensor(np.asarray(tensors[name], np.float32)))
    if cfg.has_vocab_map:
        head.set_vocab_map(d2t, t2d)
    pack_weights(head)
    return head


__all__ = ["convert_eagle3", "hf_head_to_ours", "load_public_head", "read_checked_head", "read_head_tensors"]
