"""Speculative trees: layout, invariant checks and attention masks that are safe on strict accelerators.

The teacher verifies a whole tree of draft continuations in one forward. Reference implementations encode
"no parent" and padding as -1 and rely on negative-index wrap-around, which Ascend gather/scatter kernels
leave undefined. Here every index is non-negative by construction, every shape is a fixed bucket, and the
host checks every rule (``check_tree``) before a graph runs.

Terms (defined once; used with these meanings everywhere in the project):
  committed  tokens whose K/V are already in the cache; ``committed_len`` of them occupy rows [0, committed_len).
  root       node 0: the last accepted token, not yet in the cache; its own parent (``parents[0] == 0``).
  node       one row of a tree: a token, its parent index and depth; real nodes are numbered parents-first.
  depth      number of edges from the root (root 0); a node's RoPE position is ``committed_len + depth``.
  ancestor   a node reached by following parents from a node; "ancestors-or-self" includes the node itself.
  draft      a token proposed by the draft head; every non-root real node is a draft.
  accepted   draft tokens the teacher's verification keeps: a root-to-node path of the tree.
  bonus      the teacher's own token after the last accepted node; it becomes the next step's root.
  bucket     a fixed row count (8/16/32/64) that trees are padded to, so a graph compiles once per bucket.
  padding    rows appended to fill a bucket: ``valid == False``, parent 0, depth 1; no real node sees them.
  pad slot   ``PAD_SLOT`` (= 0, the root's index): fills unused ancestor-table and path entries instead of -1;
             masked out by position (entries past the node's depth), so it is always a safe index.

Data flow: ``TreeLayout.from_levels`` -> ``check_tree`` -> ``.padded(choose_bucket(n))`` ->
``tree_attention_mask`` (host) or ``TreeAttentionMaskCell`` (in graph; identical result) -> teacher forward.
"""

from mindspore_eagle.tree.graph_mask import TreeAttentionMaskCell, TreeMaskCell
from mindspore_eagle.tree.invariants import check_tree
from mindspore_eagle.tree.layout import (
    DEFAULT_BUCKETS,
    PAD_DEPTH,
    PAD_SLOT,
    PAD_TOKEN,
    ROOT,
    TreeLayout,
    choose_bucket,
    compute_depth,
)
from mindspore_eagle.tree.mask import (
    ascend_tree_mask,
    tree_attention_mask,
    tree_attention_mask_prefix,
    tree_attention_visibility,
    tree_block_mask,
    tree_visibility,
)

__all__ = [
    "DEFAULT_BUCKETS",
    "PAD_DEPTH",
    "PAD_SLOT",
    "PAD_TOKEN",
    "ROOT",
    "TreeAttentionMaskCell",
    "TreeLayout",
    "TreeMaskCell",
    "ascend_tree_mask",
    "check_tree",
    "choose_bucket",
    "compute_depth",
    "tree_attention_mask",
    "tree_attention_mask_prefix",
    "tree_attention_visibility",
    "tree_block_mask",
    "tree_visibility",
]
