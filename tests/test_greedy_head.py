"""The tied Q8 LM head's greedy token from int16 dot products and a bound (kernels/argmax.cc) is numpy's argmax of
the exact Q8 kernel's logits: on an adversarial near-tie that the int16 rounding ranks the wrong way, on exact ties
(the lowest index), on random rows of many scales and row counts, on the default teacher's own forwards, whatever
else is in the call; rows it cannot bound fall back to the exact kernel; the pair layout holds the q8 panels'
weights; the column sums never undercut the exact ones. The head is fast on the AVX2 path (VPMADDWD blocks), the
NEON path (SMLAL blocks) and the AVX-512 paths (VPDPWSSD blocks with VNNI, VPMADDWD ones without), and the teacher
takes it there; on the portable
path it is not used and the teacher keeps its logits path, the head's portable loops giving the same tokens (and
the same approximate logits bit for bit on every path: the kernel self-test's approx cases, test_kernel_isa.py).
A dense fp32 or bf16 head takes it through a Q8 copy of its weights whose error the bound adds (a bf16 head also its
activations' rounding): numpy's token on near-ties the copy or that rounding rank wrongly, on random weights and on
the dense default teacher (fp32: the copy is exact).
The token tests run on every path of this file's code that the machine runs (``each_greedy_path``: the path in use,
AVX2 below an AVX-512 path, the portable loops), so no machine skips a branch it can run."""

from __future__ import annotations

import numpy as np
import pytest
from mindspore import Tensor

from mindspore_eagle.app.compile_plan import key_parts
from mindspore_eagle.errors import ConfigError
from mindspore_eagle.kernels import LinearKernel, build, greedy_head
from mindspore_eagle.kernels.greedy_head import GreedyQ8HeadKernel
from mindspore_eagle.kernels.layout import (bf16_bits, column_norms, dequantize_fields, f32_panels_of_bf16,
                                            gguf_fields, pack_bf16, pack_f32, pack_quantized, q8_column_abs_sums,
                                            q8_copy_of_f32, q8_pair_panels)
from mindspore_eagle.kernels.ops import kernel_status
from mindspore_eagle.runtime import RuntimeConfig
from mindspore_eagle.teacher import ARGMAX, LOGITS, Teacher
from tests.helpers import TINY, default_model_or_skip, require_kernel, write_tiny_gguf
from tests.helpers import _randomize as randomize



def q8_rows(d: np.ndarray, q: np.ndarray) -> np.ndarray:
    """GGUF Q8_0 rows (what a GGUF file holds) for weights ``d [N, K/32]`` (fp16-exact) times ``q [N, K]`` int8."""
    n, k = q.shape
    blocks = np.zeros((n, k // 32, 34), np.uint8)
    blocks[..., :2] = d.astype(np.float16)[..., None].view(np.uint8)
    blocks[..., 2:] = q.astype(np.int8).reshape(n, k // 32, 32).view(np.uint8)
    return blocks.reshape(n, -1)


def random_blocks(rng, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``d [n, k/32]`` (fp16 values) and ``q [n, k]`` int8 of a random Q8_0 weight."""
    d = rng.uniform(0.002, 0.03, (n, k // 32)).astype(np.float16).astype(np.float32)
    return d, rng.integers(-127, 128, (n, k)).astype(np.int8)


def head_kernel(d: np.ndarray, q: np.ndarray) -> LinearKernel:
    """A tied LM head kernel (transposed, RMSNorm prologue) packed from Q8_0 blocks."""
    n, k = q.shape
    head = LinearKernel(k, n, "float32", transposed=True, norm_eps=1e-6)
    assert head.pack_native([("Q8_0", q8_rows(d, q))]) and head.format == "q8"
    return head


def tokens_and_logits(head: LinearKernel, greedy: GreedyQ8HeadKernel, x: np.ndarray, rows=None):
    norm = Tensor(np.ones(head.in_features, np.float32))
    xt = Tensor(x.astype(np.float32))
    logits = head(xt, None, norm, None, None).asnumpy()
    flags = None if rows is None else Tensor(np.asarray(rows, np.int32))
    tok = greedy(xt, head.packed_weight, norm, head.eps, flags).asnumpy()
    return tok, logits


def each_greedy_path():
    """Select in turn every kernel path with its own greedy-head code that this processor runs -- the path in use
    (on an AVX-512 processor with VNNI: its VNNI blocks, then its AVX512-BW ones as "<path>/bw", those a processor
    without VNNI takes), avx2 (its VPMADDWD blocks) when the path in use is above it, generic (argmax.cc's portable
    loops) -- yielding its name; the path in use and its blocks are selected again at the end."""
    before = build.current_isa()
    runs = kernel_status("float32").library.isas
    try:
        for path in [before] + [p for p in ("avx2", "generic") if p in runs and p != before]:
            build.select_isa(path)
            yield path
            if build.approx_vnni():  # VNNI blocks in use: the BW ones too
                build.approx_vnni(False)
                yield f"{path}/bw"
                build.approx_vnni(True)
    finally:
        build.approx_vnni(True)
        build.select_isa(before)


def greedy_teacher(model_dir: str, runtime: RuntimeConfig) -> Teacher:
    """The teacher of ``model_dir``, its greedy output the Q8 head's token: as loaded where the head is fast (checked),
    else with the head's portable loops attached by hand (the load keeps the logits path there, checked)."""
    teacher = Teacher.load(model_dir, runtime)
    fast = greedy_head.fast_here()
    assert teacher.cell.greedy_head_ready == fast and teacher.greedy_output == (ARGMAX if fast else LOGITS)
    if not fast:
        teacher.cell.greedy_head = GreedyQ8HeadKernel(teacher.cell.lm_head_kernel())
        teacher.cell.greedy_head_ready = True
        teacher._fns = teacher._graphs()
        teacher.greedy_output = ARGMAX
    return teacher


def assert_greedy_forwards_give_argmax(teacher: Teacher, ids: list[int], sizes: tuple[int, ...]) -> None:
    """Chain forwards of ``sizes`` tokens of ``ids`` in turn: each row's greedy token is np.argmax of its logits."""
    from mindspore_eagle.tree import ForwardInputs, TreeLayout

    start = 0
    for n in sizes:
        inputs = ForwardInputs.for_tree(TreeLayout.chain(ids[start:start + n]), start, teacher.runtime.buckets.fit(n),
                                        teacher.max_len)
        got = teacher.forward(inputs, ARGMAX).argmax
        assert np.array_equal(got, np.argmax(teacher.forward(inputs, LOGITS).logits, -1)), n
        start += n


def test_pair_panels_hold_the_q8_panels_weights_and_column_sums_never_undercut():
    rng = np.random.default_rng(0)
    n, k = 37, 96
    d = rng.uniform(-0.1, 0.1, (n, k // 32)).astype(np.float16).astype(np.float32)
    q = rng.integers(-127, 128, (n, k)).astype(np.int8)
    q8 = pack_quantized(*gguf_fields(q8_rows(d, q), "Q8_0"), "q8")
    pairs = q8_pair_panels(q8)
    assert pairs.shape == q8.shape and np.array_equal(pairs[..., :64], q8[..., :64])
    # byte 2j + t of pair p is column j of row 2p + t, read literally
    body = pairs[..., 64:].view(np.int8).reshape(q8.shape[0], k // 32, 16, 16, 2)
    for col in (0, 5, 36):
        p, j = divmod(col, 16)
        got = np.concatenate([body[p, b, :, j, :].reshape(-1) for b in range(k // 32)])
        assert np.array_equal(got, q[col])
    w = np.repeat(d.astype(np.float64), 32, axis=1) * q  # every product exact in fp64
    exact = np.abs(w).sum(axis=1)
    sums = q8_column_abs_sums(q8, n)
    assert sums.dtype == np.float32 and sums.shape == (n,)
    assert (sums.astype(np.float64) >= exact).all()
    assert (np.nextafter(sums, np.float32(-np.inf)).astype(np.float64) < exact).all()  # the smallest such fp32


def test_a_head_that_is_not_a_packed_q8_fp32_or_bf16_lm_head_is_refused_by_name():
    require_kernel("float32")
    q4 = LinearKernel(64, 20, "float32", transposed=True, norm_eps=1e-6)  # Q4 blocks: not a greedy head format
    blocks = np.zeros((20, 2, 18), np.uint8)
    blocks[..., :2] = np.full((20, 2, 1), 0.5, np.float16).view(np.uint8)
    assert q4.pack_native([("Q4_0", blocks.reshape(20, -1))]) and q4.format == "q4"
    with pytest.raises(ConfigError, match="needs a packed Q8, fp32 or bf16 LM head without bias.*'q4'"):
        GreedyQ8HeadKernel(q4)
    for dtype in ("float32", "bfloat16"):  # a dense head with a NaN weight keeps the logits (np.argmax's NaN rule)
        w = np.ones((20, 64), np.float32)
        w[7, 3] = np.nan
        broken = LinearKernel(64, 20, dtype, transposed=True, norm_eps=1e-6)
        broken.pack(w)
        with pytest.raises(ConfigError, match="NaN or infinite weights"):
            GreedyQ8HeadKernel(broken)
    biased = LinearKernel(64, 20, "float32", bias=True, transposed=True)
    assert biased.pack_native([("Q8_0", q8_rows(np.full((20, 2), 0.5, np.float32), np.ones((20, 64), np.int8)))])
    with pytest.raises(ConfigError, match="bias=True"):
        GreedyQ8HeadKernel(biased)


def test_a_teacher_whose_dense_lm_head_has_a_nan_weight_keeps_the_logits_path(hf_tiny):
    """Loading (``after_pack``) takes the greedy head for a dense fp32 head and leaves it for one with a NaN weight."""
    require_kernel("float32")
    assert greedy_head.fast_here(), "the path in use should run the greedy head fast (every SIMD path)"
    _, ms_dir, _ = hf_tiny("llama")
    teacher = Teacher.load(ms_dir, RuntimeConfig(max_cache_len=64))
    head = teacher.cell.lm_head_kernel()
    assert head.format == "float32" and teacher.cell.greedy_head_ready
    w = head.packed_weight.asnumpy()
    w[0, 0, 0] = np.nan
    head.packed_weight.set_data(Tensor(w))
    teacher.cell.greedy_head_ready = False
    teacher.cell.after_pack()
    assert not teacher.cell.greedy_head_ready


def test_a_near_tie_that_int16_rounding_ranks_wrongly_still_gives_numpys_token():
    """Column 5 weighs k = 1 (activation 0.49 quantum: rounds to 0), column 3 weighs k = 2 (0.51 quantum: rounds to
    1) with a slightly smaller weight: the approximation ranks 3 first, the exact logits 5. The bound must keep 5
    a candidate (with the quantisation term halved it does not: mutation-checked)."""
    require_kernel("float32")
    for path in each_greedy_path():
        n, k = 40, 64
        d = np.full((n, k // 32), 0.5, np.float32)
        q = np.zeros((n, k), np.int8)
        q[5, 1], q[3, 2] = 127, 114
        head = head_kernel(d, q)
        greedy = GreedyQ8HeadKernel(head)
        x = np.zeros((1, 2, k), np.float32)
        x[0, :, 0] = 1.0
        x[0, 0, 1], x[0, 0, 2] = 0.49 / 32767, 0.51 / 32767
        x[0, 1, 1], x[0, 1, 2] = 0.45 / 32767, 0.51 / 32767  # row 1: here column 3 wins exactly
        greedy_head.stats(reset=True)
        tok, logits = tokens_and_logits(head, greedy, x)
        assert logits[0, 0, 5] > logits[0, 0, 3] > 0 and logits[0, 1, 3] > logits[0, 1, 5]
        assert tok.tolist() == [[5, 3]] == np.argmax(logits, -1).tolist(), path
        s = greedy_head.stats()
        assert s["rows"] == 2 and s["fallbacks"] == 0 and s["candidates"] == 4, (path, s)  # both columns, both rows


def test_columns_equal_in_exact_arithmetic_are_told_apart_by_the_kernels_own_rounding():
    """48 columns hold the same weights, each permuted within the even and within the odd K positions; every row's
    activations take one value on even and one on odd positions. So all 48 logits of a row are equal in exact
    arithmetic and differ only by the kernel's fma-chain roundings. All are candidates, so the token is decided by
    recomputing them with exactly the kernel's chain (another order or a plain multiply-add picks other columns)."""
    require_kernel("float32")
    for path in each_greedy_path():
        rng = np.random.default_rng(5)
        n, k = 48, 256
        even, odd = rng.integers(1, 128, k // 2), rng.integers(1, 128, k // 2)
        q = np.zeros((n, k), np.int8)
        for j in range(n):
            q[j, 0::2], q[j, 1::2] = rng.permutation(even), rng.permutation(odd)
        head = head_kernel(np.full((n, k // 32), np.float16(0.0123), np.float32), q)
        greedy = GreedyQ8HeadKernel(head)
        x = np.zeros((1, 24, k), np.float32)
        x[0, :, 0::2] = rng.uniform(0.5, 2.0, (24, 1))
        x[0, :, 1::2] = rng.uniform(0.5, 2.0, (24, 1))
        tok, logits = tokens_and_logits(head, greedy, x)
        spread = logits[0].max(-1) - logits[0].min(-1)
        assert (spread > 0).all() and (spread < 1e-4 * np.abs(logits[0]).max(-1)).all()  # ulps apart, not equal
        assert np.array_equal(tok, np.argmax(logits, -1))
        assert len(set(tok[0].tolist())) > 3  # the winner changes from row to row: rounding decides
        # the same as an untied head, x taken as it is (any rescaling of it, a norm taken twice, shows here)
        plain = LinearKernel(k, n, "float32", transposed=True)
        assert plain.pack_native([("Q8_0", q8_rows(np.full((n, k // 32), np.float16(0.0123), np.float32), q))])
        xt = Tensor(x * np.float32(1.37))
        logits = plain(xt, None, None, None, None).asnumpy()
        tok = GreedyQ8HeadKernel(plain)(xt, plain.packed_weight).asnumpy()
        assert np.array_equal(tok, np.argmax(logits, -1)) and len(set(tok[0].tolist())) > 3
        # the same weights as a dense fp32 head: its candidates' logits by the fp32 kernel's chain
        dense = dense_head(np.float32(np.float16(0.0123)) * q.astype(np.float32))
        tok, logits = tokens_and_logits(dense, GreedyQ8HeadKernel(dense), x)
        assert np.array_equal(tok, np.argmax(logits, -1)) and len(set(tok[0].tolist())) > 3


def test_exact_ties_give_the_lowest_index_and_random_rows_numpys_token_at_any_row_count():
    require_kernel("float32")
    for path in each_greedy_path():
        rng = np.random.default_rng(1)
        n, k = 1003, 128  # not a multiple of 8 or 16: the scans' last columns
        d, q = random_blocks(rng, n, k)
        x0 = rng.standard_normal(k).astype(np.float32)
        q[1001] = q[1002] = np.clip(np.round(127 * x0 / np.abs(x0).max()), -127, 127)  # aligned with x0: top
        d[1001] = d[1002] = 0.05
        head = head_kernel(d, q)
        greedy = GreedyQ8HeadKernel(head)
        tok, logits = tokens_and_logits(head, greedy, x0[None, None])
        assert logits[0, 0, 1001] == logits[0, 0, 1002] == logits.max() and tok[0, 0] == 1001, path
        greedy_head.stats(reset=True)
        for m in (1, 2, 3, 5, 8, 13, 16, 17, 40):
            x = rng.standard_normal((1, m, k)) * rng.uniform(1e-3, 1e3, (1, m, 1))
            tok, logits = tokens_and_logits(head, greedy, x)
            assert np.array_equal(tok, np.argmax(logits, -1)), (path, m)
            if m == 13:  # batch invariance: each row alone, and among flagged / unflagged rows, gives its token
                alone = {i: tokens_and_logits(head, greedy, x[:, i:i + 1])[0][0, 0] for i in range(m)}
                assert [alone[i] for i in range(m)] == tok[0].tolist()
                flags = (np.arange(m) % 3 != 1).astype(np.int32)[None]
                part, _ = tokens_and_logits(head, greedy, x, rows=flags)
                assert part[0].tolist() == [t if f else 0 for t, f in zip(tok[0].tolist(), flags[0])]
        s = greedy_head.stats()
        assert s["fallbacks"] == 0 and s["rows"] > 100 and s["candidates"] < 2 * s["rows"], (path, s)
        # the same weights as an untied head (no norm inside: x is the norm's output already), with and without rows
        plain = LinearKernel(k, n, "float32", transposed=True)
        assert plain.pack_native([("Q8_0", q8_rows(d, q))])
        x = Tensor((rng.standard_normal((2, 7, k)) * 3).astype(np.float32))
        logits = plain(x, None, None, None, None).asnumpy()
        untied = GreedyQ8HeadKernel(plain)
        assert np.array_equal(untied(x, plain.packed_weight).asnumpy(), np.argmax(logits, -1))
        flags = np.ones((2, 7), np.int32)
        flags[1, 3] = 0
        tok = untied(x, plain.packed_weight, None, None, Tensor(flags)).asnumpy()
        assert np.array_equal(tok, np.where(flags == 1, np.argmax(logits, -1), 0))


def test_rows_it_cannot_bound_take_the_exact_kernel():
    require_kernel("float32")
    for path in each_greedy_path():
        rng = np.random.default_rng(2)
        head = head_kernel(*random_blocks(rng, 300, 64))
        greedy = GreedyQ8HeadKernel(head)
        x = rng.standard_normal((1, 4, 64)).astype(np.float32)
        x[0, 1] = 0.0  # all-zero logits: token 0
        x[0, 2, 7] = np.nan  # NaN logits: the first NaN, 0
        x[0, 3] = 1e-30  # tiny, but the norm (eps dominating) scales it to ~1e-27: still a row the bound serves
        greedy_head.stats(reset=True)
        tok, logits = tokens_and_logits(head, greedy, x)
        assert np.array_equal(tok, np.argmax(logits, -1))
        assert greedy_head.stats()["fallbacks"] == 2, path  # rows 1 and 2


def dense_head(w: np.ndarray, tied: bool = True) -> LinearKernel:
    """An fp32 LM head kernel of weights ``w [N, K]`` (tied: transposed, RMSNorm prologue)."""
    n, k = w.shape
    head = LinearKernel(k, n, "float32", transposed=True, norm_eps=1e-6 if tied else None)
    head.pack(w.astype(np.float32))
    assert head.format == "float32"
    return head


def test_a_dense_heads_q8_copy_is_exact_on_q8_values_and_its_error_bound_never_undercuts():
    """The Q8 copy of an fp32 head (layout.q8_copy_of_f32): weights that are Q8 values already (a dequantized GGUF
    Q8_0 head) come back as the same blocks with zero error; other weights get an error norm and column sums that
    are never below the exact ones (fp64 from the literal weights)."""
    rng = np.random.default_rng(11)
    n, k = 37, 96
    d, q = random_blocks(rng, n, k)
    q[:, ::32] = 127  # GGUF's Q8_0 gives each block's largest weight |q| = 127
    dequant = dequantize_fields(d, np.zeros_like(d), q, "q8")  # [N, K] fp32
    q8, colabs, dnorm = q8_copy_of_f32(pack_f32(dequant, transposed=True), n)
    assert np.array_equal(q8, pack_quantized(d, np.zeros_like(d), q, "q8")) and not dnorm.any()
    assert np.array_equal(colabs, q8_column_abs_sums(q8, n))
    w = rng.standard_normal((n, k)).astype(np.float32) * rng.uniform(0.01, 3, (n, 1)).astype(np.float32)
    q8, colabs, dnorm = q8_copy_of_f32(pack_f32(w, transposed=True), n)
    assert q8.shape == (3, k // 32, 576) and colabs.shape == dnorm.shape == (n,)
    for a, b in zip((q8, colabs, dnorm), q8_copy_of_f32(pack_f32(w, transposed=True), n, chunk_panels=1)):
        assert np.array_equal(a, b)  # a panel at a time: the same copy
    body = q8[..., 64:].view(np.int8).reshape(q8.shape[0], k // 32, 32, 16)  # [np, KB, 32, 16]
    scale = np.ascontiguousarray(q8[..., :64]).view(np.float32).reshape(q8.shape[0], k // 32, 16)
    copy = (scale[:, :, None, :].astype(np.float64) * body).transpose(0, 3, 1, 2).reshape(-1, k)[:n]
    err = np.sqrt(((w.astype(np.float64) - copy) ** 2).sum(axis=1))
    assert (dnorm.astype(np.float64) >= err).all() and (err > 0).all()
    assert (np.abs(w.astype(np.float64) - copy) <= np.repeat(scale.transpose(0, 2, 1).reshape(-1, k // 32)[:n], 32, 1)
            / 2 * (1 + 1e-6)).all()  # each weight within half a quantum of its copy
    exact = np.maximum(np.abs(w.astype(np.float64)).sum(axis=1), np.abs(copy).sum(axis=1))
    assert (colabs.astype(np.float64) >= exact).all()


def test_a_dense_heads_near_tie_that_its_q8_copy_ranks_wrongly_still_gives_numpys_token():
    """fp32 weights that are not Q8 values: column 5 weighs 0.5044 at k = 1 (copy 0.500, quantum 0.01), column 3
    0.5040 (copy 0.505, quantum 0.0101); a row reading k = 1 alone ranks 3 first by the copy, 5 by the exact logits.
    The copy's error term of the bound keeps 5 a candidate (without it only 3 is: mutation-checked). Tied and
    untied, on every path."""
    require_kernel("float32")
    for path in each_greedy_path():
        n, k = 40, 64
        w = np.zeros((n, k), np.float32)
        w[5, 0], w[5, 1] = 1.27, 0.5044
        w[3, 0], w[3, 1] = 1.2827, 0.5040
        x = np.zeros((1, 2, k), np.float32)
        x[0, 0, 1] = 1.0
        x[0, 1, 1], x[0, 1, 0] = 1.0, 0.1  # row 1: column 3 wins exactly (k = 0 weighs in)
        for tied in (True, False):
            head = dense_head(w, tied)
            greedy = GreedyQ8HeadKernel(head)
            greedy_head.stats(reset=True)
            if tied:
                tok, logits = tokens_and_logits(head, greedy, x)
            else:
                logits = head(Tensor(x), None, None, None, None).asnumpy()
                tok = greedy(Tensor(x), head.packed_weight).asnumpy()
            assert logits[0, 0, 5] > logits[0, 0, 3] > 0 and logits[0, 1, 3] > logits[0, 1, 5], (path, tied)
            assert tok.tolist() == [[5, 3]] == np.argmax(logits, -1).tolist(), (path, tied)
            s = greedy_head.stats()
            # row 0 both columns, row 1 column 3 alone (its copy's margin beats both error terms)
            assert s["rows"] == 2 and s["fallbacks"] == 0 and s["candidates"] == 3, (path, tied, s)


def bf16_head(w: np.ndarray) -> LinearKernel:
    """An untied bf16 LM head kernel of weights ``w [N, K]`` (x goes in as it is)."""
    n, k = w.shape
    head = LinearKernel(k, n, "bfloat16", transposed=True)
    head.pack(w.astype(np.float32))
    assert head.format == "bfloat16"
    return head


def test_a_bf16_heads_weights_unpack_to_the_fp32_panels_of_their_bf16_values():
    rng = np.random.default_rng(14)
    w = rng.standard_normal((37, 64)).astype(np.float32)  # [N, K], transposed as a tied head
    rounded = (bf16_bits(w).astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(f32_panels_of_bf16(pack_bf16(w, transposed=True)), pack_f32(rounded, transposed=True))
    norms = column_norms(pack_f32(rounded, transposed=True), 37)
    exact = np.sqrt((rounded.astype(np.float64) ** 2).sum(axis=1))
    assert norms.dtype == np.float32 and (norms >= exact).all() and (norms <= exact * (1 + 1e-6)).all()


def test_a_bf16_heads_near_tie_that_its_activation_rounding_decides_gives_the_kernels_token():
    """A bf16 head's kernel multiplies bf16(x): column 5 weighs x_1 = 1.00385 (bf16: 1.0), column 3 weighs x_2 =
    1.0040 (bf16: 1.0078125) by 255/256, so x ranks 5 first (1.00385 > 1.00008) and the kernel 3 (1.00388 > 1.0).
    The bound's term for that rounding keeps 3 a candidate (without it only 5 is: mutation-checked)."""
    require_kernel("bfloat16")
    for path in each_greedy_path():
        n, k = 40, 64
        w = np.zeros((n, k), np.float32)
        w[5, 1], w[3, 2] = 1.0, 255 / 256
        x = np.zeros((1, 1, k), np.float32)
        x[0, 0, 1], x[0, 0, 2] = 1.00385, 1.0040
        head = bf16_head(w)
        greedy = GreedyQ8HeadKernel(head)
        greedy_head.stats(reset=True)
        logits = head(Tensor(x), None, None, None, None).asnumpy()
        tok = greedy(Tensor(x), head.packed_weight).asnumpy()
        assert float(x[0, 0] @ w[5]) > float(x[0, 0] @ w[3]) and logits[0, 0, 3] > logits[0, 0, 5], path
        assert tok.tolist() == [[3]] == np.argmax(logits, -1).tolist(), path
        s = greedy_head.stats()
        assert s["rows"] == 1 and s["fallbacks"] == 0 and s["candidates"] == 2, (path, s)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_dense_head_gives_numpys_token_on_random_rows_at_any_row_count(dtype):
    """Random weights of many column scales (not Q8 values), random rows of many scales, 1-40 rows a call, tied (norm
    inside) and untied: numpy's argmax of the fp32 / bf16 kernel's logits, each row's token the same alone and among
    flagged rows."""
    require_kernel(dtype)
    for path in each_greedy_path():
        rng = np.random.default_rng(12)
        n, k = 1003, 128
        w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 0.1, (n, 1))).astype(np.float32)
        tied = LinearKernel(k, n, dtype, transposed=True, norm_eps=1e-6)
        tied.pack(w)
        greedy = GreedyQ8HeadKernel(tied)
        greedy_head.stats(reset=True)
        for m in (1, 2, 5, 8, 13, 16, 40):
            x = rng.standard_normal((1, m, k)) * rng.uniform(1e-3, 1e3, (1, m, 1))
            tok, logits = tokens_and_logits(tied, greedy, x)
            assert np.array_equal(tok, np.argmax(logits, -1)), (path, m)
            if m == 13:
                alone = [tokens_and_logits(tied, greedy, x[:, i:i + 1])[0][0, 0] for i in range(m)]
                assert alone == tok[0].tolist()
                flags = (np.arange(m) % 3 != 1).astype(np.int32)[None]
                part, _ = tokens_and_logits(tied, greedy, x, rows=flags)
                assert part[0].tolist() == [t if f else 0 for t, f in zip(tok[0].tolist(), flags[0])]
        s = greedy_head.stats()
        assert s["fallbacks"] == 0 and s["rows"] > 80 and s["candidates"] < 4 * s["rows"], (path, s)
        untied = LinearKernel(k, n, dtype, transposed=True)
        untied.pack(w)
        x = Tensor((rng.standard_normal((2, 7, k)) * 3).astype(np.float32))
        logits = untied(x, None, None, None, None).asnumpy()
        assert np.array_equal(GreedyQ8HeadKernel(untied)(x, untied.packed_weight).asnumpy(), np.argmax(logits, -1))


# fp32 (~50 s on a 2-vCPU Zen 3) with the slow tests: the dense fp32 head's tokens stay in the default suite in
# test_batch_engine's dense-weights test
@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=pytest.mark.slow), "bfloat16"])
def test_the_dense_default_teacher_takes_the_greedy_head_through_a_q8_copy(dtype):
    """``--weights dense`` on the shipped GGUF: its fp32 head holds the dequantized Q8_0 embedding, so the copy is
    exact (zero error: the native head's bound); its bf16 head (``--dtype bfloat16``) adds the bf16 terms. Either way
    the greedy output is the head's token, np.argmax of its logits."""
    require_kernel(dtype)
    teacher = greedy_teacher(default_model_or_skip(), RuntimeConfig(max_cache_len=128, weights="dense", dtype=dtype))
    assert teacher.weights == "dense" and teacher.cell.lm_head_kernel().format == dtype
    assert teacher.cell.greedy_head.packed_dnorm.asnumpy().any() == (dtype == "bfloat16")  # Q8 values in fp32
    ids = [int(t) for t in np.random.default_rng(9).integers(0, teacher.cfg.vocab_size, 41)]
    greedy_head.stats(reset=True)
    assert_greedy_forwards_give_argmax(teacher, ids, (16, 8, 16, 1))
    s = greedy_head.stats()
    # bf16: the activations' rounding widens the bound (~5 a row on these random-token contexts; docs/kernels.md
    # has the figures on real text)
    per_row = 2 if dtype == "float32" else 8
    assert s["rows"] == 41 and s["fallbacks"] == 0 and s["candidates"] < per_row * s["rows"], s


def test_the_teacher_takes_the_greedy_head_where_it_is_fast_and_keeps_logits_on_the_portable_path():
    """On every path this machine runs: where the head is fast (every SIMD path: AVX-512 with or without VNNI, AVX2,
    NEON) the default teacher's greedy output is the head's token, np.argmax of its logits on a prompt chunk, a tree
    and a decode step; where it is not (the portable path) the load keeps the logits path. The compiled-graph cache
    key tells the two apart."""
    require_kernel("float32")
    keys, in_use = {}, build.current_isa()
    for path in each_greedy_path():
        fast = greedy_head.fast_here()
        assert fast == (path != "generic"), path
        teacher = Teacher.load(default_model_or_skip(), RuntimeConfig(max_cache_len=128))
        assert teacher.weights == "native" and teacher.cell.greedy_head_ready == fast, path
        assert teacher.greedy_output == (ARGMAX if fast else LOGITS), path
        keys[fast] = key_parts(teacher, default_model_or_skip(), None, None)["greedy"]
        if fast and path != in_use:  # the path in use: test_default_teachers_greedy_forwards_give_the_argmax...
            ids = [int(t) for t in np.random.default_rng(8).integers(0, teacher.cfg.vocab_size, 25)]
            greedy_head.stats(reset=True)
            assert_greedy_forwards_give_argmax(teacher, ids, (16, 8, 1))
            assert greedy_head.stats()["rows"] == 25, path
    assert keys[True] != keys[False]  # both kinds ran: the SIMD paths are fast, generic is not


def test_an_untied_q8_output_head_gives_the_argmax_of_its_logits_and_the_same_generation(tmp_path):
    """A Llama GGUF whose output.weight is Q8_0 and not tied to the embedding (as Llama / Qwen2 / Pangu files at
    Q8_0 are): the head takes the final norm's output; greedy forwards and a greedy generation equal the logits
    path's."""
    import transformers
    from ckpt_convert import convert_gguf
    from mindspore_eagle.engine import SpeculativeEngine

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY, attention_bias=False,
                                                                   tie_word_embeddings=False)).eval()
    randomize(model, 3)
    write_tiny_gguf(model, str(tmp_path / "m.gguf"), tokenizer=True, linear_type="Q8_0")
    convert_gguf(str(tmp_path / "m.gguf"), str(tmp_path / "ms"))
    rt = dict(max_cache_len=160, buckets=(1, 8, 16, 32), prefill_chunk=16, weights="native")
    teacher = greedy_teacher(str(tmp_path / "ms"), RuntimeConfig(**rt))
    plain = Teacher.load(str(tmp_path / "ms"), RuntimeConfig(**rt, greedy_output="logits"))
    assert not teacher.cell.tied and teacher.cell.lm_head.kernel.format == "q8"
    ids = [int(t) for t in np.random.default_rng(6).integers(0, 101, 57)]
    greedy_head.stats(reset=True)
    assert_greedy_forwards_give_argmax(teacher, ids, (16, 8, 32, 1))
    assert greedy_head.stats()["rows"] == 57
    prompt = ids[:9]
    assert (list(SpeculativeEngine(teacher).generate(prompt, 40).tokens)
            == list(SpeculativeEngine(plain).generate(prompt, 40).tokens))
    assert greedy_head.stats()["rows"] > 57 and greedy_head.stats()["fallbacks"] == 0


# slow: ~70 s on a 2-vCPU Zen 3; the default teacher's greedy-head tokens stay checked against transformers
# (test_kernel_lossless_default) and the head's argmax against the logits on a dense default teacher
# (test_the_dense_default_teacher_takes_the_greedy_head_through_a_q8_copy)
@pytest.mark.slow
def test_default_teachers_greedy_forwards_give_the_argmax_of_its_logits():
    """The shipped model (native Q8 embedding as the tied head): its greedy output is the head's token (where it is
    fast; elsewhere the head is attached here by hand), equal to np.argmax of its logits on prompt chunks, trees of
    8 / 16 / 32 rows and single decode steps."""
    teacher = greedy_teacher(default_model_or_skip(), RuntimeConfig(max_cache_len=256))
    ids = [int(t) for t in np.random.default_rng(3).integers(0, teacher.cfg.vocab_size, 122)]
    greedy_head.stats(reset=True)
    assert_greedy_forwards_give_argmax(teacher, ids, (64, 8, 16, 32, 1, 1))
    s = greedy_head.stats()
    assert s["rows"] == 122 and s["fallbacks"] == 0 and s["candidates"] < 2 * s["rows"], s
