"""Convert HF safetensors and GGUF checkpoints into a mindspore_eagle model directory.

A model directory holds ``config.json`` (our ``TeacherConfig``), ``weights.safetensors`` (Linear
weights ``[in, out]``) and the tokenizer files. Conversion is strict and atomic:

1. read every source tensor and map its name (tables in ``name_map``);
2. compare against the names and shapes the config implies; every missing, unexpected or mis-shaped tensor
   is listed in one ``CheckpointError`` and nothing is written;
3. write into a temporary sibling directory and rename it into place, so a failure at any point leaves no
   output behind (and an existing output is only replaced once the new one is complete).

Before step 1, the output is checked (``mindspore_eagle.storage.atomic.check_output_dir``): an existing OUT without
``overwrite`` and an OUT that is, contains or lies inside the source are refused before the source is read.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Callable, Mapping

import numpy as np

from ..storage.atomic import atomic_directory, check_output_dir
from ..storage.checkpoint import CKPT_NAME, QUANTIZED_NAME, save_tensors
from ..fields import read_config_json
from ..teacher_config import TeacherConfig, expected_weight_shapes
from ..errors import CheckpointError

from .name_map import HF_STALE_SUFFIXES, gguf_name_to_ours, is_linear_weight, unpermute_rope_rows
from ..kernels.layout import GGUF_BLOCK_BYTES
from .readers import contained_file, read_gguf, read_gguf_blocks, read_safetensors

HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                      "generation_config.json", "chat_template.jinja")


def check_tensors(tensors: Mapping[str, np.ndarray], expected: Mapping[str, tuple[int, ...]], source: str) -> None:
    """Raise one CheckpointError listing every missing, unexpected and mis-shaped tensor."""
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    misshaped = sorted(f"{n}: got {tuple(tensors[n].shape)}, expected {expected[n]}"
                       for n in set(tensors) & set(expected) if tuple(tensors[n].shape) != tuple(expected[n]))
    problems = []
    if missing:
        problems.append(f"missing {len(missing)}: {missing}")
    if unexpected:
        problems.append(f"unexpected {len(unexpected)}: {unexpected}")
    if misshaped:
        problems.append(f"mis-shaped {len(misshaped)}: {misshaped}")
    if problems:
        raise CheckpointError(f"{source}: checkpoint does not match the model config; " + "; ".join(problems))


def hf_to_ours(tensors: Mapping[str, np.ndarray], cfg: TeacherConfig) -> dict[str, np.ndarray]:
    """Rename (identity) and re-orient HF tensors; drop known stale buffers and a duplicated tied head."""
    out: dict[str, np.ndarray] = {}
    for name, arr in tensors.items():
        if name.endswith(HF_STALE_SUFFIXES):
            continue
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # some tied checkpoints store the shared matrix twice
        out[name] = np.ascontiguousarray(arr.T) if is_linear_weight(name) and arr.ndim == 2 else arr
    return out


def gguf_to_ours(tensors: Mapping[str, np.ndarray], cfg: TeacherConfig) -> dict[str, np.ndarray]:
    """Map llama.cpp names to ours, undo the q/k row permutation and re-orient Linear weights."""
    out: dict[str, np.ndarray] = {}
    unknown = []
    for name, arr in tensors.items():
        ours = gguf_name_to_ours(name)
        if ours is None:
            unknown.append(name)
            continue
        if ours.endswith("q_proj.weight"):
            arr = unpermute_rope_rows(arr, cfg.num_heads)
        elif ours.endswith("k_proj.weight"):
            arr = unpermute_rope_rows(arr, cfg.num_kv_heads)
        elif ours.endswith("q_proj.bias"):
            arr = unpermute_rope_rows(arr, cfg.num_heads)
        elif ours.endswith("k_proj.bias"):
            arr = unpermute_rope_rows(arr, cfg.num_kv_heads)
        out[ours] = np.ascontiguousarray(arr.T) if is_linear_weight(ours) and arr.ndim == 2 else arr
    if unknown:
        raise CheckpointError(f"GGUF tensors with no mapping to this model (unsupported variant?): {sorted(unknown)}")
    return out


def gguf_blocks_to_ours(blocks: Mapping[str, tuple[str, np.ndarray]], cfg: TeacherConfig) -> dict[str, tuple[str, np.ndarray]]:
    """GGUF raw blocks (``readers.read_gguf_blocks``) under our names, the q/k rows un-permuted like the dense
    weights (a row of blocks is one output feature, so the permutation moves whole rows). Only 2-D weights whose
    rows are output features are kept: Linear weights and the embedding table (the tied LM head)."""
    out = {}
    for name, (kind, raw) in blocks.items():
        ours = gguf_name_to_ours(name)
        if ours is None or not (is_linear_weight(ours) or ours == "model.embed_tokens.weight"):
            continue
        if ours.endswith("q_proj.weight"):
            raw = unpermute_rope_rows(raw, cfg.num_heads)
        elif ours.endswith("k_proj.weight"):
            raw = unpermute_rope_rows(raw, cfg.num_kv_heads)
        out[ours] = (kind, np.ascontiguousarray(raw))
    return out


def write_quantized(tmp: str, blocks: Mapping[str, tuple[str, np.ndarray]]) -> None:
    """``quantized.safetensors``: each weight's raw GGUF rows (uint8), its GGML type in the metadata. Written for
    every GGUF conversion, empty when no weight is in an exactly-computed format: its presence says the directory
    was converted by a version that keeps blocks (``assets.install_default_model`` converts older ones again)."""
    save_tensors({n: raw for n, (_, raw) in sorted(blocks.items())}, os.path.join(tmp, QUANTIZED_NAME),
                 metadata={"format": "mindspore_eagle.gguf_blocks", **{n: k for n, (k, _) in blocks.items()}})


def write_model_dir(out_dir: str, cfg: TeacherConfig, tensors: Mapping[str, np.ndarray],
                    extra: Callable[[str], None] | None = None, overwrite: bool = False,
                    sources: tuple[str, ...] = ()) -> None:
    """Write config, checkpoint and extras into a temp dir beside ``out_dir``, then rename it into place
    (``sources``: paths the output must not overlap, see ``check_output_dir``)."""
    with atomic_directory(out_dir, overwrite, CheckpointError, sources) as tmp:
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg.to_dict(), f, indent=2, sort_keys=True)
        save_tensors({n: np.asarray(a, np.float32) for n, a in sorted(tensors.items())},
                     os.path.join(tmp, CKPT_NAME), metadata={"format": "mindspore_eagle", "layout": "in_out"})
        if extra is not None:
            extra(tmp)


def convert_hf(src: str, out_dir: str, overwrite: bool = False, aux_layer_ids: tuple[int, ...] = ()) -> TeacherConfig:
    """HF checkpoint dir (config.json + safetensors, single or sharded; fp32/fp16/bf16) -> model dir."""
    check_output_dir(out_dir, overwrite, CheckpointError, (src,))
    if not os.path.isfile(os.path.join(src, "config.json")):
        raise CheckpointError(f"{src}: no config.json")
    cfg = TeacherConfig.from_hf_dict(read_config_json(src))
    if aux_layer_ids:
        cfg = _with_aux(cfg, aux_layer_ids)
    tensors = hf_to_ours(read_safetensors(src), cfg)
    check_tensors(tensors, expected_weight_shapes(cfg), src)

    def copy_tokenizer(tmp: str) -> None:
        for name in HF_TOKENIZER_FILES:
            if os.path.isfile(os.path.join(src, name)):
                shutil.copyfile(contained_file(src, name, src), os.path.join(tmp, name))

    write_model_dir(out_dir, cfg, tensors, copy_tokenizer, overwrite, (src,))
    return cfg


def convert_gguf(path: str, out_dir: str, overwrite: bool = False, aux_layer_ids: tuple[int, ...] = ()) -> TeacherConfig:
    """llama-architecture GGUF (any quantisation the ``gguf`` package dequantizes) -> model dir. Weights stored as
    Q4_0, Q4_1 or Q8_0 also keep their blocks (``quantized.safetensors``), which ``--weights native`` computes
    with, exactly; other formats are dense only."""
    check_output_dir(out_dir, overwrite, CheckpointError, (path,))
    meta, raw = read_gguf(path)
    cfg = TeacherConfig.from_gguf_metadata(meta, tied="output.weight" not in raw)
    if aux_layer_ids:
        cfg = _with_aux(cfg, aux_layer_ids)
    tensors = gguf_to_ours(raw, cfg)
    check_tensors(tensors, expected_weight_shapes(cfg), path)

    blocks = gguf_blocks_to_ours(read_gguf_blocks(path, tuple(GGUF_BLOCK_BYTES)), cfg)

    def export_tokenizer(tmp: str) -> None:
        from ..tokenizer import export_gguf_tokenizer

        export_gguf_tokenizer(path, tmp)
        write_quantized(tmp, blocks)

    write_model_dir(out_dir, cfg, tensors, export_tokenizer, overwrite, (path,))
    return cfg


def _with_aux(cfg: TeacherConfig, aux_layer_ids: tuple[int, ...]) -> TeacherConfig:
    from ..runtime import replace

    return replace(cfg, aux_layer_ids=tuple(aux_layer_ids))
