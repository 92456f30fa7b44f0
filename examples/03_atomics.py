"""Step 3: atomics on a peer's memory (trident.atomic_add, atomic_max, atomic_cas, ...).

Every program of every rank adds 1 to rank 0's counter and raises rank 0's maximum; then every
rank takes a unique ticket from a counter on rank 0 with a compare-and-swap loop. ``sem`` says
what an atomic orders around it: ``"relaxed"`` for plain counting, ``"acq_rel"`` (the default)
when other memory must be ordered by it.

    trident run -n 4 examples/03_atomics.py

Next: 04_message_passing.py uses a flag to hand data from one rank to another inside a kernel.
"""

import torch
import triton
import triton.language as tl

import trident


@triton.jit
def count_kernel(counter_ptr, max_ptr, rank, heap_bases):
    pid = tl.program_id(0)
    trident.atomic_add(counter_ptr, 1, rank, 0, heap_bases, sem="relaxed")
    trident.atomic_max(max_ptr, rank * 100 + pid, rank, 0, heap_bases, sem="relaxed")


@triton.jit
def ticket_kernel(next_ptr, ticket_ptr, rank, heap_bases):
    # Lock-free increment with compare-and-swap on rank 0's copy: retry until our CAS wins.
    seen = trident.atomic_cas(next_ptr, -1, -1, rank, 0, heap_bases)  # read (never equals -1)
    old = trident.atomic_cas(next_ptr, seen, seen + 1, rank, 0, heap_bases)
    while old != seen:
        seen = old
        old = trident.atomic_cas(next_ptr, seen, seen + 1, rank, 0, heap_bases)
    tl.store(ticket_ptr, seen)


def main():
    ctx = trident.init(heap_size=1 << 24)
    programs = 8
    counter = ctx.zeros(1, dtype=torch.int32)
    biggest = ctx.full((1,), -1, dtype=torch.int32)
    next_ticket = ctx.zeros(1, dtype=torch.int64)
    ticket = ctx.zeros(1, dtype=torch.int64)
    ctx.barrier()
    count_kernel[(programs,)](counter, biggest, ctx.rank, ctx.heap_bases)
    ticket_kernel[(1,)](next_ticket, ticket, ctx.rank, ctx.heap_bases)
    ctx.barrier()
    all_tickets = [ctx.broadcast(int(ticket.item()), src=r) for r in range(ctx.world_size)]
    assert sorted(all_tickets) == list(range(ctx.world_size)), all_tickets
    if ctx.rank == 0:
        assert counter.item() == programs * ctx.world_size, counter.item()
        assert biggest.item() == (ctx.world_size - 1) * 100 + programs - 1, biggest.item()
    print(f"rank {ctx.rank}: atomics ok (ticket {ticket.item()})")
    ctx.close()


if __name__ == "__main__":
    main()
