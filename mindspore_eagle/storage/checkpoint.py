"""Weights on disk: one safetensors file per model, head or training run, read and written strictly.

Why safetensors and not MindSpore's ``.ckpt``: a ``.ckpt`` is a single protobuf message that
``ms.load_checkpoint`` must read whole, and MindSpore 2.10 refuses to start when the file is larger than the
machine's *free* memory (page cache not counted) -- a 0.5 GB teacher then fails to load on a busy machine that
has gigabytes available. A safetensors file is read one tensor at a time from a memory map, needs no more
memory than the tensor being assigned, and is the format other stacks read.

``ms.load_param_into_net`` silently skips what does not match; ``load_strict`` reports every missing,
unexpected or mis-shaped tensor in one ``CheckpointError`` before any weight is assigned.

Every weight, converted or loaded, passes ``checked_weight``: integer and bool tensors are refused (a cast would
load garbage silently) and so are NaN/Inf values, which otherwise load fine and only show up as an empty greedy
answer (argmax of NaN logits is token 0), a crash inside numpy's sampler, or a draft head that never gets a
token accepted. The check runs per tensor while it is read and costs one pass over memory already in cache.
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping

import numpy as np

from ..errors import CheckpointError

# Not "model.safetensors": our Linear weights are stored [in, out] (HF stores [out, in]), so a directory of ours
# must not look like a HF or public EAGLE-3 checkpoint to other tools -- or to ``load_head``, which tells the
# two head formats apart by this file name.
CKPT_NAME = "weights.safetensors"
QUANTIZED_NAME = "quantized.safetensors"  # the GGUF's own blocks of a converted model (``--weights native``)
LEGACY_CKPT_NAME = "model.ckpt"


def save_tensors(tensors: Mapping[str, np.ndarray], path: str, metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` to ``path`` atomically (temporary sibling, then rename): never a half-written file. The
    same tensors and metadata give the same bytes (``canonical_header``), so a directory's content fingerprint
    (``storage.fingerprint``) names its content, whichever process wrote it."""
    from safetensors.numpy import save_file

    tmp = path + ".tmp"
    try:
        save_file({n: np.ascontiguousarray(a) for n, a in tensors.items()}, tmp,
                  metadata=dict(metadata) if metadata else None)
        canonical_header(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def canonical_header(path: str) -> None:
    """Rewrite the JSON header of the safetensors file ``path`` in place with its keys sorted (the tensors' data and
    offsets untouched). Why: ``safetensors`` serialises the metadata from a hash map whose order changes from one
    process to the next, so two conversions of the same GGUF wrote different bytes -- and a different directory
    fingerprint, which every record of a teacher's identity keys on (answer ledgers, evaluation traces, compile
    caches). The sorted header has the same keys and values, hence the same length; it is padded with spaces (the
    format's own padding) to the header size the file already has."""
    import json
    import struct

    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(text) > n:  # never: the same keys and values, only in another order
            raise CheckpointError(f"{path}: canonical safetensors header of {len(text)} bytes exceeds its {n}")
        f.seek(8)
        f.write(text + b" " * (n - len(text)))


def checked_weight(source: str, name: str, arr: np.ndarray) -> np.ndarray:
    """``arr`` as float32, or a CheckpointError naming ``source`` and the tensor: the dtype must be floating point
    (fp32, fp16, bf16, fp64) and every value finite."""
    if arr.dtype.kind != "f" and str(arr.dtype) != "bfloat16":
        raise CheckpointError(f"{source}: tensor {name} has dtype {arr.dtype}; weights must be floating point "
                              "(fp32, fp16 or bf16)")
    arr = np.asarray(arr, dtype=np.float32)
    finite = np.isfinite(arr)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        kinds = sorted({"NaN" if np.isnan(v) else "Inf" for v in arr.reshape(-1)[bad[:1000]]})
        raise CheckpointError(f"{source}: tensor {name} holds {bad.size} non-finite value"
                              f"{'s' if bad.size > 1 else ''} ({'/'.join(kinds)}, first at flat index {bad[0]}); "
                              "the checkpoint is corrupt or was saved after training diverged: re-export or "
                              "re-download it")
    return arr


def load_array(path: str, kinds: str, shape: tuple[int, ...], expected: str) -> np.ndarray:
    """A ``.npy`` side file (e.g. a head's ``d2t.npy``) read without pickle and checked: dtype kind in ``kinds``
    (numpy kind letters, ``expected`` names them for the message) and exactly ``shape``; else CheckpointError."""
    try:
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:  # garbage, truncated, pickled or object arrays
        raise CheckpointError(f"{path}: not a numpy array file ({type(exc).__name__}: {exc}); convert or export "
                              "the head again") from None
    if not isinstance(arr, np.ndarray):  # an .npz archive under a .npy name
        arr.close()
        raise CheckpointError(f"{path}: not a numpy array file (an .npz archive); convert or export the head again")
    if arr.dtype.kind not in kinds:
        raise CheckpointError(f"{path}: dtype {arr.dtype}; expected {expected}")
    if arr.shape != tuple(shape):
        raise CheckpointError(f"{path}: shape {arr.shape}; expected {tuple(shape)}")
    return arr


def is_gguf_file(path: str) -> bool:
    """True for a GGUF file: a ``.gguf`` suffix in any case (``.GGUF`` too), or the GGUF magic bytes."""
    if not os.path.isfile(path):
        return False
    if str(path).lower().endswith(".gguf"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


# Files that make a directory a checkpoint of another format, which ``mindspore-eagle convert`` imports.
FOREIGN_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def unconverted_hint(model_dir: str) -> str | None:
    """What to tell a user who passed an unconverted HuggingFace checkpoint as a model directory (None when
    ``model_dir`` has our checkpoint, or no foreign weights either)."""
    if os.path.isfile(os.path.join(model_dir, CKPT_NAME)):
        return None
    found = [n for n in FOREIGN_WEIGHTS if os.path.isfile(os.path.join(model_dir, n))]
    if not found:
        return None
    return (f"{model_dir}: this looks like a HuggingFace checkpoint ({found[0]}, no {CKPT_NAME}); convert it once "
            f"with `mindspore-eagle convert {model_dir} OUT_DIR` and pass OUT_DIR instead")


def _open(path: str):
    from safetensors import safe_open

    if not os.path.isfile(path):
        model_dir = os.path.dirname(path)
        hint = unconverted_hint(model_dir)
        if hint:
            raise CheckpointError(hint)
        legacy = os.path.join(model_dir, LEGACY_CKPT_NAME)
        hint = (f" (found {LEGACY_CKPT_NAME}, written by an older version: convert the model again)"
                if os.path.isfile(legacy) else "")
        raise CheckpointError(f"{path}: checkpoint file not found{hint}")
    try:
        return safe_open(path, framework="numpy")
    except Exception as exc:  # safetensors raises its own error types for truncated or foreign files
        raise CheckpointError(f"{path}: cannot read safetensors file ({type(exc).__name__}: {exc})") from None


# Bytes per element of the safetensors dtypes our files and the checkpoints we import hold.
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
_MAX_HEADER = 100 << 20  # the limit safetensors itself applies


def check_safetensors_file(path: str) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of ``path``, after checking the file's structure without reading any
    tensor data: the header parses, and every tensor's byte range lies inside the file and is exactly as long
    as its dtype and shape require. A truncated or overwritten file fails here (CheckpointError) in
    microseconds, where reading it would fail -- or worse, not -- much later."""
    import json
    import math

    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            prefix = f.read(8)
            n = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
            if not 0 < n <= min(_MAX_HEADER, size - 8):
                raise CheckpointError(f"{path}: not a safetensors file (header length {n}, file size {size})")
            header = json.loads(f.read(n))
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({type(exc).__name__}: {exc})") from None
    except ValueError as exc:
        raise CheckpointError(f"{path}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: safetensors header is not a JSON object")
    data_bytes = size - 8 - n
    shapes = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            if not all(isinstance(v, int) and v >= 0 for v in (begin, end, *shape)):
                raise TypeError("offsets and dimensions must be integers >= 0")
            expected = math.prod(shape) * _DTYPE_BYTES[dtype]
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{path}: malformed header entry for tensor {name} ({type(exc).__name__}: "
                                  f"{exc})") from None
        if not begin <= end <= data_bytes:
            raise CheckpointError(f"{path}: tensor {name} occupies bytes [{begin}, {end}) of the data, outside the "
                                  f"file's {data_bytes} data bytes (truncated or corrupt file)")
        if end - begin != expected:
            raise CheckpointError(f"{path}: tensor {name} has {end - begin} bytes, but {dtype} {list(shape)} needs "
                                  f"{expected}")
        shapes[name] = shape
    return shapes


def tensor_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in ``path``, read from the header only."""
    with _open(path) as f:
        return {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}


def load_tensors(path: str, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Tensors of ``path`` (all, or ``names``) as numpy arrays."""
    with _open(path) as f:
        wanted = list(f.keys()) if names is None else list(names)
        try:
            return {n: f.get_tensor(n) for n in wanted}
        except Exception as exc:
            raise CheckpointError(f"{path}: cannot read tensor ({type(exc).__name__}: {exc})") from None


def load_strict(params: dict, ckpt_path: str) -> None:
    """Assign the tensors of ``ckpt_path`` to ``params`` (name -> Parameter), all or nothing.

    Names and shapes are checked from the header before any weight is read; tensors are then read, checked
    (``checked_weight``) and assigned one at a time, so peak extra memory is one tensor. A tensor refused
    midway leaves earlier Parameters assigned: callers discard the model on error.
    """
    from mindspore import Tensor

    shapes = tensor_shapes(ckpt_path)
    missing = sorted(set(params) - set(shapes))
    unexpected = sorted(set(shapes) - set(params))
    misshaped = sorted(f"{n}: got {shapes[n]}, expected {tuple(params[n].shape)}"
                       for n in set(params) & set(shapes) if shapes[n] != tuple(params[n].shape))
    if missing or unexpected or misshaped:
        raise CheckpointError(f"{ckpt_path}: does not match the model; missing {missing}; unexpected {unexpected}; "
                              f"mis-shaped {misshaped}")
    with _open(ckpt_path) as f:
        for name, p in params.items():
            try:
                arr = f.get_tensor(name)
            except Exception as exc:
                raise CheckpointError(f"{ckpt_path}: cannot read tensor {name} "
                                      f"({type(exc).__name__}: {exc})") from None
            p.set_data(Tensor(checked_weight(ckpt_path, name, arr)).astype(p.dtype))
