"""The draft side of speculative decoding: EAGLE-3 tree growth (``grow``) and its proposer, model-free suffix
drafting (``suffix``), one tree from both (``merge``), the per-step node budget (``budget``) and the proposer
that combines them (``hybrid``); ``replay`` runs a proposer offline against a known greedy output.

Terms (root, node, draft, accepted, bonus, committed, bucket) are those of ``mindspore_eagle.tree``. Here also:
  candidate       a scored (token, parent) pair produced by growth; the best ones become the tree's nodes.
  frontier        the ``top_k`` candidates of one level that are expanded into the next level.
  recycled hidden the head's output before its final norm; the hidden input of the next draft level.
  entry           one row of the draft's committed context: (token at p + 1, teacher features at p).
  occurrence      an earlier place in the conversation where the sequence's last tokens also appeared; its
                  continuation is a suffix draft.
  p               a candidate's estimated probability that the teacher accepts its whole path from the root.
  source          which draft proposed a node: the EAGLE head, the suffix index, or both.
"""

from .budget import VerifyCosts
from .grow import GrownTree, TreeGrowCell, select_tree
from .hybrid import HybridProposer
from .merge import CandidateTree, merge_trees
from .proposer import Eagle3Proposer, default_head_dir, draft_cache_len, load_head, load_proposer
from .suffix import SuffixConfig, SuffixIndex

__all__ = ["CandidateTree", "Eagle3Proposer", "GrownTree", "HybridProposer", "SuffixConfig", "SuffixIndex",
           "TreeGrowCell", "VerifyCosts", "default_head_dir", "draft_cache_len", "load_head", "load_proposer",
           "merge_trees", "select_tree"]
