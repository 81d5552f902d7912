"""Readers for the checkpoint formats we import: HF safetensors (single or sharded) and GGUF.

Each reader returns plain float32 numpy arrays keyed by the *source* name; mapping and validation happen in
``convert.py``. Any unreadable or truncated file becomes a ``CheckpointError`` naming the file.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import numpy as np

from mindspore_eagle.errors import CheckpointError


def _import_bf16_support() -> None:
    # MindSpore registers numpy's bfloat16 dtype on import, which safetensors.numpy needs for bf16 files.
    import mindspore  # noqa: F401


def safetensors_files(src: str) -> list[str]:
    """The safetensors file(s) of a HF checkpoint directory or a single ``.safetensors`` path."""
    if os.path.isfile(src):
        return [src]
    index = os.path.join(src, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{index}: unreadable shard index ({exc})") from None
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not os.path.isfile(os.path.join(src, f))]
        if missing:
            raise CheckpointError(f"{index} names shard files that do not exist: {missing}")
        return [os.path.join(src, f) for f in files]
    single = os.path.join(src, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    raise CheckpointError(f"{src}: no model.safetensors or model.safetensors.index.json found")


def _float32(path: str, name: str, arr: np.ndarray) -> np.ndarray:
    if arr.dtype.kind not in "fiu" and str(arr.dtype) != "bfloat16":
        raise CheckpointError(f"{path}: tensor {name} has unsupported dtype {arr.dtype}")
    return np.asarray(arr, dtype=np.float32)


def read_safetensors(src: str, convert: Callable[[str, str, np.ndarray], np.ndarray] = _float32
                     ) -> dict[str, np.ndarray]:
    """All tensors of a HF checkpoint (single file or shards), each passed through ``convert(path, name, arr)``
    (default: float32 from fp32, fp16 or bf16 sources)."""
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
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as exc:
            raise CheckpointError(f"{path}: cannot dequantize tensor {t.name} "
                                  f"({t.tensor_type.name}): {exc}") from None
        # GGUF lists dims fastest-first; numpy/HF order is the reverse.
        shape = tuple(int(d) for d in reversed(t.shape))
        tensors[t.name] = np.ascontiguousarray(arr.reshape(shape), dtype=np.float32)
    return meta, tensors
