"""Custom CPU linear kernels: batch-invariant small-M matmuls in fp32 and bf16 (AVX-512 / AVX512-BF16).

Why: MindSpore's CPU MatMul is efficient at one row but costs 2.6-3.5x that at 8-16 rows, so a tree
verification cost two decode steps and speculation lost. These kernels stream each weight once per call for
any M and compute every output element with a fixed, strictly sequential reduction along K, so a row's
result is bit-identical whatever the number of rows in the call: the teacher's 1-row greedy decode and its
16-row tree verification see the same linear outputs (see linear.cc).

    choice.py   MatmulChoice: which backend/dtype a model's Linears use (passed explicitly)
    layout.py   packed panel layouts of the weights (numpy, made once at load)
    build.py    compiles linear.cc into the project home, loads it, or says why not
    ops.py      LinearKernel (the AOT Custom op + packed weight), select_matmul, pack_weights, check_packed
"""

from .choice import MatmulChoice
from .ops import LinearKernel, check_packed, kernel_status, matmul_for, pack_weights, select_matmul

__all__ = ["LinearKernel", "MatmulChoice", "check_packed", "kernel_status", "matmul_for", "pack_weights",
           "select_matmul"]
