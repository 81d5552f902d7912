"""``Eagle3Proposer``: the host-side drafting loop that ties the head, its KV cache and tree growth together.

The draft's context (EAGLE's convention). Entry ``p`` of the draft cache pairs the token at teacher position
``p + 1`` with the teacher's features (``aux_hidden``) at position ``p``: the head learns "given what the teacher
computed at p, and the token that followed, what comes next". So after the teacher has committed ``L`` tokens
and produced the root (the token at position L, not yet in its cache), the draft holds ``L`` entries too:
rows ``[0, L)``, the last one pairing the root with the teacher's features at ``L - 1``; its output (the
*recycled hidden*) scores the root's children. The two committed lengths are always equal.

The calls an engine makes (``mindspore_eagle.engine.Proposer``)::

    proposer.begin(prompt, aux[0:P], root)             # once per request: P entries
    layout = proposer.propose(root)                    # TreeLayout, node 0 = root (grow() adds draft scores)
    ... teacher verifies the tree: accepted path [0, a1..ak], bonus b, aux rows of those k+1 path nodes ...
    proposer.accept(acceptance, aux_path)              # k + 1 new entries: a1..ak, b; b is the next root

Speculative rows. Growth writes the tree levels in rows ``[L, L + (depth-1)*top_k)`` and drops them
straight away (rollback to L): the accepted tokens come back through ``accept`` paired with the teacher's
*true* features, which is what the reference implementation does (its ``stable_kv`` never keeps tree
levels) and more accurate than keeping K/V computed from recycled draft hidden states.

Context chunks are ``TreeLayout.chain`` trees padded to one of the runtime's buckets by ``ForwardInputs`` (the
same rule as the teacher's prefill): entry rows are positions, padding rows are dropped.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Sequence

import numpy as np
from mindspore import Parameter, Tensor, nn

from ..compute import ComputeChoice
from ..cache import BranchableKVCache
from ..storage.checkpoint import CKPT_NAME
from ..runtime import Buckets, ExecMode
from ..draft_config import TreeBudget
from ..errors import AssetError, ConfigError, TreeInvariantError
from ..models.eagle3 import Eagle3DraftHead
from ..tree.inputs import ForwardInputs
from ..tree.layout import TreeLayout
from .grow import GrownTree, TreeGrowCell, select_tree


def check_entries(cfg, next_tokens: Sequence[int], features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Draft-context entries ``(next_tokens[i], features[i])`` for a head of config ``cfg``, as int64 tokens and
    float32 features ``[t, 3 * target_hidden_size]``; ConfigError naming the problem before any row is written.
    Shared by every writer of a draft context (``Eagle3Proposer.extend``, ``serving.slot_heads.SlotDraft.extend``)."""
    tokens = np.asarray(next_tokens, np.int64).reshape(-1)
    feats = np.asarray(features, np.float32)
    t = tokens.shape[0]
    if t == 0:
        raise ConfigError("extend: at least one token is required")
    if feats.shape != (t, 3 * cfg.target_hidden_size):
        raise ConfigError(f"extend: features shape {feats.shape}, expected ({t}, {3 * cfg.target_hidden_size}) "
                          "(one row of teacher aux hidden states per token)")
    if tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
        raise ConfigError(f"extend: token ids must be in [0, {cfg.vocab_size})")
    return tokens, feats


def embed_table_for(head: Eagle3DraftHead, teacher):
    """The embedding table ``head`` reads when drafting for ``teacher``: its own when its width differs, else the
    teacher's Parameter (shared, not copied); ConfigError first when the two do not fit (vocabulary, features)."""
    head.cfg.check_teacher(teacher.cfg)
    return head.embed_tokens.weight if head.own_embedding else teacher.cell.model.embed_tokens.weight


def draft_cache_len(context_len: int, budget: TreeBudget) -> int:
    """Rows the head's cache needs for a context of up to ``context_len`` tokens (the teacher's
    ``max_cache_len``): the committed entries plus one growth's tree rows above them."""
    return context_len + budget.tree_rows


class ContextForwardCell(nn.Cell):
    """The head's context forward with the embedding table held, not passed (see ``TreeGrowCell`` for why):
    ``construct(input_ids, features, positions, mask, cache_rows) -> hidden_out``. ``auto_prefix=False``: no
    parameter of the head or of the (shared) table is renamed."""

    def __init__(self, head: Eagle3DraftHead, embed_table: Parameter):
        super().__init__(auto_prefix=False)
        self.head = head
        self.embed_table = embed_table

    def construct(self, input_ids, features, positions, mask, cache_rows):
        return self.head(self.embed_table, input_ids, features, positions, mask, cache_rows)


class Eagle3Proposer:
    """Drafts one tree per round with an ``Eagle3DraftHead``. Batch size 1.

    ``embed_table`` is the token-embedding matrix ``[vocab, H]`` the head reads (the teacher's Parameter, shared
    without a copy, or the head's own when its width differs; ``for_teacher`` picks it; a plain Tensor is
    wrapped in a Parameter). ``exec_mode`` PERFORMANCE compiles the context forward (one graph per bucket of
    ``buckets``, the teacher runtime's) and the growth (one graph per budget); REFERENCE runs both in PyNative.
    The head's cache must hold the longest context plus ``budget.tree_rows`` rows.
    """

    def __init__(self, head: Eagle3DraftHead, embed_table, budget: TreeBudget,
                 exec_mode: ExecMode = ExecMode.PERFORMANCE, buckets: Buckets = Buckets()):
        if head.batch_size != 1:
            raise ConfigError(f"Eagle3Proposer drafts for one sequence; the head was built for batch_size="
                              f"{head.batch_size}")
        vocab, width = tuple(embed_table.shape)
        if (vocab, width) != (head.cfg.vocab_size, head.cfg.hidden_size):
            raise ConfigError(f"embed_table shape {(vocab, width)}: the head needs [vocab_size, hidden_size] = "
                              f"[{head.cfg.vocab_size}, {head.cfg.hidden_size}]")
        budget.check_vocab(head.cfg.draft_vocab_size)
        if budget.tree_rows + 1 > head.max_len:
            raise ConfigError(f"TreeBudget needs {budget.tree_rows} tree rows above the context; the head's cache "
                              f"has max_len={head.max_len} (see draft_cache_len)")
        if not isinstance(embed_table, Parameter):
            embed_table = Parameter(embed_table, name="draft_embed_table", requires_grad=False)
        exec_mode = ExecMode.parse(exec_mode)
        self.head = head
        self.embed_table = embed_table
        self.budget = budget
        self.max_nodes = budget.max_nodes  # the engine's Proposer protocol
        self.buckets = buckets if isinstance(buckets, Buckets) else Buckets(buckets)
        self.cache = BranchableKVCache(head.cache_parameters(), exec_mode)
        self.context_cell = ContextForwardCell(head, embed_table)
        self.grow_cell = TreeGrowCell(head, embed_table, budget, head.max_len)
        self._head_fn = exec_mode.compile(self.context_cell)
        self._grow_fn = exec_mode.compile(self.grow_cell)
        self._root: int | None = None  # token of the last committed entry (the next tree's root)
        self._root_hidden: np.ndarray | None = None  # [H] recycled hidden of that entry
        # context-forward bucket -> seconds of its first call (a graph compile in PERFORMANCE mode)
        self.first_call_s: dict[int, float] = {}

    @classmethod
    def for_teacher(cls, head: Eagle3DraftHead, teacher, budget: TreeBudget) -> "Eagle3Proposer":
        """A proposer drafting for ``teacher`` (a ``Teacher``): checks compatibility (vocabulary, features, and
        that the budget's trees fit the teacher runtime's buckets), shares its embeddings."""
        table = embed_table_for(head, teacher)
        teacher.runtime.check_tree_size(budget.max_nodes)
        need = draft_cache_len(teacher.max_len, budget)
        if head.max_len < need:
            raise ConfigError(f"draft head cache max_len={head.max_len} cannot hold the teacher's context "
                              f"({teacher.max_len}) plus one growth ({budget.tree_rows} rows): build the head with "
                              f"max_len >= {need} (draft_cache_len)")
        return cls(head, table, budget, teacher.runtime.exec_mode, teacher.runtime.buckets)

    # ---- state ---------------------------------------------------------------------------------------
    @property
    def committed_len(self) -> int:
        """Entries in the draft's committed context (equals the teacher's committed length)."""
        return self.cache.committed_len

    @property
    def root_token(self) -> int | None:
        return self._root

    def reset(self) -> None:
        """Forget the context (new conversation)."""
        self.cache.reset()
        self._root = None
        self._root_hidden = None

    # ---- the three calls of a round (the engine's Proposer protocol) ---------------------------------
    def begin(self, prompt: Sequence[int], aux_hidden: np.ndarray, first_token: int) -> None:
        """A new request: the teacher ran ``prompt`` (P tokens), giving ``aux_hidden [P, 3*H_t]`` and the first
        root ``first_token``. Forgets any previous context and writes P entries."""
        self.reset()
        self.extend(list(prompt[1:]) + [int(first_token)], aux_hidden)

    def propose(self, root_token: int) -> TreeLayout:
        """This round's tree under ``root_token`` (which must be the last committed entry's token)."""
        if self._root is not None and int(root_token) != self._root:
            raise TreeInvariantError(f"propose({root_token}): the draft's context ends with token {self._root}; "
                                     "call accept() with every committed token first")
        return self.grow().layout

    def accept(self, acceptance, aux_hidden: np.ndarray) -> None:
        """After verification: ``acceptance.tokens`` are the accepted drafts then the bonus (the next root),
        ``aux_hidden [len(path), 3*H_t]`` the teacher's features at the accepted path's nodes (root first)."""
        self.extend(list(acceptance.tokens), aux_hidden)

    def extend(self, next_tokens: Sequence[int], features: np.ndarray) -> None:
        """Append entries ``(next_tokens[i], features[i])``: each feature row is the teacher's at some position
        p and ``next_tokens[i]`` the token at p + 1. Runs the head in chunks of a context bucket."""
        tokens, feats = check_entries(self.head.cfg, next_tokens, features)
        off = 0
        room = self.cache.max_len - self.committed_len
        for size, bucket in self.buckets.chunks(tokens.shape[0], self.buckets.largest, room):
            L = self.cache.begin_round(bucket)
            inputs = ForwardInputs.for_tree(TreeLayout.chain(tokens[off:off + size]), L, bucket, self.cache.max_len)
            x = np.zeros((1, bucket, feats.shape[1]), np.float32)  # padding rows get zero features
            x[0, :size] = feats[off:off + size]
            t0 = time.perf_counter()
            hidden = self._head_fn(Tensor(inputs.ids), Tensor(x), Tensor(inputs.positions),
                                   Tensor(inputs.mask), Tensor(inputs.rows)).asnumpy()
            self.first_call_s.setdefault(bucket, time.perf_counter() - t0)  # the first call's time: its compile's
            self.cache.commit(range(size))
            off += size
            # the root is always the last committed entry, even if a later chunk fails
            self._root = int(tokens[off - 1])
            self._root_hidden = hidden[0, size - 1]

    def warm_up(self) -> list[int]:
        """Run the context forward once at every bucket it has not run yet (in PERFORMANCE mode: compile it), then
        forget the context; returns those buckets. Why: a ``HybridProposer`` writes into the head, at its next
        growth, every token committed while the suffix branch drafted alone, so any bucket can come up in the
        middle of a request, and the first one would compile there (about 1.1 s for the default head on a 2-core
        CPU: a fifth of a 96-token ``make demo`` generation). Requests a caller times come after this."""
        run = [b for b in self.buckets.sizes if b not in self.first_call_s and b <= self.cache.max_len]
        for b in run:
            self._context_once(b)
        return run

    def warm_up_steps(self) -> list[tuple[str, Callable[[], None]]]:
        """The context forward at every bucket the head's cache holds, as labelled steps in one fixed order (one
        graph each; ``app.compile_plan`` runs them through the compile cache)."""
        return [(f"head context b={b}", lambda b=b: self._context_once(b))
                for b in self.buckets.sizes if b <= self.cache.max_len]

    def _context_once(self, bucket: int) -> None:
        """One context forward of ``bucket`` zero entries, then the context forgotten."""
        self.reset()
        self.extend([0] * bucket, np.zeros((bucket, 3 * self.head.cfg.target_hidden_size), np.float32))
        self.reset()

    def grow(self) -> GrownTree:
        """Grow this round's tree from the root (the last committed entry): the best ``max_nodes`` nodes, with
        their draft scores. Leaves the committed context as it was (the tree rows are written and dropped)."""
        if self._root is None:
            raise ConfigError("propose before begin: the draft has no context")
        if self.budget.max_nodes == 1:
            return GrownTree(TreeLayout.single(self._root), np.zeros(1, np.float32), np.zeros(1, np.int64))
        return select_tree(self._root, *self.candidates(), self.budget.max_nodes)

    def candidates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Run the growth graph: every candidate's ``(scores, target tokens, parent ids)``, each
        ``[budget.num_candidates]`` (numbering in ``draft.grow``). ``grow`` selects from these."""
        if self._root is None:
            raise ConfigError("propose before begin: the draft has no context")
        L, rows = self.committed_len, self.budget.tree_rows
        if rows:
            self.cache.begin_round(rows)  # CacheCapacityError before anything is written
        try:
            scores, tokens, parents = self._grow_fn(Tensor(self._root_hidden[None]), Tensor(np.array([L], np.int64)),
                                                    Tensor(np.zeros(1, np.int64)))
        finally:
            if rows:
                self.cache.rollback(L)
        return scores.asnumpy()[0], tokens.asnumpy()[0], parents.asnumpy()[0]


def default_head_dir() -> str:
    """Where the shipped head for the default teacher lives (``scripts/train_default_head.sh`` writes it)."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(here, "assets", "heads", "smollm2-135m-eagle3")


def resolve_head_dir(draft_dir: str | None) -> str:
    """The head directory to load: ``draft_dir``, or the shipped head's; AssetError naming what to do when it does
    not exist. Builders call it before any weight is read."""
    path = draft_dir or default_head_dir()
    if not os.path.isdir(path):
        if draft_dir is None:
            raise AssetError(f"no default draft head at {path}: train it with scripts/train_default_head.sh or pass "
                             "--draft HEAD_DIR")
        raise AssetError(f"draft head directory {path} does not exist")
    return path


def load_head(path: str, max_len: int, compute: ComputeChoice | None = None) -> Eagle3DraftHead:
    """A head directory in our converted format (``weights.safetensors``) or the public one (converted in memory);
    ``compute``: the teacher's ``ComputeChoice`` (``Teacher.compute``; default primitives and MindSpore's MatMul)."""
    if not os.path.isdir(path):
        raise AssetError(f"draft head directory {path} does not exist")
    if os.path.isfile(os.path.join(path, CKPT_NAME)):
        return Eagle3DraftHead.load(path, max_len=max_len, compute=compute)
    from ..convert.eagle3 import load_public_head

    return load_public_head(path, max_len=max_len, compute=compute)


def load_proposer(draft_dir: str | None, teacher, budget: TreeBudget) -> Eagle3Proposer:
    """The EAGLE-3 proposer for ``teacher``: head from ``draft_dir`` (default: ``default_head_dir()``), its
    cache sized by ``draft_cache_len``, embeddings shared with the teacher, attention and matmul the teacher's."""
    teacher.runtime.check_tree_size(budget.max_nodes)  # before any weight is read
    path = resolve_head_dir(draft_dir)
    head = load_head(path, draft_cache_len(teacher.max_len, budget), teacher.compute)
    return Eagle3Proposer.for_teacher(head, teacher, budget)


__all__ = ["ContextForwardCell", "Eagle3Proposer", "check_entries", "default_head_dir", "draft_cache_len",
           "embed_table_for", "load_head", "load_proposer", "resolve_head_dir"]
