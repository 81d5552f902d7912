"""Dynamic tree growth (EAGLE-2/3): expand the most probable branches level by level, keep the best nodes.

Algorithm (``TreeBudget(max_nodes, depth, top_k)``; scores are cumulative draft log-probabilities, so a node
scores ``log p(path from the root)``):
  level 1   the ``top_k`` most likely children of the root, from the logits at the draft's last committed
            entry (the root's own entry). They are the first *frontier*.
  level d+1 the frontier (``top_k`` nodes at depth d) is fed to the head in one forward; each frontier node
            proposes its ``top_k`` best children, giving ``top_k**2`` candidates; the ``top_k`` of those with
            the highest cumulative score become the next frontier. ``depth - 1`` forwards in all.
  select    among all ``top_k + (depth - 1) * top_k**2`` candidates, keep the best ``max_nodes - 1`` by score,
            only together with their ancestors, and emit them in level order under the root (node 0).

In graph: ``TreeGrowCell`` runs the whole growth (root logits, every level's forward, top-k and the next
frontier) as one compiled graph per budget; every shape follows from the budget. The frontier's attention
mask is built in graph from an ancestor table over this round's tree rows, so no host round trip happens
between levels. On the host: ``select_tree`` (numpy, <= a few hundred candidates) makes the final pick and
enforces ancestor closure explicitly. Ties: log-probs are <= 0, so a child never outscores its parent, but it
can *equal* it (a probability that rounds to 1); selection is best-first from the root (the next node kept is
the best candidate whose parent is kept, ties to the lower index = shallower), so the kept set is always a
tree and, with non-increasing path scores, exactly the top ``max_nodes - 1``.

Draft-cache rows of one growth (L = the draft's committed length; its last entry, position L - 1, is the
root's; ``base`` = the first row of the sequence's region, 0 for a single-sequence draft): the level-d frontier is
written at rows ``base + L + (d-1)*top_k + j`` (j = frontier slot) with position ``L + d - 1``; it sees the committed
rows plus the rows of its own ancestors and itself. The caller reserves those ``(depth - 1) * top_k`` rows and drops
them afterwards.

Candidate numbering (the graph's output order; 0 is the root): level 1 = ids ``1..k``; level ``d >= 2`` =
``1 + k + (d-2)*k*k + f*k + c`` for child c of frontier slot f. Example, k=2, depth=2: ids 1, 2 (level 1),
then 3, 4 (children of frontier slot 0 = node 1) and 5, 6 (children of node 2). A parent id is always
smaller than its child's.
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ..draft_config import TreeBudget
from ..tree.layout import ROOT, TreeLayout
from ..tree.mask import MASK_VALUE
from .merge import best_first, children_of


class TreeGrowCell(nn.Cell):
    """``construct(root_hidden [B, H], committed_len [B], base [B]) -> (scores, tokens, parents)``, each ``[B, C]``.

    ``B`` sequences grow at once (``batch``, static: one graph per batch size), each in its own region of the
    draft's cache: sequence ``b``'s committed entries are rows ``[base[b], base[b] + committed_len[b])`` and its
    tree rows start right above them. A single-sequence proposer has ``B = 1`` and ``base = 0``; the batch engine
    gives each request slot its region (``serving.slot_heads``). A node sees its own sequence's committed rows plus
    its tree ancestors and itself, nothing of the other sequences. ``committed_len`` and ``base`` are int64.
    Outputs per sequence, ``C = num_candidates``: cumulative log-probability (float32), target-vocabulary token
    (int32) and parent candidate id (int32, 0 = root; see the module docstring for the numbering).

    ``draft`` is any Cell with ``decode(embeds, hidden, positions, mask, cache_rows)``, ``compute_logits``,
    ``to_target`` and ``hidden_size`` (``Eagle3DraftHead``, or a stub in tests). ``embed_table [vocab, H]`` is
    the token-embedding Parameter the draft reads (usually the teacher's, shared, not copied).

    The embedding table is held, not passed per call: a Parameter given as a graph *input* to a graph that
    also writes Parameters (the draft's KV cache) costs about one extra full copy of it per call (measured
    ~2x the whole growth at the default teacher's 49152 x 576 table). The wrapper is built with
    ``auto_prefix=False`` so that holding the draft and the table renames none of their parameters.
    """

    def __init__(self, draft, embed_table: Parameter, budget: TreeBudget, max_len: int, batch: int = 1):
        super().__init__(auto_prefix=False)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"TreeGrowCell batch={batch!r}: must be an integer >= 1")
        self.draft = draft
        self.embed_table = embed_table
        self.k = budget.top_k
        self.depth = budget.depth
        self.max_len = max_len
        self.batch = batch
        self.hidden_size = draft.hidden_size
        k, rows = budget.top_k, max(budget.tree_rows, 1)
        self.num_rows = budget.tree_rows
        # blocks[d][j, d*k + j] = 1: frontier slot j of level d+1 sits in tree row d*k + j.
        blocks = np.zeros((max(budget.depth - 1, 1), k, rows), np.float32)
        for d in range(budget.depth - 1):
            blocks[d, np.arange(k), d * k + np.arange(k)] = 1.0
        self.blocks = Tensor(blocks)
        self.slots = Tensor(np.arange(k, dtype=np.int32))

    def frontier_mask(self, anc, committed_len, base):
        """Additive mask ``[1, 1, B*k, max_len]``: per sequence b, its committed rows ``[base, base + L)`` plus the
        tree rows of each frontier node's ancestors-or-self (``anc [B, k, R]``, 1.0 = visible, tree row r = cache
        row base + L + r).

        Example, one sequence, k=2, base=0, L=3, R=4, max_len=8: column c maps to tree row r = c - 3, clamped into
        [0, R) before the gather and hidden outside it: r = [-3 -2 -1 0 1 2 3 4] -> gathered [0 0 0 0 1 2 3 3], kept
        c = 3..6.
        """
        b, k, c = self.batch, self.k, self.max_len
        cols = ops.arange(c, dtype=ms.int64).reshape(1, c)  # [1, C]
        start = base.reshape(b, 1)
        end = start + committed_len.reshape(b, 1)
        committed = ops.logical_and(cols >= start, cols < end)  # [B, C]
        r = cols - end  # [B, C]
        in_tree = ops.logical_and(r >= 0, r < self.num_rows)
        r_safe = ops.broadcast_to(ops.minimum(ops.maximum(r, 0), self.num_rows - 1).reshape(b, 1, c), (b, k, c))
        tree = ops.logical_and(ops.gather_d(anc, 2, r_safe) > 0.5, in_tree.reshape(b, 1, c))  # [B, k, C]
        visible = ops.logical_or(tree, committed.reshape(b, 1, c))
        mask = ops.select(visible, ops.zeros(visible.shape, ms.float32),
                          ops.full(visible.shape, float(MASK_VALUE), dtype=ms.float32))
        return mask.reshape(1, 1, b * k, c)

    def construct(self, root_hidden, committed_len, base):
        b, k, h = self.batch, self.k, self.hidden_size
        logp = ops.log_softmax(self.draft.compute_logits(root_hidden), -1)  # [B, Vd]
        scores, draft_ids = ops.topk(logp, k)  # [B, k] best children of each root
        tokens = self.draft.to_target(draft_ids.reshape(b * k)).reshape(b, k)  # target ids
        all_scores, all_tokens = (scores,), (tokens,)
        all_parents = (ops.zeros((b, k), ms.int32),)
        front_ids = ops.broadcast_to((self.slots + 1).reshape(1, k), (b, k))  # frontier ids (level 1: 1..k)
        hidden = ops.broadcast_to(root_hidden.reshape(b, 1, h), (b, k, h))  # each node's input: its parent's output
        anc = ops.broadcast_to(self.blocks[0].reshape(1, k, -1), (b, k, self.blocks.shape[2]))  # [B, k, R]
        first_row = base + committed_len  # [B] the first tree row of each sequence
        for d in range(1, self.depth):  # feed the level-d frontier, score level d+1
            level_base = 1 + k + (d - 1) * k * k  # candidate id of the first level-(d+1) candidate
            pos = ops.broadcast_to(ops.cast(committed_len + (d - 1), ms.int32).reshape(b, 1), (b, k))
            rows = ops.cast(first_row + (d - 1) * k, ms.int32).reshape(b, 1) + self.slots.reshape(1, k)  # [B, k]
            mask = self.frontier_mask(anc, committed_len, base)  # the level-d frontier sits at position L + d - 1
            embeds = ops.gather(self.embed_table, tokens.reshape(b * k), 0).reshape(1, b * k, -1)
            out = self.draft.decode(embeds, hidden.reshape(1, b * k, h), pos.reshape(1, b * k), mask,
                                    rows.reshape(1, b * k)).reshape(b * k, h)
            logp = ops.log_softmax(self.draft.compute_logits(out), -1)  # [B*k, Vd]
            child_logp, child_ids = ops.topk(logp, k)  # [B*k, k]
            cu = (child_logp.reshape(b, k, k) + scores.reshape(b, k, 1)).reshape(b, k * k)  # frontier-major
            child_tokens = self.draft.to_target(child_ids.reshape(b * k * k)).reshape(b, k * k)
            all_scores += (cu,)
            all_tokens += (child_tokens,)
            all_parents += (ops.broadcast_to(front_ids.reshape(b, k, 1), (b, k, k)).reshape(b, k * k),)
            if d < self.depth - 1:
                scores, sel = ops.topk(cu, k)  # next frontier: best k of the k*k, per sequence
                parent_slot = ops.floor_div(sel, k)  # [B, k] frontier slot each winner descends from
                tokens = ops.gather_d(child_tokens, 1, sel)
                hidden = ops.gather_d(out.reshape(b, k, h), 1,
                                      ops.broadcast_to(parent_slot.reshape(b, k, 1), (b, k, h)))
                front_ids = ops.cast(sel, ms.int32) + level_base
                r = anc.shape[2]
                anc = ops.maximum(ops.gather_d(anc, 1, ops.broadcast_to(parent_slot.reshape(b, k, 1), (b, k, r))),
                                  self.blocks[d].reshape(1, k, r))
        return (ops.concat(all_scores, 1), ops.cast(ops.concat(all_tokens, 1), ms.int32),
                ops.concat(all_parents, 1))


@dataclass(frozen=True)
class GrownTree:
    """A selected draft tree: the layout (node 0 = root), each node's cumulative draft log-prob and the
    candidate id it came from (``draft.grow`` numbering; 0 for the root)."""

    layout: TreeLayout
    scores: np.ndarray  # float32 [N]; scores[0] == 0 (the root is given)
    candidate_ids: np.ndarray  # int64 [N]; increasing, candidate_ids[0] == 0


def select_tree(root_token: int, scores: np.ndarray, tokens: np.ndarray, parents: np.ndarray,
                max_nodes: int) -> GrownTree:
    """Keep the best ``max_nodes - 1`` candidates (ancestor-closed) and lay them out under the root.

    ``scores, tokens, parents [C]``: candidate ``i`` has id ``i + 1`` and parent id ``parents[i]`` (0 = root,
    always ``< i + 1``). Best-first from the root: the next node kept is the best-scored candidate whose
    parent is already kept (ties: lower id first, so a parent precedes an equally scored child). Scores
    along a path never increase, so this is exactly the top ``max_nodes - 1`` by score; it stays a tree
    whatever the scores are (NaN ranks last). Kept candidates are re-indexed in id order, which is level
    order, so parents precede children. Example: scores [-0.1, -0.5, -0.3], parents [0, 0, 1], max_nodes 3
    -> ids 1 and 3 kept: tokens [root, t1, t3], parents [0, 0, 1].
    """
    scores = np.asarray(scores, np.float32)
    parents = np.asarray(parents, np.int64)
    tokens = np.asarray(tokens, np.int64)
    c = scores.shape[0]
    taken = best_first(children_of([ROOT] + parents.tolist()), [np.inf] + scores.tolist(), max_nodes)
    kept = np.zeros(c + 1, np.bool_)  # by candidate id; id 0 is the root
    kept[taken] = True
    ids = np.flatnonzero(kept[1:]) + 1  # ascending = level order
    new_index = np.zeros(c + 1, np.int64)
    new_index[ids] = np.arange(1, ids.size + 1)
    layout = TreeLayout.from_parents(np.concatenate([[root_token], tokens[ids - 1]]),
                                     np.concatenate([[ROOT], new_index[parents[ids - 1]]]))
    return GrownTree(layout, np.concatenate([[0.0], scores[ids - 1]]).astype(np.float32),
                     np.concatenate([[ROOT], ids]).astype(np.int64))


__all__ = ["GrownTree", "TreeGrowCell", "select_tree"]
