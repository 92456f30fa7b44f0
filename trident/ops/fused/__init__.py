"""What the fused ops share: the op description and its call through the pipeline (:mod:`.call`),
the call-level handshake of their kernels (:mod:`.sync`), the across-nodes versions
(:mod:`.multinode`) and the torch + NCCL baselines they are compared with (:mod:`.baselines`)."""
