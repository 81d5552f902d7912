"""``Teacher``: a loaded teacher Cell plus what it takes to call it with static shapes.

The Cell itself (``models.pangu.PanguForCausalLM``) is pure tensor math. This host-side wrapper owns the
things a Cell must not do: choosing the execution mode (PyNative *reference* or compiled *performance*) and
turning numpy ``ForwardInputs`` (already padded to a bucket by ``tree.inputs``, the one padding rule) into a
call and its results back into numpy. Capacity is not checked here: the rows of a forward are a round that
the cache owner (``cache.BranchableKVCache.begin_round``) reserved.

What crosses to the host is what the caller asks for (``forward(inputs, output=...)``, one graph per kind):

    output="argmax"   argmax int32 [B, n]          greedy decoding and verification on a device (``greedy_output``,
                                                   ``RuntimeConfig.greedy_output``): the logits are reduced in the
                                                   graph (``models.outputs``), no [n, vocab] array leaves it
    output="logits"   logits float32 [B, n, vocab] sampling (``verify.target_probs`` needs every probability, after
                                                   temperature / top-k / top-p on the host), and greedy on the
                                                   CPU, where numpy's argmax over them is the cheaper reduction
    both              aux_hidden [B, n, 3H]         the EAGLE-3 features of every real row (the draft reads the
                                                   accepted path's rows, prefill all of them)

Attended context. On the primitive attention path a forward attends over the cache rows ``[0, width)`` of its
mask only, and the mask width is a *context bucket* (``RuntimeConfig.context_sizes``): ``mask_width(rows)`` is
the smallest one holding the committed rows plus the forward's own. Each (output, tokens, width) is one compiled
graph, so the graphs are bounded by ``len(buckets) x len(context_sizes)`` per output kind; ``first_call_s``
records the first call of each (the compile, in performance mode). The fused CPU kernels read only each row's
visible span whatever the width, so there the width is always the whole cache (narrower ones would only add
graphs).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from .compute import ComputeChoice, choose
from .storage.checkpoint import CKPT_NAME, load_strict
from .runtime import RuntimeConfig
from .teacher_config import TeacherConfig
from .errors import CacheCapacityError, ConfigError
from .kernels import MatmulChoice, check_packed, pack_weights
from .models.outputs import GreedyOutputs, LogitsOutputs
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


LOGITS = "logits"
ARGMAX = "argmax"
OUTPUTS = (LOGITS, ARGMAX)


@dataclass(frozen=True)
class ForwardOut:
    """Numpy results of one teacher forward over its real rows (padding rows already dropped). Exactly one of
    ``logits`` / ``argmax`` is set: the one the forward's ``output`` asked for (see the module docstring)."""

    logits: np.ndarray | None  # float32 [B, num_real, vocab]; None for output="argmax"
    aux_hidden: np.ndarray  # [B, num_real, 3 * hidden]
    seconds: float  # the call, device transfer of the results included
    argmax: np.ndarray | None = None  # int32 [B, num_real], numpy's tie rule; None for output="logits"


def native_blocks(model_dir: str, weights: str, matmul: MatmulChoice) -> dict:
    """The quantized blocks the teacher's kernels read (``RuntimeConfig.weights``), name -> (GGML type, raw rows),
    or {} for the dense weights. "native" without blocks, or on a path that cannot compute them, is a ConfigError
    naming what to do; "auto" takes them where both hold."""
    from safetensors import safe_open

    from .storage.checkpoint import QUANTIZED_NAME

    path = os.path.join(model_dir, QUANTIZED_NAME)
    usable = matmul.custom and matmul.dtype == "float32"
    if weights == "dense" or (weights == "auto" and not (usable and os.path.isfile(path))):
        return {}
    if not usable:
        raise ConfigError(f"--weights native: the quantized blocks are computed by the custom float32 kernels, this "
                          f"run uses {matmul}; use --dtype float32 --matmul custom, or --weights dense")
    blocks = {}
    if os.path.isfile(path):
        with safe_open(path, "np") as f:
            kinds = f.metadata() or {}
            blocks = {name: (kinds.get(name, ""), f.get_tensor(name)) for name in f.keys()}
    if not blocks and weights == "native":
        raise ConfigError(f"--weights native: {model_dir} holds no quantized blocks ({QUANTIZED_NAME}): it was "
                          "converted from a dense checkpoint, from a GGUF whose formats are not computed exactly "
                          "(native: Q4_0, Q4_1, Q8_0), or by an earlier version (convert it again; `mindspore-eagle "
                          "setup` does so for the default model); or use --weights dense")
    return blocks


class Teacher:
    """A teacher Cell bound to a runtime: ``forward(ForwardInputs)`` runs one static-shape forward.

    ``compute`` (``compute.ComputeChoice``: the attention core of every layer and the Linears' matmul; the builder
    passes the one ``deploy.prepare`` picked) is kept as ``teacher.compute``: a draft head drafting for this teacher
    is built with the same choice. The bare constructor defaults to primitives and MindSpore's MatMul (a caller
    that sets weights itself and asks for a custom kernel calls ``kernels.pack_weights`` afterwards), ``load`` to
    the runtime's choice (``compute.choose``).
    """

    def __init__(self, cfg: TeacherConfig, runtime: RuntimeConfig, compute: ComputeChoice = ComputeChoice()):
        setup_mindspore(runtime.device)
        self.cfg = cfg
        self.runtime = runtime
        self.compute = compute
        self.cell = PanguForCausalLM(cfg, runtime.batch_size, runtime.max_cache_len, compute)
        self._packed_checked = False
        self._fns = self._graphs()
        # the mask widths a forward may have (module docstring: the fused kernels need no narrower one)
        self.mask_widths = (runtime.max_cache_len,) if self.cell.fused_attention else runtime.context_sizes
        self.first_call_s: dict[tuple[str, int, int], float] = {}  # (output, tokens, width) -> seconds
        self.greedy_output = runtime.greedy_kind  # what greedy requests ask for (RuntimeConfig.greedy_output)
        self.weights = "dense"  # which weights the kernels read: "native" (quantized blocks) or "dense" (load sets it)

    @classmethod
    def load(cls, model_dir: str, runtime: RuntimeConfig | None = None, compute: ComputeChoice | None = None
             ) -> "Teacher":
        """Load a converted model directory (``config.json`` + ``weights.safetensors``), strictly. It computes as
        ``compute`` says if given (a custom matmul that cannot run here falls back to MindSpore's with a message:
        ``ComputeChoice.runnable``), else as the runtime says (``compute.choose``: the custom batch-invariant kernels
        where they run); custom kernels are packed once the weights are read."""
        runtime = runtime or RuntimeConfig()
        cfg = TeacherConfig.load(model_dir)
        compute = compute.runnable() if compute is not None else choose(runtime)
        native = native_blocks(model_dir, runtime.weights, compute.matmul)  # refused here, before anything is built
        teacher = cls(cfg, runtime, compute)
        load_strict(teacher.cell.weight_parameters(), os.path.join(model_dir, CKPT_NAME))
        pack_weights(teacher.cell, native)
        teacher.weights = "native" if native else "dense"
        if runtime.greedy_output == "auto" and teacher.cell.greedy_head_ready:
            teacher.greedy_output = ARGMAX  # the token without the logits is the cheaper greedy output here
        return teacher

    def _graphs(self) -> dict:
        """The callables of each output kind, compiled afresh on first use (new Cells: new graphs)."""
        compile_ = self.runtime.exec_mode.compile
        return {LOGITS: compile_(LogitsOutputs(self.cell)), ARGMAX: compile_(GreedyOutputs(self.cell))}

    @property
    def max_len(self) -> int:
        return self.runtime.max_cache_len

    def mask_width(self, rows: int) -> int:
        """The mask width (cache rows attended) of a forward that writes or sees rows ``[0, rows)``: the smallest
        of ``mask_widths`` holding them. Example, max_cache_len 1024 on the primitive path: 40 -> 128, 300 -> 512."""
        for width in self.mask_widths:
            if width >= rows:
                return width
        raise CacheCapacityError(f"a forward over rows [0, {rows}) does not fit max_cache_len={self.max_len}")

    def forward(self, inputs: ForwardInputs, output: str = LOGITS, logit_rows=None) -> ForwardOut:
        """One forward of ``inputs`` (``ids, positions, rows [B, bucket]``, ``mask [B, 1, bucket, width]`` with
        ``width`` one of ``mask_widths``); ``output`` "logits" or "argmax" (module docstring) of the first
        ``inputs.num_real`` rows. ``logit_rows``: the row indices (below ``num_real``) whose logits the caller
        reads (None: all real rows). Only those are computed where the LM head is a custom kernel (padding rows
        never are); the others come back as NaN there (their argmax: 0), so read only the rows asked for. A
        row's logits are the same bits whichever rows are asked for."""
        import mindspore as ms

        if output not in OUTPUTS:
            raise ConfigError(f"Teacher.forward(output={output!r}): expected one of {OUTPUTS}")
        b, t = inputs.ids.shape
        width = inputs.mask.shape[-1]
        if b != self.runtime.batch_size or inputs.mask.shape != (b, 1, t, width) or width not in self.mask_widths:
            raise ConfigError(f"forward inputs ids {inputs.ids.shape}, mask {inputs.mask.shape}: the runtime was built "
                              f"for batch_size={self.runtime.batch_size}, max_cache_len={self.max_len} and takes "
                              f"mask widths {self.mask_widths}")
        if not self._packed_checked:  # once: a custom kernel never packed would compute with NaN weights
            check_packed(self.cell)
            self._packed_checked = True
        n = inputs.num_real
        flags = np.zeros((b, t), np.int32)
        if logit_rows is None:
            flags[:, :n] = 1
        else:
            picked = np.asarray(logit_rows, np.int64).reshape(-1)
            if picked.size and (picked.min() < 0 or picked.max() >= n):
                raise ConfigError(f"Teacher.forward(logit_rows={picked.tolist()}): rows must lie in [0, {n}), the "
                                  "real rows")
            flags[:, picked] = 1
        start = time.perf_counter()
        try:
            first, aux = self._fns[output](ms.Tensor(inputs.ids.astype(np.int32)),
                                           ms.Tensor(inputs.positions.astype(np.int32)),
                                           ms.Tensor(inputs.mask.astype(np.float32)),
                                           ms.Tensor(inputs.rows.astype(np.int32)), ms.Tensor(flags))
            first_np = first.asnumpy()[:, :n]  # logits [B, n, V] or argmax [B, n]
            aux_np = aux.asnumpy()[:, :n]
        except RuntimeError:
            # a kernel refused its inputs (the stack checks ids, positions and rows before writing anything). MindSpore
            # would fail every later call of that graph, so the next forward compiles fresh ones
            self._fns = self._graphs()
            raise
        seconds = time.perf_counter() - start
        self.first_call_s.setdefault((output, t, width), seconds)
        if output == ARGMAX:
            return ForwardOut(None, aux_np, seconds, argmax=first_np)
        return ForwardOut(first_np, aux_np, seconds)
