"""What a teacher forward hands to the host when it does not need the logits: the greedy token of every row.

Why: the teacher Cell returns ``logits [B, T, vocab]`` (49152 wide for SmolLM2), and greedy verification reads
one number per row of them -- the argmax. Reducing them in the graph keeps ``T x vocab`` floats on the device;
only ``int32 [B, T]`` crosses to the host (on this CPU the full transfer cost only 0.017 ms, measured; on a device it is
a device-to-host copy of megabytes every step).

The tie rule is numpy's, because the engine's logits path (``np.argmax``) and training data
(``train.topk_teacher``) must pick the same token as this path: the lowest index among equal maxima, and the first
NaN if a row holds one. MindSpore documents no tie rule for ``ops.argmax`` (on this CPU it happens to return the
lowest index; on Ascend it is unverified), so ``first_argmax`` states the rule in ops rather than relying on it.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops


def first_argmax(x):
    """int32 ``[...]``: the index of the largest value along the last axis of ``x [..., V]``; among equal maxima
    the lowest index; if the row holds a NaN, the first NaN (``np.argmax`` exactly).

    How: ``top = max(x)``; every column that equals ``top`` keeps its index, every other one becomes ``V``; the
    minimum is the first maximum. Example: ``[1, 3, 0, 3] -> top 3 -> [4, 1, 4, 3] -> 1``. The same with
    ``isnan(x)`` gives the first NaN, which wins when there is one (``V`` means none).
    """
    v = x.shape[-1]
    ids = ops.arange(v, dtype=ms.int32)  # [V], broadcast over the leading axes
    none = ops.full_like(ids, v)
    top = ops.ReduceMax(keep_dims=True)(x, -1)  # [..., 1]
    first_max = ops.ReduceMin()(ops.select(ops.equal(x, top), ops.broadcast_to(ids, x.shape),
                                           ops.broadcast_to(none, x.shape)), -1)
    first_nan = ops.ReduceMin()(ops.select(ops.isnan(x), ops.broadcast_to(ids, x.shape),
                                           ops.broadcast_to(none, x.shape)), -1)
    return ops.select(ops.less(first_nan, v), first_nan, first_max)


class LogitsOutputs(nn.Cell):
    """The teacher Cell as it is (``construct`` -> (logits, aux_hidden)), in a Cell of its own: a fresh instance
    compiles fresh graphs, which is how ``Teacher`` recovers once a kernel of a compiled graph has failed (MindSpore
    2.10 then fails every later call of that graph, "Invalid output number for flatten stub output nodes")."""

    def __init__(self, teacher_cell):
        super().__init__(auto_prefix=False)
        self.teacher = teacher_cell

    def construct(self, input_ids, positions, mask, cache_rows, logit_rows=None):
        return self.teacher(input_ids, positions, mask, cache_rows, logit_rows)


class GreedyOutputs(nn.Cell):
    """The teacher Cell with its logits reduced in the graph.

    ``construct(input_ids, positions, mask, cache_rows) -> (argmax int32 [B, T], aux_hidden [B, T, 3H])``; inputs
    exactly as ``models.pangu.PanguForCausalLM``'s, whose Parameters and KV cache it shares (``auto_prefix=False``:
    the names stay the checkpoint's). Where the teacher has a greedy Q8 head (``greedy_head_ready``: a native Q8
    or dense head on the SIMD paths) the tokens come from it and no logits are computed; elsewhere from
    ``first_argmax`` of the logits. Both give ``np.argmax`` of the logits ``LogitsOutputs`` returns.
    """

    def __init__(self, teacher_cell):
        super().__init__(auto_prefix=False)
        self.teacher = teacher_cell

    def construct(self, input_ids, positions, mask, cache_rows, logit_rows=None):
        if self.teacher.greedy_head_ready:  # the token straight from the greedy Q8 head (kernels.greedy_head)
            return self.teacher.greedy(input_ids, positions, mask, cache_rows, logit_rows)
        logits, aux = self.teacher(input_ids, positions, mask, cache_rows, logit_rows)  # [B, T, V], [B, T, 3H]
        return first_argmax(logits), aux


__all__ = ["GreedyOutputs", "LogitsOutputs", "first_argmax"]
