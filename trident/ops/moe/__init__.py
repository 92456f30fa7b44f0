"""Expert parallelism: MoE dispatch (:mod:`.dispatch`) and combine (:mod:`.combine`), their kernels
(:mod:`.kernels`) and their heap sizing (:mod:`.sizing`)."""
