"""``Teacher``: a loaded teacher Cell plus what it takes to call it with static shapes.

The Cell itself (``models.pangu.PanguForCausalLM``) is pure tensor math. This host-side wrapper owns the
things a Cell must not do: choosing the execution mode (PyNative *reference* or compiled *performance*),
padding every call to one of a few bucket sizes so graph mode compiles once per bucket, checking cache
capacity before anything is written, and turning results back into numpy.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from .checkpoint import CKPT_NAME, load_strict
from .config import RuntimeConfig, TeacherConfig
from .errors import CacheCapacityError, ConfigError
from .kernels import MatmulChoice, check_packed, pack_weights, select_matmul
from .models.pangu import PanguForCausalLM


def setup_mindspore(device: str = "CPU") -> None:
    """Select the device once per process (PyNative stays the global mode; graphs come from ``ms.jit``)."""
    import mindspore as ms

    os.environ.setdefault("GLOG_v", "3")
    if device == "Ascend":
        try:
            ms.set_device("Ascend")
            ms.Tensor(np.zeros(1, np.float32)).asnumpy()
        except Exception as exc:
            raise ConfigError(f"device 'Ascend' requested but not usable here ({type(exc).__name__}: {exc})") from None
    else:
        ms.set_device("CPU")


@dataclass(frozen=True)
class ForwardOut:
    """Numpy results of one teacher forward over ``num_tokens`` real tokens (padding already removed)."""

    logits: np.ndarray  # [B, T_real, vocab]
    aux_hidden: np.ndarray  # [B, T_real, 3 * hidden]
    seconds: float


class Teacher:
    """A teacher Cell bound to a runtime: ``forward`` takes numpy ids/positions/rows/mask and pads to a bucket."""

    def __init__(self, cfg: TeacherConfig, runtime: RuntimeConfig, cell: PanguForCausalLM | None = None,
                 matmul: MatmulChoice | None = None):
        setup_mindspore(runtime.device)
        self.cfg = cfg
        self.runtime = runtime
        self.cell = cell if cell is not None else PanguForCausalLM(cfg, runtime.batch_size, runtime.max_cache_len,
                                                                   matmul)
        self._packed_checked = False
        self._fn = self._compile()
        self.compile_seconds: dict[int, float] = {}

    def _compile(self):
        import mindspore as ms

        return ms.jit(self.cell) if self.runtime.exec_mode == "performance" else self.cell

    @classmethod
    def load(cls, model_dir: str, runtime: RuntimeConfig | None = None,
             matmul: MatmulChoice | None = None) -> "Teacher":
        """Load a converted model directory (``config.json`` + ``weights.safetensors``), strictly; ``matmul``
        picks the Linear implementation (``kernels.select_matmul`` turns an unavailable one into a fallback)."""
        runtime = runtime or RuntimeConfig()
        cfg = TeacherConfig.load(model_dir)
        teacher = cls(cfg, runtime, matmul=select_matmul(matmul))
        load_strict(teacher.cell.weight_parameters(), os.path.join(model_dir, CKPT_NAME))
        pack_weights(teacher.cell)
        return teacher

    @property
    def max_len(self) -> int:
        return self.runtime.max_cache_len

    def check_capacity(self, first_row: int, bucket: int) -> None:
        """Refuse (before any write) a forward whose padded rows would run past the cache."""
        if first_row < 0 or first_row + bucket > self.max_len:
            raise CacheCapacityError(f"writing {bucket} cache rows from row {first_row} exceeds the cache "
                                     f"capacity max_cache_len={self.max_len}")

    def forward(self, ids: np.ndarray, positions: np.ndarray, rows: np.ndarray, mask: np.ndarray,
                bucket: int | None = None) -> ForwardOut:
        """One forward over ``T`` tokens: ``ids, positions, rows [B, T]``; ``mask [B, 1, T, max_len]`` additive.

        Inputs are padded to ``bucket`` (default: the smallest runtime bucket >= T). Padding tokens are
        written to the rows that follow the last real row (inside the speculative region), are hidden from
        every real token by the mask, and their outputs are dropped.
        """
        import mindspore as ms

        b, t = ids.shape
        if b != self.runtime.batch_size:
            raise ConfigError(f"batch of {b} sequences, but the runtime was built for batch_size="
                              f"{self.runtime.batch_size}")
        bucket = bucket or self.runtime.bucket_for(t)
        if t > bucket:
            raise ConfigError(f"{t} tokens do not fit bucket {bucket}")
        first = int(rows.min())
        self.check_capacity(first, bucket)
        if int(rows.max()) >= self.max_len:
            raise CacheCapacityError(f"cache row {int(rows.max())} is outside max_cache_len={self.max_len}")
        pad = bucket - t
        if pad:
            last = rows.max(axis=1, keepdims=True)
            pad_rows = last + np.arange(1, pad + 1)[None, :]
            if int(pad_rows.max()) >= self.max_len:
                raise CacheCapacityError(f"bucket {bucket} padding would write row {int(pad_rows.max())} beyond "
                                         f"max_cache_len={self.max_len}")
            ids = np.concatenate([ids, np.zeros((b, pad), ids.dtype)], 1)
            positions = np.concatenate([positions, np.broadcast_to(positions[:, -1:], (b, pad))], 1)
            rows = np.concatenate([rows, pad_rows], 1)
            pad_mask = np.zeros((b, 1, pad, self.max_len), np.float32)  # padding rows see everything: harmless
            mask = np.concatenate([mask, pad_mask], 2)
        if not self._packed_checked:  # once: a custom kernel never packed would compute with NaN weights
            check_packed(self.cell)
            self._packed_checked = True
        start = time.perf_counter()
        logits, aux = self._fn(ms.Tensor(ids.astype(np.int32)), ms.Tensor(positions.astype(np.int32)),
                               ms.Tensor(mask.astype(np.float32)), ms.Tensor(rows.astype(np.int32)))
        logits_np = logits.asnumpy()[:, :t]
        aux_np = aux.asnumpy()[:, :t]
        seconds = time.perf_counter() - start
        self.compile_seconds.setdefault(bucket, seconds)
        return ForwardOut(logits_np, aux_np, seconds)
