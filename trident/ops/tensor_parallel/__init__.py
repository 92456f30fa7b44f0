"""The fused GEMM + communication ops of tensor parallelism, each an op module with its kernels:
gemm_all_scatter, all_gather_gemm, gemm_reduce_scatter and gemm_all_reduce (the last two share
:mod:`.gemm_reduce`)."""
