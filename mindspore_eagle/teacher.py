"""``Teacher``: a loaded teacher Cell plus what it takes to call it with static shapes.

The Cell itself (``models.pangu.PanguForCausalLM``) is pure tensor math. This host-side wrapper owns the
things a Cell must not do: choosing the execution mode (PyNative *reference* or compiled *performance*) and
turning numpy ``ForwardInputs`` (already padded to a bucket by ``tree.inputs``, the one padding rule) into a
call and its results back into numpy. Capacity is not checked here: the rows of a forward are a round that
the cache owner (``cache.BranchableKVCache.begin_round``) reserved.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from .attention import AttentionChoice
from .checkpoint import CKPT_NAME, load_strict
from .config import RuntimeConfig, TeacherConfig
from .errors import ConfigError
from .kernels import MatmulChoice, check_packed, matmul_for, pack_weights, select_matmul
from .models.pangu import PanguForCausalLM
from .tree.inputs import ForwardInputs


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
        try:
            ms.set_device("CPU")
        except RuntimeError as exc:
            # MindSpore 2.9 refuses set_device once any kernel ran in the process (MindFormers' own context set-up
            # runs some). That is harmless when the runtime already is on the CPU; anything else is an error.
            current = ms.get_context("device_target")
            if current != "CPU":
                raise ConfigError(f"device 'CPU' requested, but MindSpore already runs on {current!r} in this "
                                  f"process ({exc})") from None


@dataclass(frozen=True)
class ForwardOut:
    """Numpy results of one teacher forward over its real rows (padding rows already dropped)."""

    logits: np.ndarray  # [B, num_real, vocab]
    aux_hidden: np.ndarray  # [B, num_real, 3 * hidden]
    seconds: float  # the call, device transfer of the results included


class Teacher:
    """A teacher Cell bound to a runtime: ``forward(ForwardInputs)`` runs one static-shape forward.

    ``attention`` is the attention core of every layer (``attention.AttentionChoice``; the builder passes the one
    ``deploy.prepare`` picked); a draft head drafting for this teacher is built with the same choice. ``matmul``
    picks the Linear implementation (``kernels.MatmulChoice``); the bare constructor defaults to MindSpore's MatMul
    (a caller that sets weights itself and asks for a custom kernel calls ``kernels.pack_weights`` afterwards),
    ``load`` to the runtime's choice.
    """

    def __init__(self, cfg: TeacherConfig, runtime: RuntimeConfig, attention: AttentionChoice = AttentionChoice(),
                 matmul: MatmulChoice | None = None):
        setup_mindspore(runtime.device)
        self.cfg = cfg
        self.runtime = runtime
        self.attention = attention
        self.matmul = matmul or MatmulChoice()
        self.cell = PanguForCausalLM(cfg, runtime.batch_size, runtime.max_cache_len, attention, matmul)
        self._packed_checked = False
        self._fn = runtime.exec_mode.compile(self.cell)

    @classmethod
    def load(cls, model_dir: str, runtime: RuntimeConfig | None = None,
             attention: AttentionChoice = AttentionChoice(), matmul: MatmulChoice | None = None) -> "Teacher":
        """Load a converted model directory (``config.json`` + ``weights.safetensors``), strictly. The Linears use
        ``matmul`` if given, else the runtime's ``dtype`` / ``matmul`` (``kernels.matmul_for``: the custom
        batch-invariant kernel where it runs); custom kernels are packed once the weights are read."""
        runtime = runtime or RuntimeConfig()
        cfg = TeacherConfig.load(model_dir)
        teacher = cls(cfg, runtime, attention, select_matmul(matmul) if matmul is not None else matmul_for(runtime))
        load_strict(teacher.cell.weight_parameters(), os.path.join(model_dir, CKPT_NAME))
        pack_weights(teacher.cell)
        return teacher

    @property
    def max_len(self) -> int:
        return self.runtime.max_cache_len

    def forward(self, inputs: ForwardInputs) -> ForwardOut:
        """One forward of ``inputs`` (``ids, positions, rows [B, bucket]``, ``mask [B, 1, bucket, max_len]``);
        results of the first ``inputs.num_real`` rows."""
        import mindspore as ms

        b, t = inputs.ids.shape
        if b != self.runtime.batch_size or inputs.mask.shape != (b, 1, t, self.max_len):
            raise ConfigError(f"forward inputs ids {inputs.ids.shape}, mask {inputs.mask.shape}: the runtime was built "
                              f"for batch_size={self.runtime.batch_size}, max_cache_len={self.max_len}")
        if not self._packed_checked:  # once: a custom kernel never packed would compute with NaN weights
            check_packed(self.cell)
            self._packed_checked = True
        start = time.perf_counter()
        logits, aux = self._fn(ms.Tensor(inputs.ids.astype(np.int32)), ms.Tensor(inputs.positions.astype(np.int32)),
                               ms.Tensor(inputs.mask.astype(np.float32)), ms.Tensor(inputs.rows.astype(np.int32)))
        n = inputs.num_real
        logits_np = logits.asnumpy()[:, :n]
        aux_np = aux.asnumpy()[:, :n]
        return ForwardOut(logits_np, aux_np, time.perf_counter() - start)
