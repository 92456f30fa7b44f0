"""all_reduce + residual + RMSNorm in one kernel (:mod:`.all_reduce_rmsnorm`, :mod:`.kernels`)."""
