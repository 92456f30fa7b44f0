"""Tensor creation on the symmetric heap, with torch's signatures.

Each function asks torch for the result's shape, dtype and strides on the ``meta`` device
(so dtype inference, argument parsing and error messages are torch's own), reserves the bytes
on the heap, and fills them with the same torch routine and ``out=``. With the same generator
state, ``ctx.rand(...)`` gives exactly ``torch.rand(...)``.

Creation is collective: every rank must make the same tensors in the same order.
"""

from __future__ import annotations

import torch

from ..errors import NotSymmetricError


def _dtype(dtype, out):
    """torch takes the dtype from ``out`` when none is given."""
    return out.dtype if dtype is None and isinstance(out, torch.Tensor) else dtype


class TensorFactory:
    """Mixin for :class:`trident.Context`; needs ``_place(meta, what, out, device)``."""

    def _place(self, meta: torch.Tensor, what: str, out, device) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def free(self, *tensors: torch.Tensor) -> None:  # pragma: no cover
        raise NotImplementedError

    def _make(self, meta: torch.Tensor, what: str, out, device, requires_grad: bool, fill=None) -> torch.Tensor:
        """Place a tensor like ``meta`` (or take ``out``), fill it, and give the memory back if that fails."""
        t = self._place(meta, what, out, device)
        try:
            if fill is not None:
                fill(t)
            if requires_grad:
                t.requires_grad_(True)
        except BaseException:
            if out is None:
                self.free(t)
            raise
        return t

    @staticmethod
    def _check_pin_memory(pin_memory: bool) -> None:
        if pin_memory:
            raise ValueError("pin_memory=True: heap tensors live in the symmetric heap, not in pinned host memory")

    # -- from a size ----------------------------------------------------------------------
    def empty(self, *size, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False,
              pin_memory=False, memory_format=torch.contiguous_format) -> torch.Tensor:
        """Uninitialized symmetric tensor, like :func:`torch.empty`.

        Example::

            buf = ctx.empty(1024, dtype=torch.bfloat16)
        """
        self._check_pin_memory(pin_memory)
        meta = torch.empty(*size, dtype=_dtype(dtype, out), layout=layout, device="meta", memory_format=memory_format)
        return self._make(meta, "empty", out, device, requires_grad)

    def zeros(self, *size, out=None, dtype=None, layout=torch.strided, device=None,
              requires_grad=False, pin_memory=False) -> torch.Tensor:
        """Symmetric tensor of zeros, like :func:`torch.zeros`.

        Example::

            flags = ctx.zeros(world_size, dtype=torch.int32)
        """
        self._check_pin_memory(pin_memory)
        meta = torch.zeros(*size, dtype=_dtype(dtype, out), layout=layout, device="meta")
        return self._make(meta, "zeros", out, device, requires_grad, torch.Tensor.zero_)

    def ones(self, *size, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False, pin_memory=False) -> torch.Tensor:
        """Symmetric tensor of ones, like :func:`torch.ones`.

        Example::

            x = ctx.ones(4, 8, dtype=torch.float16)
        """
        self._check_pin_memory(pin_memory)
        meta = torch.ones(*size, dtype=_dtype(dtype, out), layout=layout, device="meta")
        return self._make(meta, "ones", out, device, requires_grad, lambda t: t.fill_(1))

    def full(self, size, fill_value, *, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False, pin_memory=False) -> torch.Tensor:
        """Symmetric tensor filled with ``fill_value``, like :func:`torch.full` (same dtype inference).

        Example::

            x = ctx.full((2, 3), ctx.rank)
        """
        self._check_pin_memory(pin_memory)
        meta = torch.full(size, fill_value, dtype=_dtype(dtype, out), layout=layout, device="meta")
        return self._make(meta, "full", out, device, requires_grad, lambda t: t.fill_(fill_value))

    def arange(self, start=0, end=None, step=1, *, out=None, dtype=None, layout=torch.strided, device=None,
               requires_grad=False) -> torch.Tensor:
        """Symmetric 1-D range, like :func:`torch.arange` (``arange(end)`` or ``arange(start, end, step)``).

        Example::

            x = ctx.arange(10, dtype=torch.float32)
        """
        if end is None:
            start, end = 0, start
        meta = torch.arange(start, end, step, dtype=_dtype(dtype, out), layout=layout, device="meta")
        return self._make(meta, "arange", out, device, requires_grad,
                          lambda t: torch.arange(start, end, step, dtype=meta.dtype, out=t))

    def linspace(self, start, end, steps, *, out=None, dtype=None, layout=torch.strided, device=None,
                 requires_grad=False) -> torch.Tensor:
        """Symmetric evenly spaced values, like :func:`torch.linspace`.

        Example::

            x = ctx.linspace(0.0, 1.0, steps=5)
        """
        meta = torch.linspace(start, end, steps, dtype=_dtype(dtype, out), layout=layout, device="meta")
        return self._make(meta, "linspace", out, device, requires_grad,
                          lambda t: torch.linspace(start, end, steps, dtype=meta.dtype, out=t))

    def rand(self, *size, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False, pin_memory=False) -> torch.Tensor:
        """Symmetric uniform [0, 1) samples, like :func:`torch.rand`.

        Each rank draws from its own generator; seed them alike for equal data everywhere.

        Example::

            a = ctx.rand(128, 64, dtype=torch.float16, generator=torch.Generator(ctx.device).manual_seed(0))
        """
        self._check_pin_memory(pin_memory)
        meta = torch.rand(*size, dtype=_dtype(dtype, out), layout=layout, device="meta")
        return self._make(meta, "rand", out, device, requires_grad,
                          lambda t: torch.rand(meta.shape, generator=generator, dtype=meta.dtype, out=t))

    def randn(self, *size, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
              requires_grad=False, pin_memory=False) -> torch.Tensor:
        """Symmetric standard-normal samples, like :func:`torch.randn`.

        Example::

            x = ctx.randn(1024, dtype=torch.bfloat16)
        """
        self._check_pin_memory(pin_memory)
        meta = torch.randn(*size, dtype=_dtype(dtype, out), layout=layout, device="meta")
        return self._make(meta, "randn", out, device, requires_grad,
                          lambda t: torch.randn(meta.shape, generator=generator, dtype=meta.dtype, out=t))

    def randint(self, *args, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
                requires_grad=False, **bounds) -> torch.Tensor:
        """Symmetric random integers, like :func:`torch.randint` (``(high, size)`` or ``(low, high, size)``).

        Example::

            idx = ctx.randint(0, 8, (16,))
        """
        unknown = set(bounds) - {"low", "high", "size"}
        if unknown:
            raise TypeError(f"ctx.randint() got unexpected keyword arguments {sorted(unknown)}")
        meta = torch.randint(*args, **bounds, dtype=_dtype(dtype, out), layout=layout, device="meta")
        return self._make(meta, "randint", out, device, requires_grad,
                          lambda t: torch.randint(*args, **bounds, generator=generator, dtype=meta.dtype, out=t))

    # -- like another tensor -----------------------------------------------------------------
    def _like(self, input, what, dtype, layout, device, memory_format, requires_grad=False, fill=None):
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"ctx.{what}: input must be a torch.Tensor, got {type(input).__name__}")
        meta = torch.empty_like(input, dtype=dtype, layout=layout, device="meta", memory_format=memory_format)
        return self._make(meta, what, None, device, requires_grad, fill)

    def empty_like(self, input, *, dtype=None, layout=None, device=None, requires_grad=False,
                   memory_format=torch.preserve_format) -> torch.Tensor:
        """Uninitialized symmetric tensor shaped like ``input``, like :func:`torch.empty_like`.

        Example::

            out = ctx.empty_like(x)
        """
        return self._like(input, "empty_like", dtype, layout, device, memory_format, requires_grad)

    def zeros_like(self, input, *, dtype=None, layout=None, device=None, requires_grad=False,
                   memory_format=torch.preserve_format) -> torch.Tensor:
        """Symmetric zeros shaped like ``input``, like :func:`torch.zeros_like`.

        Example::

            acc = ctx.zeros_like(x, dtype=torch.float32)
        """
        return self._like(input, "zeros_like", dtype, layout, device, memory_format, requires_grad,
                          torch.Tensor.zero_)

    def ones_like(self, input, *, dtype=None, layout=None, device=None, requires_grad=False,
                  memory_format=torch.preserve_format) -> torch.Tensor:
        """Symmetric ones shaped like ``input``, like :func:`torch.ones_like`.

        Example::

            y = ctx.ones_like(x)
        """
        return self._like(input, "ones_like", dtype, layout, device, memory_format, requires_grad,
                          lambda t: t.fill_(1))

    def full_like(self, input, fill_value, *, dtype=None, layout=None, device=None, requires_grad=False,
                  memory_format=torch.preserve_format) -> torch.Tensor:
        """Symmetric tensor shaped like ``input`` filled with ``fill_value``, like :func:`torch.full_like`.

        Example::

            y = ctx.full_like(x, -1)
        """
        return self._like(input, "full_like", dtype, layout, device, memory_format, requires_grad,
                          lambda t: t.fill_(fill_value))

    def as_symmetric(self, tensor: torch.Tensor) -> torch.Tensor:
        """Copy ``tensor`` (from any device) into a new symmetric tensor of the same shape and dtype.

        Example::

            weights = ctx.as_symmetric(torch.randn(4096, 4096))
        """
        if not isinstance(tensor, torch.Tensor):
            raise NotSymmetricError(f"ctx.as_symmetric takes a torch.Tensor, got {type(tensor).__name__}")
        return self._like(tensor, "as_symmetric", None, None, None, torch.preserve_format,
                          fill=lambda t: t.copy_(tensor.detach()))
