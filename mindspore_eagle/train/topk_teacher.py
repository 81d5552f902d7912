"""The teacher forward that training-data generation needs: greedy token, top-k and features, all in the graph.

Why a wrapper: the teacher Cell returns ``logits [B, T, vocab]`` (49k wide for SmolLM2). Copying them to the
host and taking a numpy top-k there cost most of the old generator's time. ``TopKTeacher`` wraps the teacher
Cell unchanged (same Parameters, same KV cache) and returns only what a training shard stores:

    greedy       int32   [B, T]       argmax of the logits (the teacher's greedy next token)
    topk_ids     int32   [B, T, k]    the k largest logits' ids, descending
    topk_logits  float16 [B, T, k]    their values
    aux_hidden   float16 [B, T, 3H]   the EAGLE-3 features (teacher taps low|mid|high)

The argmax is its own op rather than ``topk_ids[..., 0]`` (``ops.TopK`` documents no order among equal values) and
keeps the engine's tie rule (``np.argmax``: the first of equal maxima), so a tie cannot make the data's greedy
token differ from the engine's. Per device, as the engine's greedy output (``RuntimeConfig.greedy_kind``): on a
device ``models.outputs.first_argmax`` states the rule in ops; on the CPU ``ops.Argmax`` already keeps it (tested on
literal ties in ``tests/test_train_batch_greedy.py``) at a fraction of the cost -- ``first_argmax`` is seven passes
over the 49k-wide row, and it made a B=128 decode step of data generation measurably slower (the note of issue 17).
Neither rule is numpy's on a row holding NaN, and a token chosen from NaN/inf logits is corrupt data anyway: the
graph also returns whether each row's logits are finite and ``GreedyTopK.step`` refuses a step where one is not.

``GreedyTopK`` is the host side: ``step`` runs one decode step of ``B`` slots (it builds the chain mask: each slot
sees its own rows ``<=`` the row it writes), ``prefill`` one teacher-forced chunk of a single sequence (batch 1,
``tree.ForwardInputs`` of a chain: ``train.rebuild`` rebuilds stored answers' features with it); both turn the
outputs into numpy. The same compiled Cell serves both, one graph per chunk size. On the fused CPU kernels a row's
outputs depend on neither the other rows of the call nor their number (``kernels/compute.cc``,
``kernels/attention.cc``), so a prefill chunk reproduces a decode step's outputs bit for bit
(``tests/test_train_ledger.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from ..errors import CacheCapacityError, ConfigError, DataError
from ..models.outputs import first_argmax
from ..tree.inputs import ForwardInputs
from ..tree.mask import MASK_VALUE


class TopKTeacher(nn.Cell):
    """``construct(input_ids, positions, mask, cache_rows) -> (greedy, finite, topk_ids, topk_logits, aux_hidden)``;
    inputs exactly as the teacher Cell's (``models.pangu.PanguForCausalLM``), outputs as in the module docstring,
    plus ``finite bool [B, T]``: every logit of the row is finite. ``device`` picks the argmax (module docstring)."""

    def __init__(self, teacher_cell, k: int, device: str = "CPU"):
        super().__init__(auto_prefix=False)  # the teacher's Parameters keep their names (checkpoints, the trainer)
        self.teacher = teacher_cell
        self.k = k
        self.row_kernel = _row_kernel(k) if device == "CPU" else None
        self.use_row_kernel = self.row_kernel is not None
        self.topk = ops.TopK(sorted=True)
        self.rule_in_ops = device != "CPU"
        self.argmax = ops.Argmax(axis=-1, output_type=ms.int32)
        self.row_sum = ops.ReduceSum()

    def construct(self, input_ids, positions, mask, cache_rows):
        logits, aux = self.teacher(input_ids, positions, mask, cache_rows)  # [B, T, V], [B, T, 3H]
        if self.use_row_kernel:
            greedy, finite, ids, values = self.row_kernel(logits)
            return greedy, finite, ids, ops.cast(values, ms.float16), ops.cast(aux, ms.float16)
        values, ids = self.topk(logits, self.k)  # [B, T, k] each, descending
        if self.rule_in_ops:
            greedy = first_argmax(logits)  # [B, T] int32
        else:
            greedy = self.argmax(logits)
        finite = ops.isfinite(self.row_sum(logits, -1))  # one NaN or inf anywhere in the row makes its sum so
        return greedy, finite, ops.cast(ids, ms.int32), ops.cast(values, ms.float16), ops.cast(aux, ms.float16)


def _row_kernel(k: int):
    """``kernels.row_ops.RowTopKKernel`` where the kernel library runs (the same outputs as MindSpore's ops, in a
    few milliseconds instead of ~39 per 64 rows), else None (MindSpore's TopK, Argmax and ReduceSum)."""
    from ..kernels.row_ops import RowTopKKernel

    try:
        return RowTopKKernel(k)
    except ConfigError:
        return None


@dataclass(frozen=True)
class StepOut:
    """Numpy outputs of one decode step (one token per slot; for ``GreedyTopK.prefill``: one row per real token of
    the chunk, ``[T]`` and ``[T, ...]`` in place of ``[B]`` and ``[B, ...]``)."""

    greedy: np.ndarray  # [B] int32
    topk_ids: np.ndarray  # [B, k] int32
    topk_logits: np.ndarray  # [B, k] float16
    aux_hidden: np.ndarray  # [B, 3H] float16


class GreedyTopK:
    """One token per slot per call: slot ``b`` feeds ``ids[b]`` at position and cache row ``rows[b]``.

    The cache is the teacher Cell's own (``[B, Hkv, max_len, D]``, ``teacher.runtime``); a row's K/V is
    written by the call that feeds it, and the mask lets slot ``b`` see rows ``0..rows[b]`` only. Whatever a
    slot wrote above ``rows[b]`` earlier (an older sequence) is invisible and overwritten in order.
    """

    def __init__(self, teacher, k: int):
        if not 1 <= k <= teacher.cfg.vocab_size:
            raise ConfigError(f"top-k={k}: must be in [1, vocab_size={teacher.cfg.vocab_size}]")
        self.teacher = teacher
        self.k = k
        self.batch_size = teacher.runtime.batch_size
        self.max_len = teacher.max_len
        cell = TopKTeacher(teacher.cell, k, teacher.runtime.device)
        self._fn = teacher.runtime.exec_mode.compile(cell)
        self._cols = np.arange(self.max_len)[None, :]  # [1, S]

    def step(self, ids: np.ndarray, rows: np.ndarray) -> StepOut:
        """``ids, rows [B]`` int: the token each slot feeds and its row (= its position: a chain)."""
        if ids.shape != (self.batch_size,) or rows.shape != (self.batch_size,):
            raise ConfigError(f"GreedyTopK.step: ids {ids.shape} and rows {rows.shape} must both be "
                              f"({self.batch_size},)")
        if rows.min() < 0 or rows.max() >= self.max_len:
            raise CacheCapacityError(f"cache rows {int(rows.min())}..{int(rows.max())} outside "
                                     f"[0, max_cache_len={self.max_len})")
        mask = np.where(self._cols <= rows[:, None], np.float32(0.0), MASK_VALUE)  # [B, S]
        r = rows.astype(np.int32)[:, None]  # [B, 1]
        return self._call(ids.astype(np.int32)[:, None], r, mask[:, None, None, :], r, lambda out: out[:, 0])

    def prefill(self, inputs: ForwardInputs) -> StepOut:
        """One teacher-forced chunk of a single sequence (``batch_size`` 1): ``inputs`` as ``tree.ForwardInputs``
        builds them for a chain, its mask over the whole cache (``[1, 1, bucket, max_cache_len]``: the width a
        decode step's mask has); the outputs of its ``num_real`` real rows, padding rows dropped."""
        if self.batch_size != 1 or inputs.mask.shape[-1] != self.max_len:
            raise ConfigError(f"GreedyTopK.prefill: batch_size {self.batch_size} and mask width "
                              f"{inputs.mask.shape[-1]} must be 1 and max_cache_len={self.max_len}")
        n = inputs.num_real
        return self._call(inputs.ids, inputs.positions, inputs.mask, inputs.rows, lambda out: out[0, :n])

    def _call(self, ids, positions, mask, rows, pick) -> StepOut:
        """Run the graph on ``[B, T]`` inputs; ``pick`` selects the returned rows of each ``[B, T, ...]`` output. A
        returned row whose logits are not all finite is a DataError naming its slot and cache row."""
        inputs = (ids.astype(np.int32), positions.astype(np.int32), mask.astype(np.float32), rows.astype(np.int32))
        greedy, finite, tk_ids, tk_val, aux = self._fn(*(Tensor(a) for a in inputs))
        bad = ~pick(finite.asnumpy())
        if bad.any():
            slots = pick(np.broadcast_to(np.arange(rows.shape[0])[:, None], rows.shape))[bad]
            raise DataError(f"the teacher's logits hold NaN or inf in slots {sorted(set(slots.tolist()))} (cache rows "
                            f"{pick(rows)[bad].tolist()}): a greedy token and top-k taken from them would be stored "
                            "as data. Check the checkpoint and the dtype (float32 is the reference).")
        return StepOut(*(pick(t.asnumpy()) for t in (greedy, tk_ids, tk_val, aux)))


__all__ = ["GreedyTopK", "StepOut", "TopKTeacher"]
