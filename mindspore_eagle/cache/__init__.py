"""KV cache for speculative rounds: committed prefix + one speculative bucket, committed by length or by path.

See ``kv_cache`` for the design note (layout, which rows are written when) and ``commit`` for the in-graph
row moves. Terms (committed, root, node, accepted, bucket) are those of ``mindspore_eagle.tree``.
"""

from .commit import MOVE_BUCKETS, CommitMode, PathCommit, check_path, move_bucket, path_moves
from .kv_cache import BranchableKVCache, CacheState

__all__ = ["BranchableKVCache", "CacheState", "CommitMode", "MOVE_BUCKETS", "PathCommit", "check_path",
           "move_bucket", "path_moves"]
