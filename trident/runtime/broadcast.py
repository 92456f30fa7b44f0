"""``ctx.broadcast``: a Python object by value, or a tensor in place through the symmetric heap.

Every call starts with one host exchange in which every rank says what it passed (a tensor's
shape, dtype and heap offset, or "an object") and ``src`` adds its pickled object, or why
pickling failed. All ranks decide from the same facts, so they raise together, with one message,
instead of going out of step with each other's later calls.
"""

from __future__ import annotations

import pickle

import torch

from ..errors import DivergenceError
from . import pickling


def _describe(value, pickled: bytes | None, error: str | None, is_src: bool, ctx) -> tuple:
    """What this rank contributes: ``("tensor", shape, dtype, offset)`` or ``("object", payload, error)``."""
    if isinstance(value, torch.Tensor):
        offset = ctx.heap_offset(value) if ctx.is_symmetric(value) and value.is_contiguous() else None
        return ("tensor", tuple(value.shape), str(value.dtype), offset)
    return ("object", pickled if is_src else None, error if is_src else None)


def broadcast(ctx, value, src: int):
    """Give every rank ``src``'s ``value`` (see :meth:`trident.Context.broadcast`)."""
    pickled = error = None
    if ctx.rank == src and not isinstance(value, torch.Tensor):
        try:
            pickled = pickling.dumps(value)
        except Exception as exc:  # every rank learns it in the same exchange
            error = f"{type(exc).__name__}: {exc}"
    everyone = ctx.all_gather_object("broadcast", _describe(value, pickled, error, ctx.rank == src, ctx))
    kinds = [entry[0] for entry in everyone]
    if kinds[src] == "tensor" and len(set(kinds)) > 1 or kinds[src] == "object" and "tensor" in kinds:
        listing = ", ".join(f"rank {r}: {'a tensor' if k == 'tensor' else 'not a tensor'}" for r, k in enumerate(kinds))
        raise DivergenceError(f"rank {ctx.rank}: ctx.broadcast(src={src}) needs a tensor on every rank (overwritten "
                              f"in place) or an object on src and anything but a tensor elsewhere; got {listing}")
    if kinds[src] == "object":
        _, payload, failure = everyone[src]
        if failure is not None:
            raise ValueError(f"rank {ctx.rank}: ctx.broadcast(src={src}): rank {src} could not pickle its value "
                             f"({failure})")
        return pickle.loads(payload)
    return _broadcast_tensor(ctx, value, src, everyone)


def _broadcast_tensor(ctx, tensor: torch.Tensor, src: int, everyone: list) -> torch.Tensor:
    """Overwrite ``tensor`` on every rank with ``src``'s; ``everyone`` holds each rank's description."""
    shapes = {(shape, dtype) for _, shape, dtype, _ in everyone}
    if len(shapes) > 1:
        listing = ", ".join(f"rank {r}: shape {s} {d}" for r, (_, s, d, _) in enumerate(everyone))
        raise DivergenceError(f"rank {ctx.rank}: ctx.broadcast needs the same shape and dtype on every rank; "
                              f"got {listing}")
    if ctx.world_size == 1 or tensor.numel() == 0:
        return tensor
    if ctx.topology.spans_nodes:  # no heap path between nodes: torch.distributed's default group
        buf = tensor.contiguous()
        ctx.hierarchy.world.broadcast(buf, src)
        return tensor if buf is tensor else tensor.copy_(buf)
    # Read straight from src's heap when every rank's tensor is the same symmetric tensor;
    # otherwise src stages its data in a temporary symmetric tensor.
    offsets = {off for *_, off in everyone}
    in_place = len(offsets) == 1 and None not in offsets
    stage = None if in_place else ctx.empty(tensor.shape, dtype=tensor.dtype)
    source = tensor if stage is None else stage
    if stage is not None and ctx.rank == src:
        stage.copy_(tensor)
    ctx.barrier()  # src's data is written (device work included) before anyone reads it
    if ctx.rank != src:
        tensor.copy_(ctx.peer_view(source, src))
    ctx.barrier()  # nobody reads src's copy any more; src may overwrite it
    if stage is not None:
        ctx.free(stage)
    return tensor
