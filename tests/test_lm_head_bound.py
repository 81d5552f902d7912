"""experiments/lm_head_bound.py's candidate rule, on literal Q8 tables: the column holding the exact logits' argmax
is always a candidate (near-ties built on purpose), and well-separated columns leave one candidate."""

import numpy as np

from tests.helpers import load_script


def load_experiment():
    return load_script("experiments", "lm_head_bound.py")


def fp32_chain(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Each column's logit as the kernels compute it: acc = fma(x_k, w_k, acc) in fp32, k ascending (the product is
    exact in fp64, the sum rounded once to fp32)."""
    acc = np.zeros(w.shape[0], np.float32)
    for k in range(w.shape[1]):
        acc = (acc.astype(np.float64) + np.float64(x[k]) * w[:, k].astype(np.float64)).astype(np.float32)
    return acc


def table(rng, v: int, kb: int):
    d = rng.uniform(0.002, 0.02, (v, kb)).astype(np.float16).astype(np.float32)
    q = rng.integers(-128, 128, (v, kb, 32)).astype(np.int8)
    return d, q


def test_the_exact_argmax_is_always_a_candidate_even_at_near_ties():
    exp = load_experiment()
    rng = np.random.default_rng(7)
    d, q = table(rng, 96, 4)
    for j in range(1, 48, 2):  # odd columns: their even neighbour with one int8 value moved by one
        d[j], q[j] = d[j - 1], q[j - 1]
        q[j, 0, j % 32] = np.clip(int(q[j, 0, j % 32]) + 1, -128, 127)
    w = (d[:, :, None] * q.astype(np.float32)).reshape(96, -1)
    w1 = np.abs(w.astype(np.float64)).sum(1)
    q64 = q.astype(np.int64)
    several = 0
    for _ in range(300):
        x = (rng.standard_normal(128) * rng.uniform(0.1, 30)).astype(np.float32)
        exact = fp32_chain(x, w)
        mask, _ = exp.candidates(x, d, q64, w1, 16)
        assert mask[int(np.argmax(exact))]
        several += int(mask.sum()) > 1
    assert several > 0  # the near-ties did reach the bound


def test_a_clear_winner_leaves_one_candidate():
    exp = load_experiment()
    rng = np.random.default_rng(3)
    d, q = table(rng, 64, 4)
    x = (rng.standard_normal(128) * 5).astype(np.float32)
    q[17] = np.where(x.reshape(4, 32) > 0, 127, -128).astype(np.int8)  # column 17 aligned with x: far ahead
    d[17] = 0.05
    w = (d[:, :, None] * q.astype(np.float32)).reshape(64, -1)
    mask, bound = exp.candidates(x, d, q.astype(np.int64), np.abs(w.astype(np.float64)).sum(1), 16)
    assert np.flatnonzero(mask).tolist() == [17] and 0 < bound < 0.05


def test_a_column_whose_estimate_is_pushed_below_a_rival_by_the_whole_bound_stays_a_candidate():
    """The adversarial case: every rounding of x pushes column a's estimate down and column b's up, a's exact logit
    still (barely) the larger. A bound without the activations' rounding (E) drops a (mutation-checked, as
    is one scaled by 0.5)."""
    exp = load_experiment()
    rng = np.random.default_rng(11)
    s = 2.0 ** -10
    n = rng.integers(100, 1000, 32)
    n[0] = 32767  # max|x| = 32767 s, so the kernel's scale is s exactly
    x = np.empty(64, np.float64)
    x[:32] = s * (n + 0.49)
    x[0] = s * 32767
    m = np.full(32, (n.sum() + 30) // 32)
    m[: (n.sum() + 30) % 32] += 1  # sum(m) = sum(n) + 30
    x[32:] = s * (m - 0.49)
    x = x.astype(np.float32)
    d = np.ones((3, 2), np.float32)
    q = np.zeros((3, 2, 32), np.int8)
    q[0, 0], q[1, 1], q[2, :, :4] = 1, 1, -1  # a: the first block; b: the second; a small third column
    w = (d[:, :, None] * q.astype(np.float32)).reshape(3, -1)
    exact = fp32_chain(x, w)
    assert exact[0] > exact[1]
    mask, _ = exp.candidates(x, d, q.astype(np.int64), np.abs(w.astype(np.float64)).sum(1), 16)
    assert mask[0]
