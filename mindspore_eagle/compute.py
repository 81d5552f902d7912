"""The one place that chooses how the models compute: the attention core, the Linears' matmul, and whether a
decoder layer runs as the fused CPU kernels.

Why one place: the three parts depend on each other (the fused CPU layer needs the custom matmul *and* the reference
attention backend), and each used to be decided by its own function in its own module. ``choose`` decides all three
from a ``RuntimeConfig`` (and, on Ascend, the deployment's compute dtype); the builder (``deploy.prepare``) passes
the one ``ComputeChoice`` to the teacher, and the draft head drafting for it gets the teacher's. No Cell reads
ambient state: a Cell is built from the ``ComputeChoice`` it is given.

Rule table of ``choose``, device x exec mode x kernels available (``RuntimeConfig.matmul`` / ``dtype``):

    device  exec mode    matmul / dtype          kernels here  attention  matmul              fused_layers(D)
    CPU     any          "mindspore" / float32   any           reference  mindspore float32   False
    CPU     any          "auto" / float32        yes           reference  custom float32      D % 16 == 0
    CPU     any          "auto" / float32        no            reference  mindspore float32   False (a one-line
                                                                                              message says why)
    CPU     any          "custom" or bfloat16    yes           reference  custom dtype        D % 16 == 0
    CPU     any          "custom" or bfloat16    no            ConfigError naming the reason (never a silent
                                                               change of precision)
    Ascend  performance  any                     -             fused      mindspore float32   False
    Ascend  reference    any                     -             reference  mindspore float32   False

The fused attention's compute dtype (Ascend) is the deployment's (``AscendDeployment.compute_dtype``, default
float16). ``choose`` touches no device: ``deploy.prepare`` validates the plan and selects the device first.
A ``ComputeChoice`` made by hand (a test, a benchmark) goes through ``runnable``: a custom matmul the kernels cannot
run here falls back to MindSpore's float32 MatMul with the same one-line message.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

from .attention import FUSED, REFERENCE, AttentionChoice, select_backend
from .errors import ConfigError
from .kernels import MatmulChoice, fused_attention_supported
from .kernels import ops as kernel_ops
from .kernels.choice import CUSTOM, MINDSPORE


@dataclass(frozen=True)
class ComputeChoice:
    """How a model computes: its attention core (``attention.AttentionChoice``) and its Linears' matmul
    (``kernels.MatmulChoice``). The default, primitives and MindSpore's MatMul, is the trainer's (it has
    gradients) and the reference."""

    attention: AttentionChoice = AttentionChoice()
    matmul: MatmulChoice = MatmulChoice()

    def __post_init__(self) -> None:
        if not isinstance(self.attention, AttentionChoice):
            raise ConfigError(f"ComputeChoice.attention={self.attention!r}: expected an attention.AttentionChoice")
        if not isinstance(self.matmul, MatmulChoice):
            raise ConfigError(f"ComputeChoice.matmul={self.matmul!r}: expected a kernels.MatmulChoice")

    def fused_layers(self, head_dim: int) -> bool:
        """Whether a decoder layer takes the fused CPU path (``models.layers``): custom linear kernels, the reference
        (CPU) attention backend, and a head size the attention kernel takes (a multiple of 16)."""
        return self.matmul.custom and self.attention.backend == REFERENCE and fused_attention_supported(head_dim)

    def runnable(self, log=None) -> "ComputeChoice":
        """This choice when its matmul can run here; otherwise the same with MindSpore's float32 MatMul, with a
        one-line message on ``log`` (default stderr) naming why."""
        matmul = _runnable_matmul(self.matmul, log)
        return self if matmul is self.matmul else replace(self, matmul=matmul)


def _runnable_matmul(requested: MatmulChoice, log=None) -> MatmulChoice:
    if not requested.custom:
        return requested
    status = kernel_ops.kernel_status(requested.dtype)
    if status.library is not None:
        return requested
    print(f"mindspore_eagle: custom {requested.dtype} linear kernel unavailable ({status.reason}); "
          "using MindSpore's float32 MatMul", file=log or sys.stderr)
    return MatmulChoice(MINDSPORE, "float32")


def _matmul(runtime) -> MatmulChoice:
    """The matmul rows of the module docstring's table."""
    if runtime.device != "CPU" or runtime.matmul == MINDSPORE:
        return MatmulChoice(MINDSPORE, "float32")
    requested = MatmulChoice(CUSTOM, runtime.dtype)
    if runtime.matmul == CUSTOM or runtime.dtype == "bfloat16":
        status = kernel_ops.kernel_status(runtime.dtype)
        if status.library is None:
            raise ConfigError(f"--dtype {runtime.dtype} --matmul {runtime.matmul}: the custom {runtime.dtype} linear "
                              f"kernel cannot run here ({status.reason}); use --matmul mindspore (float32 only)")
        return requested
    return _runnable_matmul(requested)


def choose(runtime, deployment=None) -> ComputeChoice:
    """The ``ComputeChoice`` of a ``RuntimeConfig`` (the module docstring's table); ``deployment``: the
    ``deploy.AscendDeployment`` whose ``compute_dtype`` the fused attention takes (None: its default)."""
    backend = select_backend(runtime.device, runtime.exec_mode)
    attention = AttentionChoice(backend)
    if backend == FUSED and deployment is not None:
        attention = AttentionChoice(backend, deployment.compute_dtype)
    return ComputeChoice(attention, _matmul(runtime))


__all__ = ["ComputeChoice", "choose"]
