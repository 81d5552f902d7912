"""``MatmulChoice``: which implementation a ``Linear`` (and the tied LM head) multiplies with.

Chosen with the attention core by ``compute.choose`` (the ``matmul`` of a ``compute.ComputeChoice``) and passed
explicitly down through the model constructors to every ``Linear``; there is no process-wide default to change. The
default, ``MatmulChoice()``, is MindSpore's own ``MatMul`` in fp32: what every model did before the kernels.

    MatmulChoice("mindspore", "float32")   ops.MatMul on the weight Parameter (has a gradient: training uses it)
    MatmulChoice("custom", "float32")      the kernels of kernels/compute.cc (AVX-512, AVX2, NEON or portable: the same
                                           bits) on a packed fp32 copy, or on the GGUF's blocks (``--weights native``)
    MatmulChoice("custom", "bfloat16")     bf16 weights and activations, fp32 sums (AVX512-BF16, or widened exactly)

The custom kernels have no backward pass (no ``bprop``): a trainer must keep the "mindspore" choice.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

MINDSPORE = "mindspore"
CUSTOM = "custom"
BACKENDS = (MINDSPORE, CUSTOM)
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class MatmulChoice:
    """The matmul backend and its compute dtype (inputs and outputs of a Linear stay fp32 either way)."""

    backend: str = MINDSPORE
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"MatmulChoice.backend={self.backend!r}: expected one of {BACKENDS}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"MatmulChoice.dtype={self.dtype!r}: expected one of {DTYPES}")
        if self.backend == MINDSPORE and self.dtype != "float32":
            raise ConfigError(f"MatmulChoice(backend='mindspore', dtype={self.dtype!r}): MindSpore's CPU MatMul "
                              "has no bf16 kernel; use backend='custom' for bfloat16")

    @property
    def custom(self) -> bool:
        return self.backend == CUSTOM


__all__ = ["BACKENDS", "CUSTOM", "DTYPES", "MINDSPORE", "MatmulChoice"]
