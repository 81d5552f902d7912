"""KV cache for speculative rounds: committed prefix + one speculative bucket, committed by moving only the
out-of-place rows of the accepted path.

See ``kv_cache`` for the design note (layout, which rows are written when) and ``commit`` for the in-graph
row moves. Terms (committed, root, node, accepted, bucket) are those of ``mindspore_eagle.tree``.
"""

from .commit import PathCommit, check_path, path_moves
from .kv_cache import BranchableKVCache, CacheState

__all__ = ["BranchableKVCache", "CacheState", "PathCommit", "check_path", "path_moves"]
