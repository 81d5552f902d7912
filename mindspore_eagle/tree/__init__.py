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
  draft      a token proposed by a draft (the EAGLE-3 head or a suffix match); every non-root real node is one.
  accepted   draft tokens the teacher's verification keeps: a root-to-node path of the tree.
  bonus      the teacher's own token after the last accepted node; it becomes the next step's root.
  bucket     a fixed row count (``runtime.Buckets``) that every forward is padded to: one graph per bucket.
  padding    rows appended to fill a bucket: ``valid == False``, parent 0, depth 1; no real node sees them.
  pad slot   ``PAD_SLOT`` (= 0, the root's index): fills unused ancestor-table entries instead of -1.

Data flow of one verification (``engine.SpeculativeEngine._step``): proposer -> ``check_tree`` ->
``ForwardInputs.for_tree`` (``layout.padded(bucket)``, positions, rows, ``tree_attention_mask``) -> teacher forward.
Prefill chunks and draft context chunks are ``TreeLayout.chain`` trees and go through the same builder.
"""

from mindspore_eagle.tree.inputs import ForwardInputs
from mindspore_eagle.tree.invariants import check_tree
from mindspore_eagle.tree.layout import PAD_DEPTH, PAD_SLOT, PAD_TOKEN, ROOT, TreeLayout, compute_depth
from mindspore_eagle.tree.mask import ascend_tree_mask, tree_attention_mask, tree_attention_visibility, tree_visibility

__all__ = [
    "ForwardInputs",
    "PAD_DEPTH",
    "PAD_SLOT",
    "PAD_TOKEN",
    "ROOT",
    "TreeLayout",
    "ascend_tree_mask",
    "check_tree",
    "compute_depth",
    "tree_attention_mask",
    "tree_attention_visibility",
    "tree_visibility",
]
