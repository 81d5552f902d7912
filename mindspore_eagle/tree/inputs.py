"""``ForwardInputs``: what one static-shape forward receives, built from a tree by the one padding rule.

Every forward of a cached Cell -- a prefill chunk, a decode step, a tree verification, a draft-head context
chunk -- writes ``bucket`` consecutive cache rows from the committed length ``L`` and takes four arrays of that
many rows. They are all built here, from a ``TreeLayout`` (a prefill or context chunk is ``TreeLayout.chain``;
a decode step is ``TreeLayout.single``), so there is exactly one padding rule:

    layout.padded(bucket)      padding rows after the real nodes: token PAD_TOKEN, parent ROOT, depth PAD_DEPTH
    ids        [1, bucket]     the padded layout's tokens
    positions  [1, bucket]     L + depth (RoPE position): a real node at depth d has position L + d
    rows       [1, bucket]     L + i: node i (real or padding) writes cache row L + i
    mask       [1, 1, bucket, width]  ``tree_attention_mask`` over cache rows ``[0, width)``: a real node sees the
               committed prefix and its ancestors-or-self; a padding row sees the prefix and itself; no real row
               sees a padding row. ``width >= L + bucket``: the whole cache, or the context bucket the teacher
               picks (``Teacher.mask_width``; rows past it are never attended)

Example: L = 3, chain [5, 7], bucket 4 (cache 8): ids [5, 7, 0, 0], positions [3, 4, 4, 4], rows [3, 4, 5, 6];
row 1 sees columns 0-4, padding row 2 sees columns 0-2 and 5. Padding therefore never changes a real row's
output, its outputs are dropped (``num_real``), and its cache rows lie inside the round ``[L, L + bucket)``
that the cache reserved (``BranchableKVCache.begin_round``, the one capacity check).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mindspore_eagle.tree.layout import TreeLayout
from mindspore_eagle.tree.mask import tree_attention_mask


@dataclass(frozen=True, eq=False)
class ForwardInputs:
    """The four arrays of one forward (batch 1) and how many of its rows are real (rows ``[0, num_real)``)."""

    ids: np.ndarray  # int32 [1, bucket]
    positions: np.ndarray  # int32 [1, bucket]
    rows: np.ndarray  # int32 [1, bucket] cache rows written
    mask: np.ndarray  # float32 [1, 1, bucket, width] additive
    num_real: int

    @property
    def bucket(self) -> int:
        return int(self.ids.shape[1])

    @classmethod
    def for_tree(cls, layout: TreeLayout, committed_len: int, bucket: int, width: int) -> "ForwardInputs":
        """The inputs that verify (or, for a chain, prefill) ``layout`` at committed length ``L`` in ``bucket``
        rows, with a mask over cache rows ``[0, width)``. ``layout`` has only real nodes; rows ``[L, L + bucket)``
        must be the round the cache reserved."""
        n = layout.num_nodes
        padded = layout.padded(bucket)
        ids = padded.tokens.astype(np.int32)[None, :]
        positions = padded.positions(committed_len).astype(np.int32)[None, :]
        rows = (committed_len + np.arange(bucket, dtype=np.int32))[None, :]
        mask = tree_attention_mask(padded, committed_len, width)
        return cls(ids, positions, rows, mask, n)


__all__ = ["ForwardInputs"]
