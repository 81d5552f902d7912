"""``SlotHeads``: one EAGLE-3 head drafting for every request slot of the batch engine, its growth batched.

Why this shape. The single-request proposer (``draft.Eagle3Proposer``) owns the whole head cache: entry ``p`` of
the draft's context sits at row ``p``. The batch engine runs many requests, each needing its own draft context, and
the head's weights (the draft-vocabulary ``lm_head`` above all) are the expensive part, so they are loaded once and
the cache is split the way the teacher's is (``serving.batch``): request slot ``s`` owns head rows
``[s * region, (s + 1) * region)``, ``region = slot_len + tree_rows`` (the slot's committed entries, which follow
its teacher rows one for one, plus one growth's tree rows above them), and a scratch region past the slots takes the
padding sequences of a batched growth and the warm-up's writes.

Each slot's draft (``SlotDraft``) has ``Eagle3Proposer``'s protocol for a ``HybridProposer`` -- ``reset``,
``extend`` (the context forward, its rows and mask shifted into the slot's region) and ``candidates`` -- so the
hybrid drafting logic is the single-request one. ``grow`` runs every request that grows this step in one
``TreeGrowCell`` graph of batch ``B`` (a power of two >= their count; padding sequences grow in scratch rows):
the head's decode and draft-vocabulary projection see ``B * top_k`` rows at once instead of ``top_k`` rows ``B``
times. A sequence's candidates depend only on its own rows (the mask; the kernels' batch invariance), so they
equal what its own growth would give (``tests/test_slot_heads.py``), and verification keeps every request
lossless whatever the drafts are.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np
from mindspore import Parameter, Tensor

from ..cache.kv_cache import CacheState
from ..draft.grow import TreeGrowCell
from ..draft.proposer import ContextForwardCell, check_entries
from ..draft_config import TreeBudget
from ..errors import ConfigError
from ..runtime import Buckets, ExecMode
from ..tree.inputs import ForwardInputs
from ..tree.layout import TreeLayout
from ..tree.mask import MASK_VALUE


def growth_batches(max_seqs: int) -> tuple[int, ...]:
    """Batch sizes of the growth graphs: powers of two up to the first that holds ``max_seqs`` (one graph each)."""
    sizes = [1]
    while sizes[-1] < max_seqs:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


class SlotHeads:
    """The shared head and its per-slot draft contexts (module docstring).

    ``head``: an ``Eagle3DraftHead`` whose cache holds ``SlotHeads.cache_rows(...)`` rows; ``embed_table``: the
    embedding Parameter it reads (the teacher's, shared); ``budget``: the growth (``depth``, ``top_k``; its
    ``max_nodes`` is not used: the engine's global budget selects); ``buckets``: the context forward's chunk buckets
    (the teacher runtime's)."""

    def __init__(self, head, embed_table, budget: TreeBudget, max_seqs: int, slot_len: int, buckets: Buckets,
                 exec_mode: ExecMode = ExecMode.PERFORMANCE):
        need = self.cache_rows(max_seqs, slot_len, budget, buckets.largest)
        if head.batch_size != 1:
            raise ConfigError(f"SlotHeads packs every slot into one batch entry; the head was built for batch_size="
                              f"{head.batch_size}")
        if head.max_len < need:
            raise ConfigError(f"SlotHeads: {max_seqs} slots of {slot_len} rows need a head cache of {need} rows "
                              f"(SlotHeads.cache_rows); it has {head.max_len}")
        budget.check_vocab(head.cfg.draft_vocab_size)
        if not isinstance(embed_table, Parameter):
            embed_table = Parameter(embed_table, name="draft_embed_table", requires_grad=False)
        exec_mode = ExecMode.parse(exec_mode)
        self.head, self.budget, self.buckets = head, budget, buckets
        self.max_seqs, self.slot_len = max_seqs, slot_len
        self.region = slot_len + budget.tree_rows
        self.scratch = max_seqs * self.region
        self.width = head.max_len
        self.batches = growth_batches(max_seqs)
        self._context = exec_mode.compile(ContextForwardCell(head, embed_table))
        self._grow = {b: exec_mode.compile(TreeGrowCell(head, embed_table, budget, head.max_len, b))
                      for b in self.batches}
        self.growths = 0  # batched growth graphs run (a count for tests and the bench)
        self.grown = 0  # sequences grown in them

    @staticmethod
    def cache_rows(max_seqs: int, slot_len: int, budget: TreeBudget, largest_bucket: int) -> int:
        """Head cache rows: ``max_seqs`` regions of ``slot_len + tree_rows`` plus the scratch region (a padding
        sequence's tree rows per growth batch slot, or the largest context chunk of the warm-up, whichever is more)."""
        pad = growth_batches(max_seqs)[-1] * budget.tree_rows
        return max_seqs * (slot_len + budget.tree_rows) + max(pad, largest_bucket)

    def slot(self, s: int) -> "SlotDraft":
        """A fresh draft context over slot ``s``'s region (the request admitted to it owns it until it finishes)."""
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < self.max_seqs:
            raise ConfigError(f"SlotHeads.slot({s!r}): must be an integer in [0, {self.max_seqs})")
        return SlotDraft(self, s)

    # ----- forwards -------------------------------------------------------------------------------------
    def context_forward(self, base: int, tokens: np.ndarray, feats: np.ndarray, committed_len: int,
                        bucket: int) -> np.ndarray:
        """Write the chain ``tokens`` (with the teacher ``feats``) as entries ``committed_len ..`` of the region
        at ``base``, padded to ``bucket`` rows; returns the head's outputs ``[bucket, H]``. The caller reserved
        the rows."""
        size = tokens.shape[0]
        span = min(self.region, self.width - base)  # a slot's region, or the scratch rows (the warm-up)
        local = ForwardInputs.for_tree(TreeLayout.chain(tokens), committed_len, bucket, span)
        mask = np.full((1, 1, bucket, self.width), MASK_VALUE, np.float32)
        mask[..., base:base + span] = local.mask
        x = np.zeros((1, bucket, feats.shape[1]), np.float32)  # padding rows get zero features
        x[0, :size] = feats
        out = self._context(Tensor(local.ids), Tensor(x), Tensor(local.positions), Tensor(mask),
                            Tensor(local.rows + np.int32(base)))
        return out.asnumpy()[0]

    def grow(self, drafts: Sequence["SlotDraft"]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """One batched growth over ``drafts`` (each with a context; their regions distinct): every draft's
        ``(scores, tokens, parents)``, as ``Eagle3Proposer.candidates`` gives them."""
        n = len(drafts)
        if n == 0:
            return []
        if len({d.slot for d in drafts}) != n:
            raise ConfigError("SlotHeads.grow: a slot appears twice in one growth")
        b = next((size for size in self.batches if size >= n), None)
        if b is None:
            raise ConfigError(f"SlotHeads.grow: {n} drafts, more than the {self.max_seqs} slots")
        rows = self.budget.tree_rows
        hidden = np.zeros((b, self.head.hidden_size), np.float32)  # padding sequences: zero hidden, no context
        lengths = np.zeros(b, np.int64)
        bases = self.scratch + rows * np.arange(b, dtype=np.int64)
        for i, d in enumerate(drafts):
            if d._root_hidden is None:
                raise ConfigError("propose before begin: the draft has no context")
            hidden[i] = d._root_hidden
            lengths[i] = d.state.committed_len
            bases[i] = d.base
        opened = []
        try:
            if rows:
                for d in drafts:
                    d.state.reserve(rows)  # CacheCapacityError before anything is written
                    opened.append(d)
            scores, tokens, parents = self._grow[b](Tensor(hidden), Tensor(lengths), Tensor(bases))
        finally:
            for d in opened:
                d.state.rollback(d.state.committed_len)  # the tree rows are dropped straight away
        self.growths += 1
        self.grown += n
        scores, tokens, parents = scores.asnumpy(), tokens.asnumpy(), parents.asnumpy()
        return [(scores[i], tokens[i], parents[i]) for i in range(n)]

    def warm_up(self) -> float:
        """Compile the context forward at every bucket and the growth at every batch size (``warm_up_steps``);
        returns the seconds it took."""
        t0 = time.perf_counter()
        for _, run in self.warm_up_steps():
            run()
        return time.perf_counter() - t0

    def warm_up_steps(self) -> list[tuple[str, Callable[[], None]]]:
        """The warm-up as labelled steps in one fixed order, one graph each, writing scratch rows only."""
        width = 3 * self.head.cfg.target_hidden_size

        def context(bucket: int) -> Callable[[], None]:
            return lambda: self.context_forward(self.scratch, np.zeros(bucket, np.int64),
                                                np.zeros((bucket, width), np.float32), 0, bucket)

        def growth(b: int) -> Callable[[], None]:
            bases = self.scratch + self.budget.tree_rows * np.arange(b, dtype=np.int64)
            return lambda: self._grow[b](Tensor(np.zeros((b, self.head.hidden_size), np.float32)),
                                         Tensor(np.zeros(b, np.int64)), Tensor(bases))

        return ([(f"slot heads context b={bucket}", context(bucket)) for bucket in self.buckets.sizes]
                + [(f"slot heads growth B={b} {self.budget}", growth(b)) for b in self.batches])


class SlotDraft:
    """One slot's draft context: ``Eagle3Proposer``'s ``reset`` / ``extend`` / ``candidates`` over the slot's
    region of a ``SlotHeads`` cache (the ``eagle`` a batch request's ``HybridProposer`` holds)."""

    def __init__(self, heads: SlotHeads, slot: int):
        self.heads, self.slot = heads, slot
        self.base = slot * heads.region
        self.state = CacheState(heads.region)
        self._root: int | None = None
        self._root_hidden: np.ndarray | None = None

    @property
    def committed_len(self) -> int:
        return self.state.committed_len

    def reset(self) -> None:
        self.state.reset()
        self._root = None
        self._root_hidden = None

    def extend(self, next_tokens: Sequence[int], features: np.ndarray) -> None:
        """Append entries ``(next_tokens[i], features[i])`` (``Eagle3Proposer.extend``), in chunks of a bucket."""
        heads = self.heads
        tokens, feats = check_entries(heads.head.cfg, next_tokens, features)
        off = 0
        room = heads.slot_len - self.committed_len
        for size, bucket in heads.buckets.chunks(tokens.shape[0], heads.buckets.largest, room):
            L = self.state.reserve(bucket)  # CacheCapacityError before anything is written
            try:
                hidden = heads.context_forward(self.base, tokens[off:off + size], feats[off:off + size], L, bucket)
            except BaseException:
                self.state.abort()
                raise
            self.state.advance(size)
            off += size
            self._root = int(tokens[off - 1])
            self._root_hidden = hidden[size - 1]

    def candidates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This slot's growth alone (a batch of one); the engine grows every growing slot together instead."""
        return self.heads.grow([self])[0]


__all__ = ["SlotDraft", "SlotHeads", "growth_batches"]
