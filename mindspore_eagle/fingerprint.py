"""A fingerprint of a model or head directory's *content*, so a resumed evaluation can tell that the model behind a
path changed (re-converted, re-trained or replaced in place) instead of silently mixing two models in one trace.

The fingerprint is a SHA-256 over every regular file of the directory (sorted by name, hidden files skipped):
its name and size, and its bytes -- all of them for files up to ``FULL_BYTES``, else the first and last
``EDGE_BYTES`` (a safetensors header lives at the start) plus ``SAMPLES`` blocks of ``BLOCK_BYTES`` at evenly
spaced offsets. Re-training changes every weight and therefore every sampled block; the cost stays a few
milliseconds even for a multi-gigabyte teacher (about 2.5 MB read per large file). Identical content gives the
same fingerprint wherever and whenever it was written (mtime is not part of it).
"""

from __future__ import annotations

import hashlib
import os

from .errors import AssetError

FULL_BYTES = 4 << 20
EDGE_BYTES = 1 << 20
BLOCK_BYTES = 64 << 10
SAMPLES = 16


def _file_digest(h, path: str, size: int) -> None:
    with open(path, "rb") as f:
        if size <= FULL_BYTES:
            h.update(f.read())
            return
        h.update(f.read(EDGE_BYTES))
        for i in range(1, SAMPLES + 1):
            f.seek(size * i // (SAMPLES + 1))
            h.update(f.read(BLOCK_BYTES))
        f.seek(size - EDGE_BYTES)
        h.update(f.read(EDGE_BYTES))


def directory_fingerprint(path: str) -> str:
    """``sha256:<hex>`` of the content of directory ``path`` (see the module docstring); AssetError if it is not a
    readable directory."""
    if not os.path.isdir(path):
        raise AssetError(f"{path}: not a directory, nothing to fingerprint")
    h = hashlib.sha256()
    try:
        for name in sorted(os.listdir(path)):
            full = os.path.join(path, name)
            if name.startswith(".") or not os.path.isfile(full):
                continue
            size = os.path.getsize(full)
            h.update(f"{name}\0{size}\0".encode("utf-8", "surrogateescape"))
            _file_digest(h, full, size)
    except OSError as exc:
        raise AssetError(f"{path}: cannot read for fingerprinting ({exc})") from None
    return "sha256:" + h.hexdigest()


__all__ = ["directory_fingerprint"]
