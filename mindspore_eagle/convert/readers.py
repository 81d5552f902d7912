"""Readers for the checkpoint formats we import: HF safetensors (single or sharded) and GGUF.

Each reader returns plain float32 numpy arrays keyed by the *source* name; mapping and validation happen in
``convert.py``. Any unreadable or truncated file becomes a ``CheckpointError`` naming the file, and every tensor
passes ``checked_weight`` as it is read (floating point, finite).

Files are read only from inside the checkpoint directory: a shard index naming ``../x.safetensors``, an
absolute path, or a file that is a symlink leading out of the directory is refused (``contained_file``). The
one layout whose symlinks do lead out is the HuggingFace hub cache (``models--ORG--NAME/snapshots/<rev>/<file>``
-> ``../../blobs/<hash>``); there the repository folder holding ``snapshots/`` and ``blobs/`` is the boundary.
"""

from __future__ import annotations

import json
import os
from pathlib import PurePath
from typing import Any, Callable

import numpy as np

from ..storage.checkpoint import checked_weight
from ..errors import CheckpointError

INDEX_NAME = "model.safetensors.index.json"


def _import_bf16_support() -> None:
    # MindSpore registers numpy's bfloat16 dtype on import, which safetensors.numpy needs for bf16 files.
    import mindspore  # noqa: F401


def _boundary(src: str) -> str:
    """The directory files of checkpoint ``src`` must resolve inside (see the module docstring)."""
    real = os.path.realpath(src)
    parent = os.path.dirname(real)
    repo = os.path.dirname(parent)
    in_hub_cache = os.path.basename(parent) == "snapshots" and os.path.basename(repo).startswith("models--")
    return repo if in_hub_cache else real


def contained_file(src: str, name: str, listed_in: str) -> str:
    """``src/name``, or a CheckpointError when ``name`` (as listed in ``listed_in``) leads outside ``src``."""
    if os.path.isabs(name) or ".." in PurePath(name.replace("\\", "/")).parts:
        raise CheckpointError(f"{listed_in}: file {name!r} lies outside the checkpoint directory {src}; a "
                              "checkpoint may only name files inside its own directory")
    path = os.path.join(src, name)
    real, root = os.path.realpath(path), _boundary(src)
    if os.path.commonpath([real, root]) != root:
        raise CheckpointError(f"{listed_in}: file {name!r} is a symlink to {real}, outside the checkpoint directory "
                              f"{src}; copy the file into the checkpoint instead")
    return path


def _shard_names(index: str) -> list[str]:
    try:
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index}: unreadable shard index ({type(exc).__name__}: {exc})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: weight_map must map tensor names to shard file names")
    return sorted(set(weight_map.values()))


def safetensors_files(src: str) -> list[str]:
    """The safetensors file(s) of a HF checkpoint directory or a single ``.safetensors`` path."""
    if os.path.isfile(src):
        return [src]
    index = os.path.join(src, INDEX_NAME)
    if os.path.isfile(index):
        paths = [contained_file(src, name, index) for name in _shard_names(index)]
        missing = [os.path.basename(p) for p in paths if not os.path.isfile(p)]
        if missing:
            raise CheckpointError(f"{index} names shard files that do not exist: {missing}")
        return paths
    single = os.path.join(src, "model.safetensors")
    if os.path.isfile(single):
        return [contained_file(src, "model.safetensors", src)]
    raise CheckpointError(f"{src}: no model.safetensors or {INDEX_NAME} found")


def read_safetensors(src: str, convert: Callable[[str, str, np.ndarray], np.ndarray] = checked_weight
                     ) -> dict[str, np.ndarray]:
    """All tensors of a HF checkpoint (single file or shards), each passed through ``convert(path, name, arr)``
    (default ``checked_weight``: float32 from fp32, fp16 or bf16 sources, finite values only)."""
    _import_bf16_support()
    from safetensors.numpy import load_file

    tensors: dict[str, np.ndarray] = {}
    for path in safetensors_files(src):
        try:
            part = load_file(path)
        except Exception as exc:  # safetensors raises its own error types for truncated/corrupt files
            raise CheckpointError(f"{path}: cannot read safetensors file ({type(exc).__name__}: {exc})") from None
        dup = sorted(set(part) & set(tensors))
        if dup:
            raise CheckpointError(f"{path}: tensors appear in more than one shard: {dup[:10]}")
        for name, arr in part.items():
            tensors[name] = convert(path, name, arr)
    return tensors


_GGUF_INTEGER_TYPES = ("I8", "I16", "I32", "I64")


def read_gguf_blocks(path: str, types: tuple[str, ...]) -> dict[str, tuple[str, np.ndarray]]:
    """The tensors of a GGUF file stored in one of ``types`` (GGML type names), as they are: name ->
    (type, raw blocks ``uint8 [rows, bytes per row]``), rows in the file's order. What ``--weights native`` keeps."""
    import gguf

    reader = gguf.GGUFReader(path)
    out = {}
    for t in reader.tensors:
        if t.tensor_type.name in types:
            raw = np.asarray(t.data, np.uint8)
            out[t.name] = (t.tensor_type.name, np.ascontiguousarray(raw.reshape(raw.shape[0], -1)))
    return out


def read_gguf(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """GGUF header fields (decoded) and all tensors dequantized to float32 in HF row-major order."""
    import gguf

    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: GGUF file not found")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot read GGUF file ({type(exc).__name__}: {exc})") from None
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            meta[key] = field.contents()
        except Exception:  # array-of-array fields we never use
            continue
    tensors: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if t.tensor_type.name in _GGUF_INTEGER_TYPES:
            raise CheckpointError(f"{path}: tensor {t.name} has integer type {t.tensor_type.name}; weights must be "
                                  "floating point or quantized")
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as exc:
            raise CheckpointError(f"{path}: cannot dequantize tensor {t.name} "
                                  f"({t.tensor_type.name}): {exc}") from None
        # GGUF lists dims fastest-first; numpy/HF order is the reverse.
        shape = tuple(int(d) for d in reversed(t.shape))
        tensors[t.name] = np.ascontiguousarray(checked_weight(path, t.name, arr.reshape(shape)))
    return meta, tensors
