"""Step 0 of the examples: the symmetric heap, trident's one idea. No kernel yet.

``trident.init`` gives every rank a heap of the same size and maps every peer's heap into this
process. Tensors made with ``ctx.zeros``, ``ctx.empty``, ``ctx.full``, ... are *symmetric*: they
sit at the same offset in every rank's heap, so a kernel holding a pointer to its own copy can
reach any peer's copy (the next examples do). This one shows, on the host:

* ``trident.init`` and ``ctx.platform`` (which machine this is: a GPU, or the CPU simulator);
* symmetric tensors: same offset everywhere; arithmetic makes ordinary tensors, in-place ops do not;
* ``ctx.barrier()`` before reading what a peer wrote, and ``ctx.peer_view`` to read it from the host;
* ``ctx.heap_scope()`` for temporaries, ``ctx.close()`` at the end.

    trident run -n 2 examples/00_heap.py       # any number of ranks; a GPU each, or the simulator

Next: 01_load_store.py reads and writes a peer's copy from inside a kernel.
"""

import torch

import trident


def main():
    ctx = trident.init(heap_size=1 << 24)  # collective: every rank calls it, with the same size
    rank, world = ctx.rank, ctx.world_size
    where = "the CPU simulator" if ctx.platform.simulator else ctx.platform.gpu_name
    print(f"rank {rank}/{world}: heap of {ctx.heap_size >> 20} MiB on {ctx.device} ({where})")

    # Every rank allocates the same tensors in the same order: that is what keeps them symmetric.
    x = ctx.full((8,), float(rank))
    offsets = ctx.all_gather_object("where x is", ctx.heap_offset(x))
    assert len(set(offsets)) == 1, f"x lies at different heap offsets: {offsets}"

    # Arithmetic returns a new, ordinary tensor; peers cannot reach it. In-place ops (and out=)
    # keep the heap tensor, and ctx.as_symmetric copies an ordinary tensor onto the heap.
    assert not ctx.is_symmetric(x * 10)
    x.mul_(10)
    assert ctx.is_symmetric(x)
    ids = ctx.as_symmetric(torch.arange(4, device=ctx.device) + 100 * rank)

    # A peer's writes are visible once both sides have passed a barrier (it also waits for this
    # rank's device work). peer_view is the host's window on a peer's copy: for checks and staging.
    ctx.barrier()
    right = (rank + 1) % world
    seen = ctx.peer_view(x, right).clone()
    assert torch.equal(seen, torch.full((8,), 10.0 * right, device=ctx.device))
    assert torch.equal(ctx.peer_view(ids, right), torch.arange(4, device=ctx.device) + 100 * right)

    # Temporaries: everything allocated inside the block goes back to the heap when it ends (on
    # every rank, so the ranks stay in step).
    before = ctx.memory_stats()["num_allocations"]
    with ctx.heap_scope():
        scratch = ctx.zeros(1 << 16)
        scratch += 1
    assert ctx.memory_stats()["num_allocations"] == before

    print(f"rank {rank}: heap ok (x at heap offset {offsets[0]:#x} on all {world} ranks; "
          f"rank {right}'s x reads {seen[0].item():g})")
    ctx.close()  # collective too: peers stop mapping this heap


if __name__ == "__main__":
    main()
