"""Row reductions of logits as a MindSpore Cell: ``RowTopKKernel``, the one-pass greedy / finite / top-k of
``rows.cc`` (numerics there), for the training data's teacher forward (``train.topk_teacher``).

Why: MindSpore's CPU ``TopK``, ``Argmax`` and ``ReduceSum`` over the 49k-wide rows of the default teacher cost ~39 ms
for 64 rows, half of the teacher forward that made them (~77 ms), in every data-generation step and ledger-rebuild
chunk.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from ..errors import ConfigError
from .ops import kernel_status


class RowTopKKernel(nn.Cell):
    """``construct(logits [..., V] f32) -> (greedy int32 [...], finite bool [...], ids int32 [..., k],
    values f32 [..., k])``, per row: ``np.argmax`` (first NaN, else first maximum), every value finite, and the k
    largest values descending, equal values by increasing index. ConfigError when the kernel library cannot run
    here (``train.topk_teacher`` then uses MindSpore's ops)."""

    def __init__(self, k: int):
        super().__init__()
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"RowTopKKernel(k={k!r}): k must be an integer >= 1")
        status = kernel_status("float32")
        if status.library is None:
            raise ConfigError(f"the row top-k kernel cannot run here: {status.reason}")
        self.k = k

        def infer_shape(x):
            return [x[0]], [x[0]], [x[0], k], [x[0], k]

        def infer_dtype(x):
            return ms.int32, ms.int32, ms.int32, x

        self.op = ops.Custom(status.library.symbol("MseRowTopK"), out_shape=infer_shape, out_dtype=infer_dtype,
                             func_type="aot")

    def construct(self, logits):
        lead = logits.shape[:-1]
        greedy, finite, ids, values = self.op(logits.reshape((-1, logits.shape[-1])))
        return (greedy.reshape(lead), finite.reshape(lead) != 0, ids.reshape(lead + (self.k,)),
                values.reshape(lead + (self.k,)))


__all__ = ["RowTopKKernel"]
