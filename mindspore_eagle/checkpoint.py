"""Strict loading of converted model directories into Cells.

``ms.load_param_into_net`` silently skips what does not match; here every missing, unexpected or
mis-shaped tensor is reported in one ``CheckpointError`` before any weight is assigned.
"""

from __future__ import annotations

import os

from .errors import CheckpointError

CKPT_NAME = "model.ckpt"


def load_strict(params: dict, ckpt_path: str) -> None:
    """Assign the tensors of ``ckpt_path`` to ``params`` (name -> Parameter), all or nothing."""
    import mindspore as ms

    if not os.path.isfile(ckpt_path):
        raise CheckpointError(f"{ckpt_path}: checkpoint file not found")
    try:
        loaded = ms.load_checkpoint(ckpt_path)
    except Exception as exc:  # MindSpore raises ValueError/RuntimeError for truncated or foreign files
        raise CheckpointError(f"{ckpt_path}: cannot read MindSpore checkpoint ({type(exc).__name__}: {exc})") from None
    missing = sorted(set(params) - set(loaded))
    unexpected = sorted(set(loaded) - set(params))
    misshaped = sorted(f"{n}: got {tuple(loaded[n].shape)}, expected {tuple(params[n].shape)}"
                       for n in set(params) & set(loaded) if tuple(loaded[n].shape) != tuple(params[n].shape))
    if missing or unexpected or misshaped:
        raise CheckpointError(f"{ckpt_path}: does not match the model; missing {missing}; unexpected {unexpected}; "
                              f"mis-shaped {misshaped}")
    for name, p in params.items():
        p.set_data(loaded[name].astype(p.dtype))
