"""The row top-k kernel (kernels/rows.cc) against numpy: the k largest values of every row in a stable sort's order,
np.argmax's greedy token (first NaN, else first maximum) and the finite flag, bit for bit, whatever else is in the
call; and the training data's teacher forward gives the same outputs through it as through MindSpore's ops."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

from mindspore_eagle.kernels.row_ops import RowTopKKernel


def run(x: np.ndarray, k: int):
    out = ms.jit(RowTopKKernel(k))(ms.Tensor(x))
    return [t.asnumpy() for t in out]


def reference(x: np.ndarray, k: int):
    """numpy: a stable descending sort (equal values by increasing index), np.argmax, np.isfinite."""
    order = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    return np.argmax(x, -1), np.isfinite(x).all(-1), order, np.take_along_axis(x, order, -1)


@pytest.mark.parametrize("k", [1, 5, 32])
@pytest.mark.parametrize("width", [7, 16, 49152 + 5])
def test_topk_greedy_and_finite_equal_numpy_bit_for_bit_with_many_ties(k, width):
    rng = np.random.default_rng(k * 1000 + width)
    # a coarse grid makes ties everywhere, inside blocks and across them; a few finer values, negative zeros
    x = rng.integers(-6, 7, (2, 3, width)).astype(np.float32) / 2
    x[0, 0, : width // 3] = rng.standard_normal(width // 3).astype(np.float32)
    x[1, 2, ::3] = -0.0
    k = min(k, width)
    greedy, finite, ids, values = run(x, k)
    want_greedy, want_finite, want_ids, want_values = reference(x, k)
    assert greedy.dtype == np.int32 and ids.dtype == np.int32 and finite.dtype == np.bool_
    assert np.array_equal(greedy, want_greedy) and np.array_equal(finite, want_finite)
    assert np.array_equal(ids, want_ids)
    assert np.array_equal(values.view(np.uint32), want_values.view(np.uint32))


def test_ascending_and_descending_rows_and_literal_ties():
    rows = np.array([[1, 3, 0, 3, 2, 3, 0, 1], [5] * 8, [0, 1, 2, 3, 4, 5, 6, 7], [7, 6, 5, 4, 3, 2, 1, 0]],
                    np.float32)
    greedy, finite, ids, values = run(rows, 3)
    assert greedy.tolist() == [1, 0, 7, 0]  # written out by hand
    assert ids.tolist() == [[1, 3, 5], [0, 1, 2], [7, 6, 5], [0, 1, 2]]
    assert values.tolist() == [[3, 3, 3], [5, 5, 5], [7, 6, 5], [7, 6, 5]]
    assert finite.all()


def test_a_row_with_nan_or_infinity_is_not_finite_and_its_greedy_is_numpys():
    nan, inf = np.nan, np.inf
    x = np.zeros((5, 40), np.float32)
    x[0, [3, 30]] = [nan, 9]  # np.argmax: the first NaN wins over any maximum
    x[1, [2, 33]] = [9, nan]
    x[2, 17] = inf
    x[3, :] = -inf
    x[4, 20] = 1.0
    greedy, finite, ids, values = run(x, 4)
    assert greedy.tolist() == np.argmax(x, -1).tolist() == [3, 33, 17, 0, 20]
    assert finite.tolist() == [False, False, False, False, True]
    assert ids[3].tolist() == [-1] * 4 and np.isneginf(values[3]).all()  # nothing above -inf: padding
    assert ids[4].tolist() == [20, 0, 1, 2]


def test_a_rows_result_does_not_depend_on_the_other_rows_of_the_call():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((67, 1000)).astype(np.float32)
    whole = run(x, 8)
    for r in (0, 33, 66):
        alone = run(x[r:r + 1], 8)
        for got, part in zip(whole, alone):
            assert np.array_equal(got[r:r + 1], part)


@pytest.mark.slow  # the training data generator's teacher (~19 s on a 2-vCPU Zen 3)
def test_the_data_teacher_forward_gives_the_same_outputs_through_the_kernel_as_through_mindspores_ops():
    from tests.helpers import default_model_or_skip

    from mindspore_eagle.runtime import RuntimeConfig
    from mindspore_eagle.teacher import Teacher
    from mindspore_eagle.train.topk_teacher import TopKTeacher
    from mindspore_eagle.tree import ForwardInputs, TreeLayout

    teacher = Teacher.load(default_model_or_skip(), RuntimeConfig(max_cache_len=64, batch_size=1, buckets=(1, 16),
                                                                  prefill_chunk=16))
    inputs = ForwardInputs.for_tree(TreeLayout.chain(list(range(200, 216))), 0, 16, 64)
    args = [ms.Tensor(a.astype(np.float32 if a is inputs.mask else np.int32))
            for a in (inputs.ids, inputs.positions, inputs.mask, inputs.rows)]
    kernel = TopKTeacher(teacher.cell, 32)
    assert kernel.use_row_kernel
    ops_path = TopKTeacher(teacher.cell, 32)
    ops_path.use_row_kernel = False  # MindSpore's TopK, Argmax and ReduceSum
    got = [t.asnumpy() for t in ms.jit(kernel)(*args)]
    want = [t.asnumpy() for t in ms.jit(ops_path)(*args)]
    for name, a, b in zip(("greedy", "finite", "ids", "values", "aux"), got, want):
        assert np.array_equal(a, b), name  # no exact ties among this teacher's top logits here
