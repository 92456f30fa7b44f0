"""TMA descriptor arguments of prepared launches: rebased without a copy, encoded once per address.

A kernel that takes host ``TensorDescriptor`` arguments (the TMA GEMMs) pays for them on every launch
in Triton's launcher: a Python pass over all its arguments, and a ``CUtensorMap`` encoded from
scratch for each descriptor (``make_tensordesc_arg``); a replayed call also copied each recorded
descriptor to point it at the new address. That was most of the gap between a fused GEMM's host
time and ``torch.matmul``'s (host_anatomy.py's profile on the H100, 2026-12-06).

A replay keeps its descriptors' layouts, and in a serving loop mostly their addresses too (the same
weights; activations in the caching allocator's same blocks). :class:`Rebased` names a recorded
layout at an address without copying anything, and :func:`splicer` gives a launch that encodes each
(layout, address) once, keeps it, and splices the encoded arguments straight into the compiled
launcher's C entry. Nothing here trusts a version number: where Triton's launcher does not look
exactly as expected, :func:`splicer` answers None and launches take Triton's own path.

Example::

    c_entry, splice = splicer(compiled.run.launch)       # or None: keep Triton's path
    c_entry(*grid_and_meta, *splice([*values, Rebased(template, ptr)]))
"""

from __future__ import annotations

import sys

import torch

#: Encoded descriptors kept per argument (by address); past this the slot starts again (a call
#: whose operands move every time would otherwise grow it without bound).
KEEP_PER_ARGUMENT = 64


class Address:
    """An address and dtype, all a host TensorDescriptor's launch reads of its base: recorded
    descriptors hold no tensor (a tensor kept alive by a recording would hold its memory)."""

    __slots__ = ("ptr", "dtype")

    def __init__(self, ptr: int, dtype: torch.dtype):
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr


class Rebased:
    """A recorded descriptor's layout (``template``: shape, strides, block, padding, dtype) at another
    address ``ptr``, without copying the descriptor. It reads as a descriptor wherever Triton's own
    launch path takes one (a launch hook is set, or :func:`splicer` declined).

    Example::

        again(Rebased(first_descriptor, A.data_ptr()), ...)
    """

    __slots__ = ("template", "ptr")

    def __init__(self, template, ptr: int):
        self.template, self.ptr = template, ptr

    @property
    def base(self) -> Address:
        return Address(self.ptr, self.template.base.dtype)

    @property
    def shape(self):
        return self.template.shape

    @property
    def strides(self):
        return self.template.strides

    @property
    def block_shape(self):
        return self.template.block_shape

    @property
    def padding(self):
        return self.template.padding


def rebased(descriptor, base: torch.Tensor | int) -> Rebased:
    """``descriptor`` (an earlier call's layout: shape, strides, block, dtype) at ``base``'s address (a
    tensor's, or an address), holding no tensor and copying nothing.

    Example::

        again(rebased(first_descriptor, A), ...)   # a PreparedLaunch whose first launch made first_descriptor
    """
    ptr = base if isinstance(base, int) else base.data_ptr()
    return Rebased(descriptor.template if isinstance(descriptor, Rebased) else descriptor, ptr)


def splicer(launch):
    """``(c_entry, splice)`` when ``launch`` (a compiled launcher's ``launch`` attribute) is Triton's
    descriptor wrapper around the launcher's C entry, else None.

    ``splice(args)`` turns the kernel's arguments (descriptors at their positions, as
    :class:`Rebased` or ``TensorDescriptor``) into the C entry's: each descriptor replaced by Triton's
    own encoding of it (``make_tensordesc_arg``, with the compiled kernel's metadata for that
    argument), which is kept per (layout, address) for :class:`Rebased` ones. The wrapper is
    recognised by what it closes over (the C entry, the descriptors' positions, their metadata) and
    its module's encoder and argument-prefix length; anything else answers None.
    """
    code, closure = getattr(launch, "__code__", None), getattr(launch, "__closure__", None)
    if code is None or not closure:
        return None
    cells = dict(zip(code.co_freevars, (cell.cell_contents for cell in closure), strict=True))
    if set(cells) != {"launcher", "tensordesc_indices", "tensordesc_meta"}:
        return None
    module = sys.modules.get(getattr(launch, "__module__", ""), None)
    encode = getattr(module, "make_tensordesc_arg", None)
    # The C entry's arguments before the kernel's: grid (3), stream, function, 4 flags, packed
    # metadata, launch metadata, 2 hooks; the wrapper counts descriptor positions after them.
    if encode is None or getattr(module, "_BASE_ARGS_FORMAT_LEN", None) != 13:
        return None
    positions, metas = sorted(cells["tensordesc_indices"]), cells["tensordesc_meta"]
    if len(metas) != len(positions):
        return None
    # From the last position back, so that splicing one leaves the earlier positions where they were.
    slots = [(pos, meta, {}) for pos, meta in zip(positions, metas, strict=True)][::-1]

    def splice(args) -> list:
        final = list(args)
        for pos, meta, encoded in slots:
            arg = final[pos]
            if type(arg) is Rebased:
                kept = encoded.get(arg.ptr)
                if kept is None or kept[0] is not arg.template:  # the template's identity: the layout
                    if len(encoded) >= KEEP_PER_ARGUMENT:
                        encoded.clear()
                    kept = encoded[arg.ptr] = (arg.template, encode(arg, meta))
                final[pos:pos + 1] = kept[1]
            else:
                final[pos:pos + 1] = encode(arg, meta)
        return final

    return cells["launcher"], splice
