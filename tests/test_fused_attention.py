"""The fused attention kernel (``kernels.TreeAttentionKernel``) and the in-place row mover (``RowMoveKernel``).

What is proved, each against an independent reference (float64 numpy attention over the whole cache, numpy
copies of the cache, the primitive commit):
* RoPE + GQA + tree/window masks equal softmax attention over the *whole* cache, for several shapes;
* the new K/V rows land in the cache Parameter's own memory inside a compiled graph (``param.asnumpy()``),
  only those rows change, the writes persist across calls, and MindSpore neither elides the op nor orders a
  read of the cache before it (in one graph and in PyNative);
* only each row's visible span is read: NaN planted in every other cache row changes nothing;
* a row's output is bit-identical whether it is computed alone (T=1) or among 16 tree rows;
* a bad write row is refused before anything is written;
* the row mover leaves the same buffers as the primitive gather/scatter commit.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from mindspore_eagle.tree.mask import MASK_VALUE
from tests.helpers import require_kernel

ms.set_device("CPU")


@pytest.fixture(scope="module", autouse=True)
def _kernel():
    require_kernel("float32")


def rope_np(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin


def reference(qkv, cos, sin, mask, rows, k0, v0, heads):
    """float64 attention over the whole cache after writing the new rows: (out [B, T, H*D], K, V)."""
    b, t, _ = qkv.shape
    hkv, d = k0.shape[1], k0.shape[3]
    q = qkv[:, :, :heads * d].reshape(b, t, heads, d).transpose(0, 2, 1, 3)
    kn = qkv[:, :, heads * d:(heads + hkv) * d].reshape(b, t, hkv, d).transpose(0, 2, 1, 3)
    vn = qkv[:, :, (heads + hkv) * d:].reshape(b, t, hkv, d).transpose(0, 2, 1, 3)
    q, kn = rope_np(q, cos, sin), rope_np(kn, cos, sin)
    k, v = k0.copy(), v0.copy()
    for bi in range(b):
        k[bi, :, rows[bi]] = kn[bi].transpose(1, 0, 2)
        v[bi, :, rows[bi]] = vn[bi].transpose(1, 0, 2)
    out = np.zeros((b, t, heads * d))
    rep = heads // hkv
    for bi in range(b):
        for h in range(heads):
            s = q[bi, h].astype(np.float64) @ k[bi, h // rep].T.astype(np.float64) / np.sqrt(d) + mask[bi, 0]
            p = np.exp(s - s.max(-1, keepdims=True))
            out[bi, :, h * d:(h + 1) * d] = (p / p.sum(-1, keepdims=True)) @ v[bi, h // rep]
    return out, k, v


class Rig(nn.Cell):
    """One attention layer: the kernel, its cache Parameters, and optional reads of the cache before/after."""

    def __init__(self, k0, v0, heads):
        super().__init__()
        from mindspore_eagle.kernels import TreeAttentionKernel

        self.k = Parameter(Tensor(k0), name="k_cache", requires_grad=False)
        self.v = Parameter(Tensor(v0), name="v_cache", requires_grad=False)
        self.att = TreeAttentionKernel(heads, k0.shape[1], k0.shape[3])

    def construct(self, qkv, cos, sin, mask, widx):
        return self.att(qkv, cos, sin, mask, widx, self.k, self.v)


def write_idx(rows, hkv):
    b, t = rows.shape
    idx = np.zeros((b, hkv, t, 3), np.int64)
    idx[..., 0] = np.arange(b)[:, None, None]
    idx[..., 1] = np.arange(hkv)[None, :, None]
    idx[..., 2] = rows[:, None, :]
    return idx


def case(seed, b, t, heads, hkv, d, s, committed, parents=None, window=None):
    """Random inputs; the mask: committed rows [first, L) plus the tree's ancestors-or-self (chain by default)."""
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((b, t, (heads + 2 * hkv) * d)).astype(np.float32)
    ang = rng.uniform(0, 50, (b, 1, t, d // 2)).astype(np.float32)
    cos = np.cos(np.concatenate([ang, ang], -1)).astype(np.float32)
    sin = np.sin(np.concatenate([ang, ang], -1)).astype(np.float32)
    k0 = rng.standard_normal((b, hkv, s, d)).astype(np.float32)
    v0 = rng.standard_normal((b, hkv, s, d)).astype(np.float32)
    parents = list(range(-1, t - 1)) if parents is None else parents
    mask = np.full((b, 1, t, s), MASK_VALUE, np.float32)
    first = 0 if window is None else max(0, committed - window)
    for i in range(t):
        mask[:, 0, i, first:committed] = 0.0
        j = i
        while j >= 0:
            mask[:, 0, i, committed + j] = 0.0
            j = parents[j]
    rows = np.tile(committed + np.arange(t), (b, 1))
    return qkv, cos, sin, mask, rows, k0, v0


SHAPES = [  # (b, t, heads, hkv, d, s, committed, parents, window)
    (1, 1, 9, 3, 64, 300, 200, None, None),  # decode, SmolLM2's heads
    (1, 16, 9, 3, 64, 300, 117, [-1, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11], None),  # a tree
    (2, 5, 4, 2, 16, 40, 20, None, None),  # batch 2, tiny heads
    (1, 7, 4, 4, 32, 50, 30, None, 9),  # no GQA, a sliding window (first visible row > 0)
    (1, 3, 2, 1, 128, 37, 0, None, None),  # empty prefix, head_dim 128, S not a multiple of 16
]


@pytest.mark.parametrize("shape", SHAPES)
def test_fused_attention_equals_float64_attention_over_the_whole_cache(shape):
    b, t, heads, hkv, d, s, committed, parents, window = shape
    qkv, cos, sin, mask, rows, k0, v0 = case(0, b, t, heads, hkv, d, s, committed, parents, window)
    rig = Rig(k0, v0, heads)
    got = ms.jit(rig)(Tensor(qkv), Tensor(cos), Tensor(sin), Tensor(mask), Tensor(write_idx(rows, hkv))).asnumpy()
    want, k, v = reference(qkv, cos, sin, mask, rows, k0, v0, heads)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(rig.k.asnumpy(), k, rtol=1e-6, atol=1e-6)  # roped keys
    assert np.array_equal(rig.v.asnumpy(), v)  # values copied as they are


def test_rows_outside_the_visible_span_are_never_read():
    b, t, heads, hkv, d, s, committed = 1, 6, 6, 2, 64, 96, 40
    qkv, cos, sin, mask, rows, k0, v0 = case(1, b, t, heads, hkv, d, s, committed, window=12)
    first = committed - 12
    want, _, _ = reference(qkv, cos, sin, mask, rows, k0, v0, heads)
    poisoned_k, poisoned_v = k0.copy(), v0.copy()
    hidden_rows = np.r_[0:first, committed + t:s]  # below the window and above the tree: hidden for every row
    poisoned_k[:, :, hidden_rows] = np.nan
    poisoned_v[:, :, hidden_rows] = np.nan
    rig = Rig(poisoned_k, poisoned_v, heads)
    got = ms.jit(rig)(Tensor(qkv), Tensor(cos), Tensor(sin), Tensor(mask), Tensor(write_idx(rows, hkv))).asnumpy()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_a_row_is_bit_identical_alone_and_among_sixteen_tree_rows():
    heads, hkv, d, s, committed = 9, 3, 64, 200, 70
    parents = [-1, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    qkv, cos, sin, mask, rows, k0, v0 = case(2, 1, 16, heads, hkv, d, s, committed, parents)
    block_rig = Rig(k0, v0, heads)
    block = ms.jit(block_rig)(Tensor(qkv), Tensor(cos), Tensor(sin), Tensor(mask),
                              Tensor(write_idx(rows, hkv))).asnumpy()
    k_all, v_all = block_rig.k.asnumpy(), block_rig.v.asnumpy()  # every tree row written
    for i in range(16):
        one_rig = Rig(k_all, v_all, heads)  # the cache as the block left it; token i rewrites its own row
        one = ms.jit(one_rig)(Tensor(qkv[:, i:i + 1]), Tensor(cos[:, :, i:i + 1]), Tensor(sin[:, :, i:i + 1]),
                              Tensor(mask[:, :, i:i + 1]), Tensor(write_idx(rows[:, i:i + 1], hkv))).asnumpy()
        assert np.array_equal(one[0, 0].view(np.uint32), block[0, i].view(np.uint32)), i


def test_an_accepted_branch_is_bit_identical_to_decoding_its_tokens_one_by_one():
    """Bushy tree: every node's true child comes after a wrong sibling, so the accepted path [0, 2, 4, 6, 8]
    sits at cache columns L + [0, 2, 4, 6, 8] with hidden siblings in between. Greedy decoding of the same
    tokens (and every forward after the commit) sees them contiguous at L + [0, 1, 2, 3, 4]."""
    heads, hkv, d, s, committed = 9, 3, 64, 160, 37
    parents = [-1, 0, 0, 2, 2, 4, 4, 6, 6]
    qkv, _, _, mask, rows, k0, v0 = case(7, 1, 9, heads, hkv, d, s, committed, parents)
    depth = np.array([0, 1, 1, 2, 2, 3, 3, 4, 4])
    ang = (committed + depth)[None, None, :, None] * np.linspace(0.01, 1.0, d // 2, dtype=np.float32)
    cos = np.cos(np.concatenate([ang, ang], -1)).astype(np.float32)  # RoPE by position L + depth
    sin = np.sin(np.concatenate([ang, ang], -1)).astype(np.float32)
    tree = ms.jit(Rig(k0, v0, heads))(Tensor(qkv), Tensor(cos), Tensor(sin), Tensor(mask),
                                      Tensor(write_idx(rows, hkv))).asnumpy()
    decode = Rig(k0, v0, heads)  # the committed prefix only
    fn = ms.jit(decode)
    for k, node in enumerate([0, 2, 4, 6, 8]):
        row = committed + k
        one_mask = np.full((1, 1, 1, s), MASK_VALUE, np.float32)
        one_mask[..., :row + 1] = 0.0
        one = fn(Tensor(qkv[:, node:node + 1]), Tensor(cos[:, :, node:node + 1]), Tensor(sin[:, :, node:node + 1]),
                 Tensor(one_mask), Tensor(write_idx(np.array([[row]]), hkv))).asnumpy()
        assert np.array_equal(one[0, 0].view(np.uint32), tree[0, node].view(np.uint32)), (k, node)


class ReadAroundWrite(nn.Cell):
    """Reads a cache row before and after the attention kernel writes it, in one graph; optionally drops the
    kernel's output (only its side effect remains)."""

    def __init__(self, k0, v0, heads, use_output: bool):
        super().__init__()
        self.rig = Rig(k0, v0, heads)
        self.use_output = use_output

    def construct(self, qkv, cos, sin, mask, widx, rows):
        before = ops.gather(self.rig.k, rows, 2)
        out = self.rig(qkv, cos, sin, mask, widx)
        after = ops.gather(self.rig.k, rows, 2)
        if self.use_output:
            return before, after, out
        return before, after


@pytest.mark.parametrize("mode", ["graph", "pynative"])
@pytest.mark.parametrize("use_output", [True, False])
def test_cache_write_is_in_place_ordered_never_elided_and_persists(mode, use_output):
    heads, hkv, d, s = 4, 2, 16, 24
    qkv, cos, sin, mask, rows, k0, v0 = case(3, 1, 2, heads, hkv, d, s, committed=5)
    _, k_want, v_want = reference(qkv, cos, sin, mask, rows, k0, v0, heads)
    cell = ReadAroundWrite(k0, v0, heads, use_output)
    fn = ms.jit(cell) if mode == "graph" else cell
    outs = fn(Tensor(qkv), Tensor(cos), Tensor(sin), Tensor(mask), Tensor(write_idx(rows, hkv)), Tensor(rows[0]))
    before, after = outs[0].asnumpy(), outs[1].asnumpy()
    np.testing.assert_array_equal(before, k0[:, :, rows[0]])  # read before the write: old rows
    np.testing.assert_allclose(after, k_want[:, :, rows[0]], rtol=1e-6, atol=1e-6)  # read after: new rows
    k_now, v_now = cell.rig.k.asnumpy(), cell.rig.v.asnumpy()
    np.testing.assert_allclose(k_now, k_want, rtol=1e-6, atol=1e-6)
    untouched = np.setdiff1d(np.arange(s), rows[0])
    assert np.array_equal(k_now[:, :, untouched], k0[:, :, untouched])  # no other row changed
    assert np.array_equal(v_now, v_want)
    # a second call writes two more rows; the first call's rows persist
    qkv2, cos2, sin2, mask2, rows2, _, _ = case(4, 1, 2, heads, hkv, d, s, committed=7)
    fn(Tensor(qkv2), Tensor(cos2), Tensor(sin2), Tensor(mask2), Tensor(write_idx(rows2, hkv)), Tensor(rows2[0]))
    _, k_want2, _ = reference(qkv2, cos2, sin2, mask2, rows2, k_want, v_want, heads)
    np.testing.assert_allclose(cell.rig.k.asnumpy(), k_want2, rtol=1e-6, atol=1e-6)


def test_write_row_outside_the_cache_is_refused_and_nothing_is_written():
    heads, hkv, d, s = 4, 2, 16, 24
    qkv, cos, sin, mask, rows, k0, v0 = case(5, 1, 2, heads, hkv, d, s, committed=5)
    rows = np.array([[6, s]])  # the second row does not exist
    rig = Rig(k0, v0, heads)
    with pytest.raises(RuntimeError):
        ms.jit(rig)(Tensor(qkv), Tensor(cos), Tensor(sin), Tensor(mask), Tensor(write_idx(rows, hkv))).asnumpy()
    assert np.array_equal(rig.k.asnumpy(), k0) and np.array_equal(rig.v.asnumpy(), v0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_row_mover_leaves_the_same_buffers_as_the_primitive_commit(dtype):
    from mindspore_eagle.cache.commit import PathCommit, pad_moves, path_moves

    rng = np.random.default_rng(6)
    shapes = [(2, 3, 40, 16), (2, 1, 40, 8)]  # pairs may differ in heads and head_dim
    init = [rng.standard_normal(sh).astype(dtype) for sh in shapes for _ in range(2)]

    def make(inplace):
        params = [Parameter(Tensor(a.copy()), name=f"c{i}_{inplace}", requires_grad=False) for i, a in enumerate(init)]
        return params, ms.jit(PathCommit([(params[0], params[1]), (params[2], params[3])], inplace=inplace))

    (kern, kern_fn), (prim, prim_fn) = make(True), make(False)
    for committed, path in ((10, [0, 2, 5, 6]), (14, [0, 1, 3]), (17, [0, 4])):  # overlapping sources/dests
        src, dst = path_moves(np.array(path), committed)
        s, d = pad_moves([src, src + 1], [dst, dst + 1], 8)  # two sequences, padded to a bucket of 8
        kern_fn(Tensor(s), Tensor(d))
        prim_fn(Tensor(s), Tensor(d))
        for a, b in zip(kern, prim):
            assert np.array_equal(a.asnumpy(), b.asnumpy())
    assert not np.array_equal(kern[0].asnumpy(), init[0])  # rows did move
