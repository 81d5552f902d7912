"""How a model runs: ``RuntimeConfig`` (cache length, execution mode, device, buckets, dtype, kernels), the static
``Buckets`` every forward is padded to, and ``ExecMode``; frozen and validated where they are made.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import CacheCapacityError, ConfigError
from .fields import require_positive


class ExecMode(enum.Enum):
    """How Cells run: PERFORMANCE compiles them (``ms.jit``, one graph per input shape); REFERENCE runs them in
    PyNative and makes the engine cross-check every step (slow: for checking, never for serving)."""

    PERFORMANCE = "performance"
    REFERENCE = "reference"

    @classmethod
    def parse(cls, value: "ExecMode | str") -> "ExecMode":
        """An ExecMode from itself or its name ("performance" / "reference"); ConfigError otherwise."""
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"exec_mode={value!r}: expected one of {[m.value for m in cls]}") from None

    def compile(self, cell):
        """The callable that runs ``cell`` in this mode: the compiled graph, or the Cell itself."""
        import mindspore as ms

        return ms.jit(cell) if self is ExecMode.PERFORMANCE else cell


def parse_sizes(text: str, what: str) -> tuple[int, ...]:
    """Integers from a comma-separated list, the CLI's form of bucket lists: "1,8,16,64" -> (1, 8, 16, 64)."""
    try:
        return tuple(int(b) for b in str(text).split(","))
    except ValueError:
        raise ConfigError(f"{what}={text!r}: expected comma-separated integers, e.g. 1,8,16,64") from None


def smallest_holding(sizes, n: int, default: int | None = None) -> int | None:
    """The smallest of ``sizes`` that is >= ``n`` (``default`` when none is): the one bucket rule, for forward
    buckets, cost tables and training lengths alike."""
    return min((b for b in sizes if b >= n), default=default)


@dataclass(frozen=True)
class Buckets:
    """The static row counts a forward may have: each size compiles one graph, so every forward (prefill chunk,
    tree verification, draft context chunk, row-move list) is padded up to one of them.

    Rules, in one place: sizes are distinct positive integers, sorted, and include 1 (a decode step).
    ``fit(n)`` is the smallest size holding ``n`` rows. Example: sizes (1, 8, 16): fit(1) = 1, fit(5) = 8,
    fit(16) = 16, fit(17) raises ConfigError.

    Why the default has 2 and 4: a graph compiles only when a forward first needs it, and with the GGUF's native
    blocks a verified row is dear while the decode step is cheap (AVX-512 Xeon, native Q4_1, context 256: 2 / 4 / 8
    rows cost 1.13 / 1.45 / 2.22 decode steps), so the adaptive budget needs small trees to draft at all on text
    its drafts rarely predict. Adding them took 12 outside prompts from 0.98x to 1.01-1.03x of greedy (aggregate
    tok/s, 2 interleaved rounds) and left the evaluation prompts where they were (1.21-1.23x).
    """

    sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)

    def __post_init__(self) -> None:
        raw = tuple(self.sizes) if isinstance(self.sizes, (tuple, list)) else (self.sizes,)
        if not raw or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in raw):
            raise ConfigError(f"buckets={self.sizes!r}: must be positive integers")
        sizes = tuple(sorted(set(int(b) for b in raw)))
        if sizes[0] != 1:
            raise ConfigError(f"buckets={sizes}: must contain 1 (the decode step)")
        object.__setattr__(self, "sizes", sizes)

    @classmethod
    def parse(cls, text: str) -> "Buckets":
        """From a comma-separated list, e.g. "1,8,16,64" (the CLI's form)."""
        return cls(parse_sizes(text, "buckets"))

    @property
    def largest(self) -> int:
        return self.sizes[-1]

    def fit(self, num_rows: int) -> int:
        """Smallest size >= ``num_rows`` (>= 1)."""
        b = smallest_holding(self.sizes, num_rows)
        if b is None:
            raise ConfigError(f"{num_rows} rows exceed the largest bucket {self.largest} (buckets={self.sizes})")
        return b

    def chunks(self, num_rows: int, max_chunk: int, room: int) -> list[tuple[int, int]]:
        """Split ``num_rows`` rows into ``(size, bucket)`` chunks of at most ``max_chunk`` real rows whose padded
        buckets, written one after the other, use at most ``room`` rows (the cache rows left).

        Near the end of the room a chunk shrinks to the largest bucket that still fits (then it has no padding).
        Example, sizes (1, 8, 16, 32, 64), 70 rows, chunk 64: room 1000 -> [(64, 64), (6, 8)]; room 70 ->
        [(64, 64)] + [(1, 1)] * 6 (a padded bucket of 8 would not fit the 6 rows left). CacheCapacityError when
        the rows do not fit the room at all.
        """
        if num_rows > room:
            raise CacheCapacityError(f"{num_rows} rows do not fit: {room} cache rows left")
        out, done = [], 0
        while done < num_rows:
            size = min(num_rows - done, max_chunk)
            bucket = self.fit(size)
            if bucket > room:
                fitting = [b for b in self.sizes if b <= min(size, room)]
                if not fitting:
                    raise CacheCapacityError(f"{num_rows - done} more rows do not fit: {room} cache rows left")
                bucket = size = fitting[-1]
            out.append((size, bucket))
            done += size
            room -= size
        return out


@dataclass(frozen=True)
class RuntimeConfig:
    """How a teacher runs: cache size, batch, execution mode and the static shape buckets.

    ``buckets`` (a ``Buckets``; a tuple is converted) are the row counts a forward may have, used by prefill
    chunks, tree verification, the draft's context chunks and cache row moves alike. ``prefill_chunk`` must be
    one of them. ``exec_mode`` is an ``ExecMode`` (its name is accepted and converted once, here).

    ``dtype`` is the compute dtype of every Linear of the teacher and the draft head: "float32" (the parity path
    against transformers) or "bfloat16" (bf16 weights and activations, fp32 sums: the Ascend-like regime; needs the
    custom kernel). ``matmul`` picks the Linear implementation: "auto" (the custom batch-invariant kernel of
    ``mindspore_eagle.kernels`` where this machine runs it, else MindSpore's MatMul, with a message), "custom"
    (the kernel or an error) or "mindspore". Speculative output equals greedy output *in the same dtype*.

    ``weights`` says which copy of a quantized checkpoint's weights the teacher's kernels read: "native" (the
    GGUF's own Q4_0 / Q4_1 / Q8_0 blocks, rebuilt in registers with the converter's arithmetic: the same fp32
    teacher bit for bit, reading ~6x fewer bytes; needs the custom kernels in float32 and a model converted with
    its blocks), "dense" (the dequantized fp32 weights), or "auto": native where the model has blocks and the
    run is custom float32, else dense.

    ``context_buckets`` are the mask widths (cache rows attended) a forward may have on the primitive attention
    path (``models.layers.CachedAttention``): a forward attends over the smallest one holding the committed rows
    plus its own, and each (bucket, context bucket) compiles one graph on first use. ``None`` (the default) means
    the powers of two from 128 below ``max_cache_len``, and ``max_cache_len``; given sizes must lie in
    ``[1, max_cache_len]``, and ``max_cache_len`` is always added (every forward fits it). ``(max_cache_len,)``
    turns context bucketing off. ``context_sizes`` is the resolved tuple. Example, max_cache_len 1024:
    (128, 256, 512, 1024); max_cache_len 160: (128, 160).

    ``greedy_output`` is what a greedy forward hands the host (``teacher`` module docstring): "argmax" (the
    logits reduced in the graph, int32 ids), "logits" (the host takes ``np.argmax``), or "auto": "argmax" on a
    device, "logits" on the CPU, where the host is the device and reducing in the graph is the dearer way
    (measured, [16, 49152] fp32: in-graph tie-safe argmax 10.8 ms, logits to numpy + ``np.argmax`` 0.86 ms),
    except where the teacher has a greedy Q8 head (``Teacher.load``: a native Q8 or a dense fp32 / bf16 LM head
    without bias, tied or not, on the AVX-512, AVX2 and NEON paths, ``kernels.greedy_head``), which computes the
    token without the logits: "argmax" there.
    ``greedy_kind`` is the resolved choice before the model is known.
    """

    max_cache_len: int = 1024
    batch_size: int = 1
    exec_mode: ExecMode = ExecMode.PERFORMANCE
    device: str = "CPU"
    buckets: Buckets = Buckets()
    prefill_chunk: int = 64
    dtype: str = "float32"
    matmul: str = "auto"
    context_buckets: tuple[int, ...] | None = None
    greedy_output: str = "auto"
    weights: str = "auto"

    def __post_init__(self) -> None:
        require_positive(self, "max_cache_len", "batch_size", "prefill_chunk")
        if self.greedy_output not in ("auto", "argmax", "logits"):
            raise ConfigError(f"RuntimeConfig.greedy_output={self.greedy_output!r}: expected 'auto', 'argmax' or "
                              f"'logits'")
        if self.context_buckets is not None:
            raw = self.context_buckets
            if (not isinstance(raw, (tuple, list)) or not raw
                    or any(isinstance(c, bool) or not isinstance(c, (int, np.integer)) for c in raw)):
                raise ConfigError(f"RuntimeConfig.context_buckets={raw!r}: must be a non-empty sequence of integers")
            bad = [int(c) for c in raw if not 1 <= c <= self.max_cache_len]
            if bad:
                raise ConfigError(f"RuntimeConfig.context_buckets={tuple(raw)}: {bad} outside [1, max_cache_len="
                                  f"{self.max_cache_len}]")
            object.__setattr__(self, "context_buckets", tuple(sorted({int(c) for c in raw})))
        object.__setattr__(self, "exec_mode", ExecMode.parse(self.exec_mode))
        if self.device not in ("CPU", "Ascend"):
            raise ConfigError(f"RuntimeConfig.device={self.device!r}: expected 'CPU' or 'Ascend'")
        if not isinstance(self.buckets, Buckets):
            object.__setattr__(self, "buckets", Buckets(self.buckets))
        if self.prefill_chunk not in self.buckets.sizes:
            raise ConfigError(f"RuntimeConfig.prefill_chunk={self.prefill_chunk} must be one of the buckets "
                              f"{self.buckets.sizes}")
        if self.buckets.largest > self.max_cache_len:
            raise ConfigError(f"RuntimeConfig.buckets: largest bucket {self.buckets.largest} exceeds "
                              f"max_cache_len={self.max_cache_len}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"RuntimeConfig.dtype={self.dtype!r}: expected 'float32' or 'bfloat16'")
        if self.matmul not in ("auto", "custom", "mindspore"):
            raise ConfigError(f"RuntimeConfig.matmul={self.matmul!r}: expected 'auto', 'custom' or 'mindspore'")
        if self.weights not in ("auto", "dense", "native"):
            raise ConfigError(f"RuntimeConfig.weights={self.weights!r}: expected 'auto', 'dense' or 'native'")
        if self.weights == "native" and (self.dtype != "float32" or self.matmul == "mindspore"):
            raise ConfigError(f"RuntimeConfig(weights='native', dtype={self.dtype!r}, matmul={self.matmul!r}): the "
                              "quantized blocks are computed by the custom float32 kernels; use dtype='float32' with "
                              "matmul 'auto' or 'custom', or weights='dense'")
        if self.dtype == "bfloat16" and self.matmul == "mindspore":
            raise ConfigError("RuntimeConfig(dtype='bfloat16', matmul='mindspore'): MindSpore's CPU MatMul has no "
                              "bf16 kernel; use matmul='auto' or 'custom'")

    @property
    def reference(self) -> bool:
        return self.exec_mode is ExecMode.REFERENCE

    @property
    def greedy_kind(self) -> str:
        """``greedy_output`` resolved: "argmax" or "logits" (class docstring)."""
        if self.greedy_output != "auto":
            return self.greedy_output
        return "logits" if self.device == "CPU" else "argmax"

    @property
    def context_sizes(self) -> tuple[int, ...]:
        """The context buckets, resolved (see the class docstring), ascending, ending at ``max_cache_len``."""
        given = self.context_buckets
        if given is None:
            given = tuple(2 ** k for k in range(7, self.max_cache_len.bit_length()) if 2 ** k < self.max_cache_len)
        return tuple(sorted(set(given) | {self.max_cache_len}))

    def check_tree_size(self, max_nodes: int, what: str = "TreeBudget.max_nodes") -> int:
        """The verification bucket of a tree of ``max_nodes`` nodes; ConfigError naming both sides when no bucket
        holds it (checked when a proposer is built for this runtime, not at the first step)."""
        if max_nodes > self.buckets.largest:
            raise ConfigError(f"{what}={max_nodes} does not fit RuntimeConfig.buckets={self.buckets.sizes}: a tree "
                              f"is verified in one forward of at most {self.buckets.largest} rows; lower the tree "
                              f"budget or add a bucket >= {max_nodes} (--buckets)")
        return self.buckets.fit(max_nodes)


def replace(cfg: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` that re-runs validation (frozen configs are rebuilt, never mutated)."""
    return dataclasses.replace(cfg, **changes)
