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


class TensorFactory:
    """Mixin for :class:`trident.Context`; needs ``_place(meta, what, out, device)``."""

    def _place(self, meta: torch.Tensor, what: str, out, device) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    @staticmethod
    def _finish(t: torch.Tensor, requires_grad: bool) -> torch.Tensor:
        if requires_grad:
            t.requires_grad_(True)
        return t

    # -- from a size ----------------------------------------------------------------------
    def empty(self, *size, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False,
              pin_memory=False, memory_format=torch.contiguous_format) -> torch.Tensor:
        """Uninitialized symmetric tensor, like :func:`torch.empty`.

        Example::

            buf = ctx.empty(1024, dtype=torch.bfloat16)
        """
        if pin_memory:
            raise ValueError("pin_memory=True: heap tensors live in the symmetric heap, not in pinned host memory")
        meta = torch.empty(*size, dtype=dtype, layout=layout, device="meta", memory_format=memory_format)
        return self._finish(self._place(meta, "empty", out, device), requires_grad)

    def zeros(self, *size, out=None, dtype=None, layout=torch.strided, device=None,
              requires_grad=False) -> torch.Tensor:
        """Symmetric tensor of zeros, like :func:`torch.zeros`.

        Example::

            flags = ctx.zeros(world_size, dtype=torch.int32)
        """
        meta = torch.zeros(*size, dtype=dtype, layout=layout, device="meta")
        return self._finish(self._place(meta, "zeros", out, device).zero_(), requires_grad)

    def ones(self, *size, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False) -> torch.Tensor:
        """Symmetric tensor of ones, like :func:`torch.ones`.

        Example::

            x = ctx.ones(4, 8, dtype=torch.float16)
        """
        meta = torch.ones(*size, dtype=dtype, layout=layout, device="meta")
        return self._finish(self._place(meta, "ones", out, device).fill_(1), requires_grad)

    def full(self, size, fill_value, *, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False) -> torch.Tensor:
        """Symmetric tensor filled with ``fill_value``, like :func:`torch.full` (same dtype inference).

        Example::

            x = ctx.full((2, 3), ctx.rank)
        """
        meta = torch.full(size, fill_value, dtype=dtype, layout=layout, device="meta")
        return self._finish(self._place(meta, "full", out, device).fill_(fill_value), requires_grad)

    def arange(self, start, end=None, step=1, *, out=None, dtype=None, layout=torch.strided, device=None,
               requires_grad=False) -> torch.Tensor:
        """Symmetric 1-D range, like :func:`torch.arange` (``arange(end)`` or ``arange(start, end, step)``).

        Example::

            x = ctx.arange(10, dtype=torch.float32)
        """
        if end is None:
            start, end = 0, start
        meta = torch.arange(start, end, step, dtype=dtype, layout=layout, device="meta")
        t = self._place(meta, "arange", out, device)
        torch.arange(start, end, step, dtype=meta.dtype, out=t)
        return self._finish(t, requires_grad)

    def linspace(self, start, end, steps, *, out=None, dtype=None, layout=torch.strided, device=None,
                 requires_grad=False) -> torch.Tensor:
        """Symmetric evenly spaced values, like :func:`torch.linspace`.

        Example::

            x = ctx.linspace(0.0, 1.0, steps=5)
        """
        meta = torch.linspace(start, end, steps, dtype=dtype, layout=layout, device="meta")
        t = self._place(meta, "linspace", out, device)
        torch.linspace(start, end, steps, dtype=meta.dtype, out=t)
        return self._finish(t, requires_grad)

    def rand(self, *size, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False, pin_memory=False) -> torch.Tensor:
        """Symmetric uniform [0, 1) samples, like :func:`torch.rand`.

        Each rank draws from its own generator; seed them alike for equal data everywhere.

        Example::

            a = ctx.rand(128, 64, dtype=torch.float16, generator=torch.Generator(ctx.device).manual_seed(0))
        """
        if pin_memory:
            raise ValueError("pin_memory=True is not meaningful for heap tensors")
        meta = torch.rand(*size, dtype=dtype, layout=layout, device="meta")
        t = self._place(meta, "rand", out, device)
        torch.rand(*meta.shape, generator=generator, dtype=meta.dtype, out=t)
        return self._finish(t, requires_grad)

    def randn(self, *size, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
              requires_grad=False, pin_memory=False) -> torch.Tensor:
        """Symmetric standard-normal samples, like :func:`torch.randn`.

        Example::

            x = ctx.randn(1024, dtype=torch.bfloat16)
        """
        if pin_memory:
            raise ValueError("pin_memory=True is not meaningful for heap tensors")
        meta = torch.randn(*size, dtype=dtype, layout=layout, device="meta")
        t = self._place(meta, "randn", out, device)
        torch.randn(*meta.shape, generator=generator, dtype=meta.dtype, out=t)
        return self._finish(t, requires_grad)

    def randint(self, *args, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
                requires_grad=False) -> torch.Tensor:
        """Symmetric random integers, like :func:`torch.randint` (``(high, size)`` or ``(low, high, size)``).

        Example::

            idx = ctx.randint(0, 8, (16,))
        """
        meta = torch.randint(*args, dtype=dtype, layout=layout, device="meta")
        t = self._place(meta, "randint", out, device)
        torch.randint(*args, generator=generator, dtype=meta.dtype, out=t)
        return self._finish(t, requires_grad)

    # -- like another tensor -----------------------------------------------------------------
    def _like(self, input, what, dtype, layout, device, memory_format) -> torch.Tensor:
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"ctx.{what}: input must be a torch.Tensor, got {type(input).__name__}")
        meta = torch.empty_like(input, dtype=dtype, layout=layout, device="meta", memory_format=memory_format)
        return self._place(meta, what, None, device)

    def empty_like(self, input, *, dtype=None, layout=None, device=None, requires_grad=False,
                   memory_format=torch.preserve_format) -> torch.Tensor:
        """Uninitialized symmetric tensor shaped like ``input``, like :func:`torch.empty_like`.

        Example::

            out = ctx.empty_like(x)
        """
        t = self._like(input, "empty_like", dtype, layout, device, memory_format)
        return self._finish(t, requires_grad)

    def zeros_like(self, input, *, dtype=None, layout=None, device=None, requires_grad=False,
                   memory_format=torch.preserve_format) -> torch.Tensor:
        """Symmetric zeros shaped like ``input``, like :func:`torch.zeros_like`.

        Example::

            acc = ctx.zeros_like(x, dtype=torch.float32)
        """
        t = self._like(input, "zeros_like", dtype, layout, device, memory_format)
        return self._finish(t.zero_(), requires_grad)

    def ones_like(self, input, *, dtype=None, layout=None, device=None, requires_grad=False,
                  memory_format=torch.preserve_format) -> torch.Tensor:
        """Symmetric ones shaped like ``input``, like :func:`torch.ones_like`.

        Example::

            y = ctx.ones_like(x)
        """
        t = self._like(input, "ones_like", dtype, layout, device, memory_format)
        return self._finish(t.fill_(1), requires_grad)

    def full_like(self, input, fill_value, *, dtype=None, layout=None, device=None, requires_grad=False,
                  memory_format=torch.preserve_format) -> torch.Tensor:
        """Symmetric tensor shaped like ``input`` filled with ``fill_value``, like :func:`torch.full_like`.

        Example::

            y = ctx.full_like(x, -1)
        """
        t = self._like(input, "full_like", dtype, layout, device, memory_format)
        return self._finish(t.fill_(fill_value), requires_grad)

    def as_symmetric(self, tensor: torch.Tensor) -> torch.Tensor:
        """Copy ``tensor`` (from any device) into a new symmetric tensor of the same shape and dtype.

        Example::

            weights = ctx.as_symmetric(torch.randn(4096, 4096))
        """
        if not isinstance(tensor, torch.Tensor):
            raise NotSymmetricError(f"ctx.as_symmetric takes a torch.Tensor, got {type(tensor).__name__}")
        t = self._like(tensor, "as_symmetric", None, None, None, torch.preserve_format)
        return t.copy_(tensor.detach())
