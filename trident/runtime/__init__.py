"""The host runtime: contexts, the symmetric allocator, rendezvous and launch."""
