"""The GEMM alone: a Hopper-tuned persistent matmul (:mod:`.matmul`), its configurations
(:mod:`.config`) and the tile helpers every fused op's kernels build on (:mod:`.tiles`, public)."""
