"""Atomic directory writes: a model or head directory appears complete or not at all.

Files are written into a temporary sibling directory; only when everything succeeded is it renamed into place
(an existing directory is replaced only at that moment). Any failure removes the temporary directory, so a
failed conversion or export leaves nothing behind and never a half-written file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Iterator

from .errors import EagleError


@contextmanager
def atomic_directory(out_dir: str, overwrite: bool, error: type[EagleError]) -> Iterator[str]:
    """Yield a temporary directory to fill; rename it to ``out_dir`` when the block succeeds.

    A non-empty existing ``out_dir`` without ``overwrite`` raises ``error`` before anything is written.
    """
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir) and os.listdir(out_dir) and not overwrite:
        raise error(f"{out_dir} already exists and is not empty (pass overwrite=True / --overwrite)")
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-" + os.path.basename(out_dir) + "-", dir=parent)
    try:
        yield tmp
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; the result is an ordinary directory
        for name in os.listdir(tmp):  # MindSpore writes checkpoints read-only for the owner
            os.chmod(os.path.join(tmp, name), 0o644)
        if os.path.exists(out_dir):
            old = tmp + ".old"
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
