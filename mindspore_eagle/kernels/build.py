"""Compile the kernel sources once per machine into one library in the project home, and load it, or say in one
line why not.

``compute.cc`` (the arithmetic, on simd.h's 16-lane vector) is compiled once per instruction-set path of this
architecture (``PATHS``: avx512bf16, avx512, avx2 and generic on x86-64; neon and generic on AArch64), each
object with its own flags; ``isa.cc``, ``linear.cc``, ``attention.cc``, ``layer.cc``, ``rows.cc``, ``argmax.cc`` and
``suffix.cc`` (the suffix drafting's index, host-side) are compiled for the baseline and link them into one shared
library (a function that needs more than its path's flags, as compute.cc's AVX512-VNNI blocks, names its target
itself and runs only where isa.cc finds it). At load,
``isa.cc`` picks the best path the processor runs (``MSE_KERNEL_ISA`` names another), before any wider instruction
executes: the same file serves every CPU of its architecture, and tests run every path this CPU can, comparing their
bits.

The library lands in ``<home>/kernels/mse_kernels-<key>.so`` (``home()`` is ``$MINDSPORE_EAGLE_HOME`` or
``~/.cache/mindspore_eagle``), where ``<key>`` hashes every source and header, the compiler's version, the
flags and the paths: an edited source or another compiler builds a new file, never overwrites one a running
process has mapped. Objects are built in a temporary directory and the library renamed into place, so a
failed or concurrent build never leaves a half-written library.

``mindspore-eagle setup`` calls ``setup_kernels`` (so ``make demo`` / ``make test`` build it); a model asking
for the custom kernels on a machine where setup has not run builds it on first use (about a minute on 2 cores).
Flags never include ``-ffast-math``, and ``-ffp-contract=off`` keeps a product and a sum written separately from
being fused into one fma: the kernels' results depend on the exact operation order written in the source (see
compute.cc on batch invariance and on why every path computes the same bits).
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

from ..storage.paths import home

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = tuple(os.path.join(_HERE, name) for name in ("isa.cc", "linear.cc", "attention.cc", "layer.cc", "rows.cc",
                                                       "argmax.cc", "suffix.cc"))
COMPUTE = os.path.join(_HERE, "compute.cc")  # compiled once per instruction-set path
HEADERS = tuple(os.path.join(_HERE, name) for name in ("kernels.h", "simd.h"))
CXX = "g++"
FLAGS = ("-O3", "-std=c++17", "-fPIC", "-pthread", "-Wall", "-ffp-contract=off")
FEATURE_RUNS, FEATURE_NATIVE_BF16, FEATURE_SIMD = 1, 2, 4  # bits of MseKernelFeatures()

# (path name, macros, compiler flags) of compute.cc per architecture, best first (isa.cc lists the same).
PATHS = {
    "x86_64": (
        ("avx512bf16", ("MSE_ISA_AVX512", "MSE_NATIVE_BF16"),
         ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mfma", "-mf16c", "-mavx2")),
        ("avx512", ("MSE_ISA_AVX512",), ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c",
                                         "-mavx2")),
        ("avx2", ("MSE_ISA_AVX2",), ("-mavx2", "-mfma", "-mf16c")),
        ("generic", (), ()),
    ),
    "aarch64": (
        ("neon", ("MSE_ISA_NEON",), ()),
        ("generic", (), ()),
    ),
}


def _arch(machine: str | None = None) -> str:
    m = (machine or platform.machine()).lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


@dataclass(frozen=True)
class KernelLibrary:
    """A built, loadable kernel library and what this processor can run from it.

    Every dtype runs on every path: bf16 is computed natively with AVX512-BF16 and by widening the bf16 bits to
    fp32 elsewhere (the same bits either way, compute.cc). ``isa`` is the path in use, ``isas`` every path this
    processor can run, best first."""

    path: str
    isa: str
    isas: tuple[str, ...]
    native_bf16: bool

    def symbol(self, name: str) -> str:
        """``path:name``, the ``func`` string of ``ops.Custom(..., func_type="aot")``."""
        return f"{self.path}:{name}"

    def supports(self, dtype: str) -> bool:
        return dtype in ("float32", "bfloat16")


@dataclass(frozen=True)
class KernelStatus:
    """The outcome of building/loading: ``library`` or ``None`` with a one-line ``reason``."""

    library: KernelLibrary | None
    reason: str = ""

    def for_dtype(self, dtype: str) -> "KernelStatus":
        """This status narrowed to one compute dtype."""
        if self.library is None or self.library.supports(dtype):
            return self
        return KernelStatus(None, f"no kernel for dtype={dtype}")


def kernels_dir() -> str:
    return os.path.join(home(), "kernels")


def _compiler_version(cxx: str) -> str:
    proc = subprocess.run([cxx, "--version"], capture_output=True, text=True)
    return proc.stdout.splitlines()[0] if proc.returncode == 0 and proc.stdout else ""


def library_path(cxx: str = CXX, flags: tuple[str, ...] = FLAGS) -> str:
    """Where the library built from the current sources with ``cxx`` and ``flags`` lives."""
    h = hashlib.sha256()
    for path in SOURCES + (COMPUTE,) + HEADERS:
        with open(path, "rb") as f:
            h.update(f.read())
    h.update("\0".join((_compiler_version(cxx), platform.machine(), *flags, repr(PATHS.get(_arch())))).encode())
    return os.path.join(kernels_dir(), f"mse_kernels-{h.hexdigest()[:16]}.so")


def _unsupported_platform() -> str:
    if not sys.platform.startswith("linux"):
        return f"custom kernels need Linux (this is {sys.platform})"
    if _arch() not in PATHS:
        return f"custom kernels are built for x86-64 and AArch64 (this is {platform.machine()})"
    return ""


def compile_commands(cxx: str, flags: tuple[str, ...], out: str, workdir: str, arch: str | None = None,
                     extra_sources: tuple[str, ...] = (), link_flags: tuple[str, ...] = ("-shared",)) -> list[list[str]]:
    """The compiler calls that build ``out``: compute.cc once per path of ``arch`` (its own macros and flags),
    the baseline sources, then one link. ``extra_sources`` (a self-test driver) join the baseline sources."""
    cmds, objects = [], []
    for name, macros, isa_flags in PATHS[_arch(arch)]:
        obj = os.path.join(workdir, f"compute_{name}.o")
        cmds.append([cxx, *flags, *isa_flags, *(f"-D{m}" for m in macros), "-c", COMPUTE, "-o", obj])
        objects.append(obj)
    for src in SOURCES + tuple(extra_sources):
        obj = os.path.join(workdir, os.path.basename(src) + ".o")
        cmds.append([cxx, *flags, "-c", src, "-o", obj])
        objects.append(obj)
    cmds.append([cxx, *flags, *link_flags, "-o", out, *objects])
    return cmds


def run_compile(cmds: list[list[str]]) -> str:
    """Runs the calls, the per-path compiles two at a time; '' or the first failure's last line."""
    compiles, link = cmds[:-1], cmds[-1]
    procs = []
    for cmd in compiles:
        procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
        if len(procs) >= 2:
            break
    pending = compiles[len(procs):]
    failure = ""
    while procs:
        cmd, proc = procs.pop(0)
        _, err = proc.communicate()
        if proc.returncode != 0 and not failure:
            last = (err.strip().splitlines() or ["(no output)"])[-1]
            failure = f"{' '.join(os.path.basename(a) for a in cmd[-3:-2])}: {last}"
        if pending:
            nxt = pending.pop(0)
            procs.append((nxt, subprocess.Popen(nxt, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    if failure:
        return failure
    proc = subprocess.run(link, capture_output=True, text=True)
    if proc.returncode != 0:
        return "link: " + (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
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
        workdir = tempfile.mkdtemp(dir=os.path.dirname(out), prefix=".build-")
        tmp = os.path.join(workdir, "lib.so")
        try:
            failure = run_compile(compile_commands(cxx, flags, tmp, workdir))
            if failure:
                return KernelStatus(None, f"compiling the kernels with {cxx} failed ({failure})")
            os.chmod(tmp, 0o755)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return _probe(out)


def _probe(path: str) -> KernelStatus:
    try:
        lib = ctypes.CDLL(path)
        features = int(lib.MseKernelFeatures())
        lib.MseKernelIsa.restype = ctypes.c_char_p
        isa = lib.MseKernelIsa().decode()
        buf = ctypes.create_string_buffer(256)
        lib.MseKernelIsas(buf, 256)
        isas = tuple(buf.value.decode().split(","))
    except (OSError, AttributeError) as exc:
        return KernelStatus(None, f"cannot load {path}: {exc}")
    if not features & FEATURE_RUNS:
        return KernelStatus(None, "the kernel library reports it cannot run here")
    return KernelStatus(KernelLibrary(path, isa, isas, bool(features & FEATURE_NATIVE_BF16)))


@functools.lru_cache(maxsize=None)
def load(cxx: str = CXX, flags: tuple[str, ...] = FLAGS) -> KernelStatus:
    """``build`` once per process (the result cannot change while the process runs)."""
    return build(cxx, flags)


def handle():
    """The built library as a ctypes handle (the same mapping MindSpore's Custom ops call into), or None when the
    kernels are unavailable here."""
    status = load()
    return None if status.library is None else ctypes.CDLL(status.library.path)


def select_isa(name: str) -> None:
    """Use the path ``name`` from now on in this process (tests and benchmarks compare paths): ConfigError when
    this processor cannot run it. MSE_KERNEL_ISA=name does the same for a whole process."""
    from ..errors import ConfigError

    status = load()
    if status.library is None:
        raise ConfigError(f"kernels unavailable: {status.reason}")
    if handle().MseSelectIsa(name.encode()) != 0:
        raise ConfigError(f"kernel path {name!r} cannot run on this processor (it runs {status.library.isas})")


def approx_vnni(allowed: bool | None = None) -> bool:
    """Let the AVX-512 paths run the greedy Q8 head's AVX512-VNNI blocks (the default, where the processor has them)
    or not (their AVX512-BW blocks, which a processor without VNNI takes: tests and benchmarks compare the two in one
    process); None changes nothing. Returns whether the path in use now runs VNNI blocks."""
    lib = handle()
    return lib is not None and bool(lib.MseApproxVnni(-1 if allowed is None else int(bool(allowed))))


def current_isa() -> str:
    """The path the kernels use now in this process."""
    lib = handle()
    if lib is None:
        return ""
    lib.MseKernelIsa.restype = ctypes.c_char_p
    return lib.MseKernelIsa().decode()


SELFTEST = os.path.join(_HERE, "selftest.cc")


def build_selftest(out: str, cxx: str = CXX, arch: str | None = None, static: bool = False) -> str:
    """Build selftest.cc with every path of ``arch`` (default: this machine's) into the executable ``out``;
    '' or the reason it failed. ``static`` links a binary qemu-user runs without the target's libraries."""
    if shutil.which(cxx) is None:
        return f"C++ compiler {cxx!r} not found on PATH"
    workdir = tempfile.mkdtemp(prefix="mse-selftest-")
    try:
        link = ("-static",) if static else ()
        return run_compile(compile_commands(cxx, FLAGS, out, workdir, arch, extra_sources=(SELFTEST,), link_flags=link))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def parse_selftest(stdout: str) -> dict[tuple[str, str], str]:
    """selftest's ``<case> <path> <value>`` lines as {(case, path): value}."""
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            out[(parts[0], parts[1])] = parts[2]
    return out


def setup_kernels() -> str:
    """Build the kernels (``mindspore-eagle setup``) and return a one-line status for the user."""
    status = load()
    lib = status.library
    if lib is None:
        return f"custom kernels unavailable ({status.reason}); models use MindSpore's MatMul"
    # what the path in use does (MSE_KERNEL_ISA may select a path below the processor's best)
    path = current_isa()
    bf16 = ("bfloat16 native (AVX512-BF16)" if lib.native_bf16 and path == "avx512bf16"
            else "bfloat16 widened to float32 exactly")
    greedy = "greedy tokens from the logits"
    if handle().MseArgmaxQ8Fast():
        blocks = {"avx2": "AVX2", "neon": "NEON"}.get(path) or ("AVX512-VNNI" if approx_vnni() else "AVX512-BW")
        greedy = f"greedy tokens of a native Q8 or dense fp32 / bf16 LM head from int16 dots ({blocks})"
    return (f"custom kernels ready: path {lib.isa} (this CPU runs {', '.join(lib.isas)}); float32, {bf16}; {greedy} "
            f"({lib.path})")


__all__ = ["KernelLibrary", "KernelStatus", "PATHS", "build", "build_selftest", "compile_commands", "current_isa",
           "handle", "kernels_dir", "library_path", "load", "parse_selftest", "run_compile", "select_isa",
           "setup_kernels"]
