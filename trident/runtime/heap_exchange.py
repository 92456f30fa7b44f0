"""Making the heaps: every rank creates its own, then all exchange what peers need to map them.

A rank whose heap cannot be made (the GPU has too little free memory, ``/dev/shm`` is too small)
says so in the same exchange, so that its peers raise at once, naming it, instead of waiting for
a rank that will never arrive. Where ranks share a GPU, the failing rank's error adds that its
neighbours took their heaps from the same memory.
"""

from __future__ import annotations

import pickle

from ..errors import TridentError
from .nodes import node_key
from .watchdog import identity


def create_and_exchange(ctx, backend, rendezvous, heap_size: int) -> list[tuple]:
    """Create this rank's heap with ``backend`` and exchange ``(heap_size, handle, identity, node key)``
    with every rank (collective); returns every rank's, in rank order.

    Raises:
        the rank's own error (its heap could not be made), with a hint where ranks share its GPU;
        :class:`~trident.errors.TridentError` on the other ranks, naming those whose heaps failed.

    Example::

        exchanged = create_and_exchange(ctx, ctx_backend, rendezvous, 1 << 30)
    """
    failure: Exception | None = None
    try:
        handle = backend.create(heap_size)
    except Exception as exc:  # noqa: BLE001 (told to the peers, then raised again below)
        handle, failure = None, exc
    gpu = ctx.platform.device_identity
    exchanged = [pickle.loads(v) for v in rendezvous.all_gather("heap handle exchange", pickle.dumps(
        (heap_size, handle, identity(), node_key(ctx.rank, ctx.world_size),
         None if failure is None else f"{type(failure).__name__}: {failure}", gpu)))]
    failed = {r: entry[4] for r, entry in enumerate(exchanged) if entry[4] is not None}
    if failure is not None:
        neighbours = [r for r, entry in enumerate(exchanged) if entry[5] == gpu and r != ctx.rank]
        if neighbours and not ctx.platform.simulator:
            hint = (f" Ranks {neighbours} share this GPU and each asked for heap_size={heap_size} bytes from the "
                    f"same memory: give each rank at most the GPU's free memory divided by the "
                    f"{len(neighbours) + 1} ranks on it.")
            raise _with_hint(failure, hint) from failure
        raise failure
    if failed:
        listing = "; ".join(f"rank {r}: {why}" for r, why in sorted(failed.items()))
        raise TridentError(f"rank {ctx.rank}: trident.init cannot complete: the heaps of other ranks could not be "
                           f"made ({listing})")
    return [entry[:4] for entry in exchanged]


def _with_hint(error: Exception, hint: str) -> Exception:
    """``error`` again with ``hint`` added to its message (its type kept where it takes one message)."""
    try:
        return type(error)(f"{error}{hint}")
    except TypeError:
        return TridentError(f"{type(error).__name__}: {error}{hint}")
