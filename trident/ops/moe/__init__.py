"""Expert parallelism: MoE dispatch and combine (:mod:`.dispatch_combine`), their kernels
(:mod:`.kernels`) and their heap sizing (:mod:`.sizing`)."""
