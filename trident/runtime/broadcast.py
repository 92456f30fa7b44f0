"""Broadcast of a tensor through the symmetric heap: every rank copies from ``src``'s heap."""

from __future__ import annotations

import torch

from ..errors import DivergenceError


def broadcast_tensor(ctx, tensor: torch.Tensor, src: int) -> torch.Tensor:
    """Overwrite ``tensor`` on every rank with ``src``'s (see :meth:`Context.broadcast`)."""
    offset = None
    if ctx.is_symmetric(tensor) and tensor.is_contiguous():
        offset = ctx.heap_offset(tensor)
    mine = (tuple(tensor.shape), str(tensor.dtype), offset)
    everyone = ctx.all_gather_object("broadcast metadata", mine)
    shapes = {(shape, dtype) for shape, dtype, _ in everyone}
    if len(shapes) > 1:
        listing = ", ".join(f"rank {r}: shape {s} {d}" for r, (s, d, _) in enumerate(everyone))
        raise DivergenceError(f"rank {ctx.rank}: ctx.broadcast needs the same shape and dtype on every rank; "
                              f"got {listing}")
    if ctx.world_size == 1 or tensor.numel() == 0:
        return tensor
    # Read straight from src's heap when every rank's tensor is the same symmetric tensor;
    # otherwise src stages its data in a temporary symmetric tensor.
    offsets = {off for _, _, off in everyone}
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
