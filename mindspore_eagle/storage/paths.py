"""Where the project keeps what it builds and caches on this machine (models, kernels): one root, one rule.

A module of its own, importing nothing of the package, so the low layers that need the root (the kernel
builder) do not import ``assets`` (which imports the converters, which import the models and the kernels).
"""

from __future__ import annotations

import os


def home() -> str:
    """Root of cached assets: ``$MINDSPORE_EAGLE_HOME`` or ``~/.cache/mindspore_eagle``."""
    return os.environ.get("MINDSPORE_EAGLE_HOME") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                   "mindspore_eagle")
