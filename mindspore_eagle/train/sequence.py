"""One teacher-generated sequence as the trainer reads it: the record shared by the generator
(``train.batch_greedy``, which produces it) and the shard store (``train.data``, which writes and loads it).
Its own module so that neither of the two imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Sequence_:
    """One generated sequence with what training needs (see the module docstring for shapes)."""

    pid: str
    tokens: np.ndarray  # [N] int32
    prompt_len: int
    features: np.ndarray  # [N-1, 3H] fp16
    topk_ids: np.ndarray  # [N-1, k] int32
    topk_logits: np.ndarray  # [N-1, k] fp16
