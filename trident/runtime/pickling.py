"""Pickling a result or a host-side object for another process: tensors travel by value.

``trident.spawn``'s results and ``ctx.all_gather_object``'s objects cross processes as bytes.
torch's multiprocessing pickler would send a tensor as a handle to shared memory that dies with the
sending process, and plain pickle sends a view's whole storage: for a heap tensor, the whole heap.
Here every tensor travels as a CPU copy of its own elements only.
"""

from __future__ import annotations

import io
import pickle

import torch


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements in a CPU tensor of their own (no larger storage, no device, no autograd graph)."""
    copy = t.detach().to("cpu", copy=True, memory_format=torch.contiguous_format)
    return copy.requires_grad_(t.requires_grad) if t.is_floating_point() or t.is_complex() else copy


def _owns_its_storage(t: torch.Tensor) -> bool:
    return t.is_cpu and t.is_contiguous() and t.storage_offset() == 0 \
        and t.untyped_storage().nbytes() == t.numel() * t.element_size()


class _TensorsByValue(pickle.Pickler):
    def reducer_override(self, obj):
        # Only torch's own tensor types: a subclass keeps its own pickling.
        if type(obj) in (torch.Tensor, torch.nn.Parameter) and not _owns_its_storage(obj):
            return _compact(obj).__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        return NotImplemented


def dumps(value) -> bytes:
    """``value`` pickled, every tensor in it (at any depth) as a CPU copy of its own elements.

    A CPU tensor that owns its whole storage is pickled as it is; a heap tensor, a view of a larger
    tensor and a GPU tensor are copied first, so the receiver gets a plain CPU tensor of the same
    shape, dtype and values, and never more bytes than the tensor's own.
    """
    buf = io.BytesIO()
    _TensorsByValue(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buf.getvalue()
