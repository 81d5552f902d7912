"""Compile the kernel sources once per machine into one library in the project home, and load it, or say in one
line why not.

The sources are ``linear.cc`` (the linear kernels), ``attention.cc`` (fused cached attention, in-place cache
row moves) and ``layer.cc`` (a whole decoder layer from those two), sharing ``kernels.h`` and ``vmath.h``. The
shared library lands in ``<home>/kernels/mse_linear-<key>.so`` (``home()`` is ``$MINDSPORE_EAGLE_HOME`` or
``~/.cache/mindspore_eagle``), where ``<key>`` hashes every source and header, the compiler's version and the
flags: an edited source or another compiler builds a new file, never overwrites one a running process has
mapped. The compiler writes a temporary sibling that is renamed into place, so a failed or concurrent build
never leaves a half-written library.

``mindspore-eagle setup`` calls ``setup_kernels`` (so ``make demo`` / ``make test`` build it); a model asking
for the custom kernels on a machine where setup has not run builds it on first use (a few seconds).

The library is compiled for baseline x86-64 with the kernels under per-function ``target`` attributes, so it
loads on any x86-64 CPU and reports what the processor can run (``MseKernelFeatures``) before any AVX-512
instruction executes. Flags never include ``-ffast-math``, and ``-ffp-contract=off`` keeps a product and a sum
written separately from being fused into one fma: the kernels' results depend on the exact operation order
written in the source (see linear.cc and attention.cc on batch invariance).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from ..paths import home

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = tuple(os.path.join(_HERE, name) for name in ("linear.cc", "attention.cc", "layer.cc"))
HEADERS = tuple(os.path.join(_HERE, name) for name in ("kernels.h", "vmath.h"))
CXX = "g++"
FLAGS = ("-O3", "-std=c++17", "-fPIC", "-shared", "-pthread", "-Wall", "-ffp-contract=off")
FEATURE_FP32, FEATURE_BF16 = 1, 2  # bits of MseKernelFeatures()


@dataclass(frozen=True)
class KernelLibrary:
    """A built, loadable kernel library and what this processor can run from it."""

    path: str
    fp32: bool  # AVX-512 F/BW/VL/DQ + FMA
    bf16: bool  # AVX512-BF16 as well

    def symbol(self, name: str) -> str:
        """``path:name``, the ``func`` string of ``ops.Custom(..., func_type="aot")``."""
        return f"{self.path}:{name}"

    def supports(self, dtype: str) -> bool:
        return self.bf16 if dtype == "bfloat16" else self.fp32


@dataclass(frozen=True)
class KernelStatus:
    """The outcome of building/loading: ``library`` or ``None`` with a one-line ``reason``."""

    library: KernelLibrary | None
    reason: str = ""

    def for_dtype(self, dtype: str) -> "KernelStatus":
        """This status narrowed to one compute dtype (the processor may run fp32 but not bf16)."""
        if self.library is None or self.library.supports(dtype):
            return self
        return KernelStatus(None, f"processor lacks AVX512-BF16 (needed for dtype={dtype})")


def kernels_dir() -> str:
    return os.path.join(home(), "kernels")


def _compiler_version(cxx: str) -> str:
    proc = subprocess.run([cxx, "--version"], capture_output=True, text=True)
    return proc.stdout.splitlines()[0] if proc.returncode == 0 and proc.stdout else ""


def library_path(cxx: str = CXX, flags: tuple[str, ...] = FLAGS) -> str:
    """Where the library built from the current sources with ``cxx`` and ``flags`` lives."""
    h = hashlib.sha256()
    for path in SOURCES + HEADERS:
        with open(path, "rb") as f:
            h.update(f.read())
    h.update("\0".join((_compiler_version(cxx), platform.machine(), *flags)).encode())
    return os.path.join(kernels_dir(), f"mse_linear-{h.hexdigest()[:16]}.so")


def _unsupported_platform() -> str:
    if not sys.platform.startswith("linux"):
        return f"custom kernels need Linux (this is {sys.platform})"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"custom kernels need an x86-64 CPU (this is {platform.machine()})"
    return ""


def build(cxx: str = CXX, flags: tuple[str, ...] = FLAGS) -> KernelStatus:
    """Compile the library unless it already exists; status with the library path or the reason it failed."""
    reason = _unsupported_platform()
    if reason:
        return KernelStatus(None, reason)
    if shutil.which(cxx) is None:
        return KernelStatus(None, f"C++ compiler {cxx!r} not found on PATH (install g++ to build the kernels)")
    out = library_path(cxx, flags)
    if not os.path.isfile(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(out), prefix=".build-", suffix=".so")
        os.close(fd)
        try:
            proc = subprocess.run([cxx, *flags, "-o", tmp, *SOURCES], capture_output=True, text=True)
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
                names = " + ".join(os.path.basename(p) for p in SOURCES)
                return KernelStatus(None, f"compiling {names} with {cxx} failed: {last}")
            os.chmod(tmp, 0o755)
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return _probe(out)


def _probe(path: str) -> KernelStatus:
    try:
        lib = ctypes.CDLL(path)
        features = int(lib.MseKernelFeatures())
    except (OSError, AttributeError) as exc:
        return KernelStatus(None, f"cannot load {path}: {exc}")
    if not features & FEATURE_FP32:
        return KernelStatus(None, "processor lacks AVX-512 (F/BW/VL/DQ + FMA)")
    return KernelStatus(KernelLibrary(path, True, bool(features & FEATURE_BF16)))


@functools.lru_cache(maxsize=None)
def load(cxx: str = CXX, flags: tuple[str, ...] = FLAGS) -> KernelStatus:
    """``build`` once per process (the result cannot change while the process runs)."""
    return build(cxx, flags)


def setup_kernels() -> str:
    """Build the kernels (``mindspore-eagle setup``) and return a one-line status for the user."""
    status = load()
    lib = status.library
    if lib is None:
        return f"custom linear kernels unavailable ({status.reason}); models use MindSpore's MatMul"
    dtypes = "float32, bfloat16" if lib.bf16 else "float32 (no AVX512-BF16: bfloat16 unavailable)"
    return f"custom linear kernels ready: {dtypes} ({lib.path})"


__all__ = ["KernelLibrary", "KernelStatus", "build", "kernels_dir", "library_path", "load", "setup_kernels"]
