"""The draft side of speculative decoding: EAGLE-3 tree growth (``grow``) and the per-round proposer.

Terms (root, node, draft, accepted, bonus, committed, bucket) are those of ``mindspore_eagle.tree``. Here also:
  candidate       a scored (token, parent) pair produced by growth; the best ones become the tree's nodes.
  frontier        the ``top_k`` candidates of one level that are expanded into the next level.
  recycled hidden the head's output before its final norm; the hidden input of the next draft level.
  entry           one row of the draft's committed context: (token at p + 1, teacher features at p).
"""

from .grow import GrownTree, TreeGrowCell, select_tree
from .proposer import Eagle3Proposer, default_head_dir, draft_cache_len, load_head, load_proposer

__all__ = ["Eagle3Proposer", "GrownTree", "TreeGrowCell", "default_head_dir", "draft_cache_len", "load_head",
           "load_proposer", "select_tree"]
