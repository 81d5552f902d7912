"""Every instruction-set path of the kernels computes the same bits: AVX-512 (+BF16), AVX2 and the portable path
on x86-64, NEON and the portable path on AArch64 (under qemu, ``make test-arm``).

Two levels: the C++ self-test (kernels/selftest.cc: linear in fp32/bf16 with every prologue, bias and residual,
and tree attention with its in-place cache writes, each output hashed) run on every path this processor
runs; and a whole teacher built on the kernels, whose logits must be bit-identical with the path switched in
the same process. Paths this processor cannot run are covered on a machine that can (the self-test lists
every path it runs) or under emulation (AArch64)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess

import numpy as np
import pytest

from mindspore_eagle.kernels import build
from tests.helpers import cpu_flags

X86 = platform.machine().lower() in ("x86_64", "amd64")


@pytest.fixture(scope="module")
def selftest_exe(tmp_path_factory):
    exe = str(tmp_path_factory.mktemp("selftest") / "mse_selftest")
    failure = build.build_selftest(exe)
    assert failure == "", failure
    return exe


@pytest.fixture(scope="module")
def native_selftest(selftest_exe):
    proc = subprocess.run([selftest_exe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_this_processor_runs_a_simd_path_and_the_portable_one():
    lib = build.load().library
    assert lib is not None, build.load().reason
    assert "generic" in lib.isas and len(lib.isas) >= 2, lib.isas  # a SIMD path on every x86-64 / AArch64 CPU
    # the best one is used unless MSE_KERNEL_ISA names another this processor runs (then that one: the suite can run
    # a lower path throughout, as an AVX2 machine would)
    wanted = os.environ.get("MSE_KERNEL_ISA", "")
    assert lib.isa == (wanted if wanted in lib.isas else lib.isas[0]), (lib.isa, wanted)


def test_every_path_this_processor_runs_computes_the_same_bits(native_selftest):
    results = build.parse_selftest(native_selftest)
    paths = sorted({p for _, p in results if "/" not in p})
    cases = sorted({c for c, _ in results})
    assert len(paths) >= 2 and len(cases) >= 10, native_selftest
    for case in cases:  # every path, and the greedy head's AVX512-BW blocks beside its VNNI ones ("<path>/bw")
        values = {p: v for (c, p), v in results.items() if c == case}
        assert set(paths) <= set(values) and len(set(values.values())) == 1, (case, values)
    # where an AVX-512 path runs VNNI blocks, its BW blocks were compared too (without VNNI they are the path's own)
    vnni = X86 and any(p.startswith("avx512") for p in paths) and "avx512_vnni" in cpu_flags()
    assert {p for _, p in results if p.endswith("/bw")} == ({f"{p}/bw" for p in paths if p.startswith("avx512")}
                                                            if vnni else set()), sorted(results)


def test_rows_of_a_call_equal_the_rows_computed_alone_on_every_path(native_selftest):
    lines = [line for line in native_selftest.splitlines() if line.startswith("rows ")]
    assert lines and all(line.endswith(" ok") for line in lines), lines


def test_quantized_kernels_equal_the_fp32_kernel_on_the_converters_values_on_every_path(native_selftest):
    """Q4 (GGUF Q4_1; Q4_0 is its m = -8 d case) and Q8 (Q8_0) panels, dequantized in registers: bit-identical to
    the fp32 kernel on weights dequantized the converter's way ((d * q) + m in float32), for 5..64 rows."""
    lines = [line for line in native_selftest.splitlines() if line.startswith("exact_")]
    assert len(lines) >= 5 * 2 and all(line.endswith(" ok") for line in lines), lines


def test_quantized_rows_give_the_same_bits_through_the_wide_block_and_the_l1_slabs(selftest_exe, native_selftest):
    """On AVX-512, 5-16 quantized rows take one or two wide register blocks (the default, ``wide_rows`` in
    compute.cc) or the L1 slabs; MSE_WIDE_Q_ROWS forces either (4: the slabs from 5 rows). Every case on every path
    must hash the same both ways (its 5-, 6-, 8-, 9- and 16-row cases cross the limit). A value outside 4..8 is named
    on stderr (where an AVX-512 path runs) and ignored."""
    default = build.parse_selftest(native_selftest)
    avx512 = any(path.startswith("avx512") for _, path in default)
    for rows in ("4", "8", "9"):
        proc = subprocess.run([selftest_exe], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "MSE_WIDE_Q_ROWS": rows})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert build.parse_selftest(proc.stdout) == default, rows
        assert ("MSE_WIDE_Q_ROWS=9 is not a row count" in proc.stderr) == (avx512 and rows == "9"), proc.stderr


def test_setup_names_the_blocks_that_compute_the_greedy_head_on_the_path_in_use():
    """``mindspore-eagle setup``'s line says which integer blocks compute the greedy Q8 head: VNNI or AVX512-BW on
    the AVX-512 paths (as the processor and ``approx_vnni`` allow), AVX2 / NEON on theirs, none on the portable path
    (the logits); every path this machine runs, the path in use restored."""
    lib, before = build.load().library, build.current_isa()
    want = {"avx2": "(AVX2)", "neon": "(NEON)", "generic": "greedy tokens from the logits"}
    seen = set()
    try:
        for path in lib.isas:
            build.select_isa(path)
            for vnni in ((True, False) if path.startswith("avx512") else (True,)):
                build.approx_vnni(vnni)
                expected = want.get(path) or ("(AVX512-VNNI)" if vnni and "avx512_vnni" in cpu_flags()
                                              else "(AVX512-BW)")
                assert expected in build.setup_kernels(), (path, vnni, build.setup_kernels())
                seen.add(expected)
    finally:
        build.approx_vnni(True)
        build.select_isa(before)
    assert "greedy tokens from the logits" in seen and len(seen) >= 2, seen


def test_the_avx512_bw_greedy_blocks_hold_no_vnni_instruction():
    """An AVX-512 processor without VNNI (Skylake-SP) runs the AVX-512 paths' ``ApproxBlocks``; one VNNI instruction
    there would kill the process (SIGILL), and the machines this suite runs on have VNNI or no AVX-512, so running
    them cannot tell. The library's own code is read instead (objdump, part of the binutils the build links with):
    every AVX-512 path's BW entries hold VPMADDWD and no VPDPWSSD, its VNNI entries VPDPWSSD. compute.cc relies on
    ``flatten`` to compile the shared body under each entry's target."""
    lib = build.load().library
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", lib.path], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    ops: dict[str, set[str]] = {}
    fn = None
    for line in out.splitlines():
        if line.endswith(">:"):
            fn = line[line.index("<") + 1:-2]
        elif fn and ("ApproxBlocks" in fn) and "\t" in line:
            ops.setdefault(fn, set()).add(line.split("\t")[-1].split()[0])
    bw = {f: o for f, o in ops.items() if "ApproxBlocks5block" in f and "avx512" in f}
    vnni = {f: o for f, o in ops.items() if "ApproxBlocksVnni5block" in f}
    if not X86:
        assert not bw and not vnni, sorted(ops)  # no AVX-512 path in an AArch64 build
        return
    assert len(bw) >= 2 * 32 and len(vnni) >= 2 * 32, (len(bw), len(vnni))  # 4 x 8 blocks, both AVX-512 paths
    assert all("vpmaddwd" in o and "vpdpwssd" not in o for o in bw.values())
    assert all("vpdpwssd" in o for o in vnni.values())


def test_an_unknown_or_unavailable_path_is_refused():
    from mindspore_eagle.errors import ConfigError

    with pytest.raises(ConfigError, match="cannot run"):
        build.select_isa("no-such-path")
    if X86 and "avx512" not in build.load().library.isas:
        with pytest.raises(ConfigError, match="cannot run"):
            build.select_isa("avx512")


def test_a_teacher_computes_the_same_logits_on_every_path(hf_tiny):
    """The tiny Pangu teacher (biases on q/k/v/o) on the fused kernels, fp32 and bf16: prefill + decode logits
    bit-identical whichever path computes them (switched in one process, same compiled graphs)."""
    from mindspore_eagle.compute import ComputeChoice
    from mindspore_eagle.runtime import RuntimeConfig
    from mindspore_eagle.kernels import MatmulChoice
    from mindspore_eagle.teacher import Teacher
    from mindspore_eagle.tree import ForwardInputs, TreeLayout

    lib = build.load().library
    _, ms_dir, _ = hf_tiny("pangu")
    runtime = RuntimeConfig(max_cache_len=64, buckets=(1, 16), prefill_chunk=16)
    ids = [int(t) for t in np.random.default_rng(7).integers(0, 101, 17)]
    try:
        for dtype in ("float32", "bfloat16"):
            teacher = Teacher.load(ms_dir, runtime, ComputeChoice(matmul=MatmulChoice("custom", dtype)))
            logits = {}
            for path in lib.isas:
                build.select_isa(path)
                block = teacher.forward(ForwardInputs.for_tree(TreeLayout.chain(ids[:16]), 0, 16, teacher.max_len))
                one = teacher.forward(ForwardInputs.for_tree(TreeLayout.chain(ids[16:]), 16, 1, teacher.max_len))
                logits[path] = np.concatenate([block.logits[0], one.logits[0]]).view(np.uint32)
            first = logits[lib.isas[0]]
            for path, bits in logits.items():
                assert np.array_equal(bits, first), (dtype, path)
    finally:
        build.select_isa(lib.isas[0])


# ----- AArch64 under qemu-user (`make test-arm`) -----------------------------------------------------------

AARCH64_CXX = "aarch64-linux-gnu-g++"


@pytest.mark.arm
def test_aarch64_paths_compute_the_bits_of_this_machines_paths(native_selftest, tmp_path):
    """The AArch64 build (NEON and portable paths), cross-compiled and run under qemu-aarch64, prints the same
    hash for every case as every path of this machine: fp32 and bf16 tokens replay across architectures."""
    assert shutil.which(AARCH64_CXX), f"{AARCH64_CXX} missing: `make test-arm` installs g++-aarch64-linux-gnu"
    assert shutil.which("qemu-aarch64"), "qemu-aarch64 missing: `make test-arm` installs qemu-user"
    exe = str(tmp_path / "mse_selftest_aarch64")
    failure = build.build_selftest(exe, cxx=AARCH64_CXX, arch="aarch64", static=True)
    assert failure == "", failure
    proc = subprocess.run(["qemu-aarch64", exe], capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, QEMU_CPU="max"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    arm = build.parse_selftest(proc.stdout)
    assert {p for _, p in arm} == {"neon", "generic"}, proc.stdout
    native = build.parse_selftest(native_selftest)
    for (case, path), value in arm.items():
        mine = {v for (c, _), v in native.items() if c == case}
        assert mine == {value}, (case, path, value, mine)
    assert "rows neon ok" in proc.stdout and "rows generic ok" in proc.stdout
