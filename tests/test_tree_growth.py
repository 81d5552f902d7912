"""Dynamic tree growth: a literal tree from hand-set logits, structural properties on random (tie-heavy) logits,
and the real head's in-graph growth equal to a per-branch numpy recomputation of the EAGLE algorithm."""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mindspore import Parameter, Tensor, nn, ops

from mindspore_eagle.draft import Eagle3Proposer, TreeGrowCell, draft_cache_len, select_tree
from mindspore_eagle.draft_config import TreeBudget
from mindspore_eagle.errors import CacheCapacityError, ConfigError, TreeInvariantError
from mindspore_eagle.teacher import setup_mindspore
from mindspore_eagle.tree import check_tree
from mindspore_eagle.verify import Acceptance

from tests.helpers import mapped_head, numpy_growth

setup_mindspore()

STUB_LEN = 64  # the stub ignores its cache; the grow cell still builds masks over this many rows


class StubDraft(nn.Cell):
    """A draft whose next-token log-probs depend only on the parent's token: ``logits = onehot(token) @ table``.

    With the identity as embedding table, ``decode`` returns ``onehot(token)`` (the "recycled hidden") and
    ``compute_logits`` picks row ``token`` of the hand-set ``table [vocab, vocab]``.
    """

    def __init__(self, vocab: int):
        super().__init__()
        self.hidden_size = vocab
        self.table = Parameter(Tensor(np.zeros((vocab, vocab), np.float32)), name="stub_table", requires_grad=False)
        self.matmul = ops.MatMul()

    def decode(self, embeds, hidden, positions, mask, cache_rows):
        return embeds

    def compute_logits(self, hidden):
        return self.matmul(hidden.reshape(-1, self.hidden_size), self.table)

    def to_target(self, draft_ids):
        return draft_ids


def identity(vocab: int) -> Parameter:
    """The stub's embedding table: token t embeds as onehot(t)."""
    return Parameter(Tensor(np.eye(vocab, dtype=np.float32)), name=f"stub_embed_{vocab}", requires_grad=False)


def run_stub(grower, stub, table: np.ndarray, root: int):
    """Candidates of one growth from ``root`` with the stub's logits set to ``table``."""
    # ops.assign, not set_data: a compiled graph keeps its own view of a Parameter whose data is replaced.
    ops.assign(stub.table, Tensor(table.astype(np.float32)))
    vocab = table.shape[0]
    scores, tokens, parents = grower(Tensor(np.eye(vocab, dtype=np.float32)[root:root + 1]),
                                     Tensor(np.array([10], np.int64)), Tensor(np.zeros(1, np.int64)))
    return scores.asnumpy()[0], tokens.asnumpy()[0], parents.asnumpy()[0]


# Children probabilities per parent token (vocab 6). Worked out by hand below.
LITERAL_PROBS = np.array([
    [0.05, 0.50, 0.30, 0.05, 0.05, 0.05],  # token 0 (the root): 1 (.5), 2 (.3)
    [0.05, 0.05, 0.05, 0.62, 0.18, 0.05],  # token 1: 3 (.62), 4 (.18)
    [0.015, 0.015, 0.015, 0.04, 0.015, 0.90],  # token 2: 5 (.9), 3 (.04)
    [0.05, 0.70, 0.10, 0.05, 0.05, 0.05],  # token 3: 1 (.7), 2 (.1)
    [0.50, 0.05, 0.05, 0.05, 0.05, 0.30],  # token 4
    [0.10, 0.025, 0.025, 0.025, 0.80, 0.025],  # token 5: 4 (.8), 0 (.1)
])


@pytest.fixture(scope="module")
def literal_grower():
    stub = StubDraft(6)
    return ms.jit(TreeGrowCell(stub, identity(6), TreeBudget(max_nodes=64, depth=3, top_k=2), STUB_LEN)), stub


def test_stub_growth_yields_the_literal_candidates_and_tree(literal_grower):
    grower, stub = literal_grower
    scores, tokens, parents = run_stub(grower, stub, np.log(LITERAL_PROBS), root=0)
    # Level 1 (ids 1, 2): root's best two children 1 (.5) and 2 (.3).
    # Level 2: node 1 -> 3 (.5*.62=.31), 4 (.09) = ids 3, 4; node 2 -> 5 (.3*.9=.27), 3 (.012) = ids 5, 6.
    #          Next frontier: ids 3 (.31) and 5 (.27).
    # Level 3: id 3 (token 3) -> 1 (.217), 2 (.031) = ids 7, 8; id 5 (token 5) -> 4 (.216), 0 (.027) = ids 9, 10.
    np.testing.assert_array_equal(tokens, [1, 2, 3, 4, 5, 3, 1, 2, 4, 0])
    np.testing.assert_array_equal(parents, [0, 0, 1, 1, 2, 2, 3, 3, 5, 5])
    probs = [.5, .3, .31, .09, .27, .012, .217, .031, .216, .027]
    np.testing.assert_allclose(scores, np.log(probs), rtol=1e-5)
    # Best 5 drafts: ids 1 (.5), 3 (.31), 2 (.3), 5 (.27), 7 (.217); laid out in id order 1, 2, 3, 5, 7.
    tree = select_tree(0, scores, tokens, parents, max_nodes=6)
    np.testing.assert_array_equal(tree.layout.tokens, [0, 1, 2, 3, 5, 1])
    np.testing.assert_array_equal(tree.layout.parents, [0, 0, 0, 1, 2, 3])
    np.testing.assert_array_equal(tree.layout.depth, [0, 1, 1, 2, 2, 3])
    # One more node: id 9 (.216, token 4 under id 5 = node 4).
    tree = select_tree(0, scores, tokens, parents, max_nodes=7)
    np.testing.assert_array_equal(tree.layout.tokens, [0, 1, 2, 3, 5, 1, 4])
    np.testing.assert_array_equal(tree.layout.parents, [0, 0, 0, 1, 2, 3, 4])
    np.testing.assert_allclose(tree.scores, np.log([1, .5, .3, .31, .27, .217, .216]), rtol=1e-5)


def test_selection_keeps_ancestors_even_when_a_child_outranks_its_parent():
    # Candidate ids 1, 2 under the root; id 3 under id 2 but scored above everything (not a real
    # log-prob chain: only a tie or a broken draft could do this).
    scores = np.array([-1.0, -2.0, -0.5], np.float32)
    tokens, parents = np.array([11, 12, 13]), np.array([0, 0, 2])
    tree = select_tree(7, scores, tokens, parents, max_nodes=2)
    np.testing.assert_array_equal(tree.layout.tokens, [7, 11])
    tree = select_tree(7, scores, tokens, parents, max_nodes=3)
    np.testing.assert_array_equal(tree.layout.tokens, [7, 11, 12])  # id 3 waits for its parent, id 2
    np.testing.assert_array_equal(tree.layout.parents, [0, 0, 0])
    for n in (4, 5):  # then it is the best candidate left; there are only 3
        tree = select_tree(7, scores, tokens, parents, max_nodes=n)
        np.testing.assert_array_equal(tree.layout.tokens, [7, 11, 12, 13])
        np.testing.assert_array_equal(tree.layout.parents, [0, 0, 0, 2])


def test_ties_between_parent_and_child_rank_the_parent_first():
    scores = np.zeros(4, np.float32)  # every candidate has probability 1 along its path
    tokens, parents = np.array([1, 2, 3, 4]), np.array([0, 1, 2, 3])  # a chain
    for n in range(1, 6):
        tree = select_tree(0, scores, tokens, parents, max_nodes=n)
        assert tree.layout.num_nodes == n
        np.testing.assert_array_equal(tree.layout.parents, np.maximum(np.arange(n) - 1, 0))


# ----- properties on random logits ------------------------------------------------------------------------

PROP_VOCAB = 8
PROP_BUDGETS = [(1, 1), (2, 3), (3, 4)]  # (top_k, depth): one compiled growth each


@pytest.fixture(scope="module")
def prop_growers():
    out = {}
    for k, depth in PROP_BUDGETS:
        stub = StubDraft(PROP_VOCAB)
        grower = TreeGrowCell(stub, identity(PROP_VOCAB), TreeBudget(max_nodes=64, depth=depth, top_k=k), STUB_LEN)
        out[(k, depth)] = (ms.jit(grower), stub)
    return out


@settings(max_examples=40, deadline=None)
@given(budget=st.sampled_from(PROP_BUDGETS), max_nodes=st.integers(1, 64), root=st.integers(0, PROP_VOCAB - 1),
       logits=st.lists(st.sampled_from([0.0, 0.0, 3.0, 40.0, 100.0]), min_size=PROP_VOCAB ** 2,
                       max_size=PROP_VOCAB ** 2))
def test_grown_trees_respect_the_budget_and_stay_ancestor_closed(prop_growers, budget, max_nodes, root, logits):
    """Logits from a few values make exact ties and probability-1 children (child score == parent score)."""
    grower, stub = prop_growers[budget]
    k, depth = budget
    table = np.array(logits, np.float32).reshape(PROP_VOCAB, PROP_VOCAB)
    scores, tokens, parents = run_stub(grower, stub, table, root)
    assert scores.shape[0] == TreeBudget(max_nodes, depth, k).num_candidates
    tree = select_tree(root, scores, tokens, parents, max_nodes)
    layout = tree.layout
    check_tree(layout, PROP_VOCAB)  # root, order, closure, depth, token range
    assert layout.max_depth <= depth
    assert layout.num_nodes == min(max_nodes, 1 + scores.shape[0])
    assert layout.max_depth <= depth
    assert (layout.parents >= 0).all() and (layout.tokens >= 0).all()
    assert (layout.parents[1:] < np.arange(1, layout.num_nodes)).all()
    # Every node's score is its path's log-probability under the stub.
    logp = table - table.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    for i in range(1, layout.num_nodes):
        p = layout.parents[i]
        want = tree.scores[p] + logp[layout.tokens[p], layout.tokens[i]]
        assert math.isclose(tree.scores[i], want, rel_tol=1e-5, abs_tol=1e-4)
    # Best-first: no candidate that was eligible (its parent kept) but left out scores above a kept node.
    kept = set(tree.candidate_ids.tolist())
    left_out = [s for i, s in enumerate(scores) if i + 1 not in kept and parents[i] in kept]
    if left_out and layout.num_nodes > 1:
        assert max(left_out) <= tree.scores[1:].min()


# ----- the real head: in-graph growth == per-branch numpy recomputation ------------------------------------

HEAD_LEN = 48
BUDGET = TreeBudget(max_nodes=12, depth=3, top_k=3)


@pytest.fixture(scope="module")
def real_head(tmp_path_factory):
    return mapped_head(tmp_path_factory.mktemp("grow_head"), HEAD_LEN)


def context(c, n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, c["vocab_size"], n), rng.standard_normal((n, 3 * c["hidden_size"])).astype(np.float32)


@pytest.mark.parametrize("exec_mode", ["performance", "reference"])
def test_in_graph_growth_equals_per_branch_recomputation(real_head, exec_mode):
    c, ref, head, embed = real_head
    prop = Eagle3Proposer(head, Tensor(embed), BUDGET, exec_mode=exec_mode, buckets=(1, 8))
    toks, feats = context(c, 14, seed=4)
    # A prompt of 11 (two chunks: 8 + 3) with first root toks[10], then a round that accepted 2 drafts and a
    # bonus (3 entries, the protocol's accept()).
    prop.begin(toks[:11], feats[:11], int(toks[10]))
    prop.accept(Acceptance(path=(0, 1, 2), tokens=tuple(int(t) for t in toks[11:14]), bonus=int(toks[13])),
                feats[11:14])
    entries = np.concatenate([toks[1:11], [toks[10]], toks[11:14]])  # next-token of each feature row
    assert prop.committed_len == 14 and prop.root_token == int(toks[13])
    k_before = head.cache_parameters()[0][0].asnumpy()[:, :, :14].copy()
    scores, tokens, parents = prop.candidates()
    want_s, want_t, want_p = numpy_growth(ref, embed, entries, feats, BUDGET.top_k, BUDGET.depth)
    np.testing.assert_array_equal(tokens, want_t)
    np.testing.assert_array_equal(parents, want_p)
    np.testing.assert_allclose(scores, want_s, rtol=1e-4, atol=1e-4)
    # The tree rows were dropped: the committed context is untouched and its length unchanged.
    assert prop.committed_len == 14
    np.testing.assert_array_equal(head.cache_parameters()[0][0].asnumpy()[:, :, :14], k_before)
    layout = prop.propose(int(toks[13]))
    check_tree(layout, c["vocab_size"])
    assert layout.max_depth <= BUDGET.depth
    assert layout.num_nodes == BUDGET.max_nodes and layout.tokens[0] == toks[13]
    with pytest.raises(TreeInvariantError, match="ends with token"):
        prop.propose(int(toks[13]) + 1)


def test_growth_refuses_to_run_past_the_draft_cache(real_head):
    c, _, head, embed = real_head
    prop = Eagle3Proposer(head, Tensor(embed), BUDGET, buckets=(1, 8))
    toks, feats = context(c, HEAD_LEN - BUDGET.tree_rows + 1, seed=8)
    prop.begin(toks, feats, 1)
    with pytest.raises(CacheCapacityError):
        prop.propose(1)
    assert prop.committed_len == toks.size and prop.cache.state.round_bucket is None


def test_wrapping_the_head_and_a_shared_table_renames_no_parameter(real_head):
    c, _, head, embed = real_head
    names = [p.name for p in head.get_parameters()]
    shared = Parameter(Tensor(embed), name="model.embed_tokens.weight", requires_grad=False)
    prop = Eagle3Proposer(head, shared, BUDGET)
    assert [p.name for p in head.get_parameters()] == names
    assert shared.name == "model.embed_tokens.weight" and prop.embed_table is shared


# slow: ~22 s on a 2-vCPU Zen 3; the proposer's losslessness stays in the default suite in test_hybrid_proposer
@pytest.mark.slow
def test_engine_with_the_proposer_is_lossless_and_keeps_draft_and_teacher_in_step(real_head):
    """Speculative output == teacher-only greedy, token for token; the draft shares the teacher's embeddings
    and its committed length follows the teacher's."""
    from mindspore_eagle.runtime import RuntimeConfig, replace
    from mindspore_eagle.teacher_config import TeacherConfig
    from mindspore_eagle.engine import SpeculativeEngine
    from mindspore_eagle.teacher import Teacher

    c, _, head, _ = real_head
    tcfg = TeacherConfig(vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], intermediate_size=48,
                         num_layers=4, num_heads=4, num_kv_heads=2, aux_layer_ids=(0, 1, 3))
    runtime = RuntimeConfig(max_cache_len=HEAD_LEN - BUDGET.tree_rows, buckets=(1, 16), prefill_chunk=16)
    teacher = Teacher(tcfg, runtime)
    rng = np.random.default_rng(12)
    for p in teacher.cell.weight_parameters().values():  # before the first forward compiles a graph
        p.set_data(Tensor((rng.standard_normal(p.shape) / np.sqrt(p.shape[0]) * 2).astype(np.float32)))
    table = teacher.cell.model.embed_tokens.weight
    prop = Eagle3Proposer.for_teacher(head, teacher, BUDGET)
    assert prop.embed_table is table and table.name == "model.embed_tokens.weight"
    engine = SpeculativeEngine(teacher)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    spec = engine.generate(prompt, max_new_tokens=12, proposer=prop)
    greedy = SpeculativeEngine(teacher).generate(prompt, max_new_tokens=12)
    assert spec.tokens == greedy.tokens
    assert prop.committed_len == engine.cache.committed_len and prop.root_token == spec.tokens[-1]
    with pytest.raises(ConfigError, match="vocab_size"):
        Eagle3Proposer.for_teacher(head, Teacher(replace(tcfg, vocab_size=61), runtime), BUDGET)
    big = RuntimeConfig(max_cache_len=HEAD_LEN, buckets=(1, 16), prefill_chunk=16)
    with pytest.raises(ConfigError, match=f"max_len >= {draft_cache_len(HEAD_LEN, BUDGET)}"):
        Eagle3Proposer.for_teacher(head, Teacher(tcfg, big), BUDGET)
    small = RuntimeConfig(max_cache_len=HEAD_LEN - BUDGET.tree_rows, buckets=(1, 8), prefill_chunk=8)
    with pytest.raises(ConfigError, match=rf"TreeBudget.max_nodes={BUDGET.max_nodes} does not fit "
                                          r"RuntimeConfig.buckets=\(1, 8\)"):
        Eagle3Proposer.for_teacher(head, Teacher(tcfg, small), BUDGET)


def test_proposer_rejects_bad_inputs(real_head):
    c, _, head, embed = real_head
    with pytest.raises(ConfigError, match="top_k"):
        Eagle3Proposer(head, Tensor(embed), TreeBudget(max_nodes=8, depth=2, top_k=c["draft_vocab_size"] + 1))
    prop = Eagle3Proposer(head, Tensor(embed), BUDGET)
    with pytest.raises(ConfigError, match="propose before begin"):
        prop.propose(1)
    with pytest.raises(ConfigError, match="features shape"):
        prop.begin([1, 2, 3], np.zeros((2, 3 * c["hidden_size"]), np.float32), 4)


@pytest.mark.parametrize("field, kwargs", [
    ("max_nodes", dict(max_nodes=0)), ("max_nodes", dict(max_nodes=2.0)), ("depth", dict(depth=0)),
    ("top_k", dict(top_k=0)), ("top_k", dict(top_k=2.5)),
])
def test_tree_budget_validation_names_the_field(field, kwargs):
    with pytest.raises(ConfigError, match=f"TreeBudget.{field}="):
        TreeBudget(**kwargs)


def test_default_budget_sizes():
    budget = TreeBudget()  # EAGLE-3's usual tree: 32 nodes, depth 6, top-8
    assert (budget.max_nodes, budget.depth, budget.top_k) == (32, 6, 8)
    assert budget.num_candidates == 8 + 5 * 64 and budget.tree_rows == 40
