"""A call's launches and copies, recorded as it runs, replayed with another call's tensors.

What a small call costs on the host is mostly Python: checks, decisions, workspace lookups, and
Triton's launch path, which binds and specializes every argument again (about 16 us per empty
launch on the H200 host, against about 3 us for the compiled kernel's own launcher). A
:class:`Recording` is made for a call's *operands* (its ``tensors``, outputs included). While the
call runs, every kernel launch and copy goes through it; it launches now and keeps a step that
launches the same compiled kernel again, with each argument classified once:

* a call operand (or a view inside one): bound per replay, from the new call's tensor at the same
  byte offset, so a new output tensor every call still takes the fast path;
* heap memory (the team's workspace: sync words, staging buffers; valid in the cache's
  generation) or scratch the recording owns (:meth:`Recording.own`): kept as it is;
* anything else (an int, a constexpr): kept as it is.

A tensor that is none of these (a temporary the call made and did not hand to :meth:`own`) would be
replayed at a stale address: recording refuses it at once (:class:`UnreplayableCall`), so an op
that breaks the rule fails its first call in the tests instead of corrupting a later one.

On a GPU a step calls the compiled kernel's launcher with addresses. In the simulator (where
Triton's interpreter runs kernels and needs tensors) a step launches the interpreter again on
views of the new tensors; nothing holds a caller's tensor in either case.

Example::

    rec = Recording((x, out), heap=team.heap_range, on_gpu=True)
    rec.launch(kernel, (programs,), (x, stage, out, n), {"BLOCK": 1024}, num_warps=4)
    ...
    rec.replay((x2, out2))          # the same launches, on x2 and out2
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from copy import copy as shallow_copy

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import torch_private
from ..errors import TridentError
from ..kernels.prepared import by_address, prepare, rebased
from .cache import addresses


class UnreplayableCall(TridentError):
    """A recorded launch took a tensor the recording cannot bind again (a bug in the op: the
    tensor must be an operand, heap memory, or scratch handed to :meth:`Recording.own`)."""


def _view(base: torch.Tensor, offset: int, shape, stride, dtype) -> torch.Tensor:
    """The tensor of ``shape``/``stride``/``dtype`` that starts ``offset`` bytes into ``base``'s memory."""
    storage = base.untyped_storage()
    start = base.data_ptr() - storage.data_ptr() + offset
    return torch.empty(0, dtype=dtype, device=base.device).set_(storage, start // dtype.itemsize, shape, stride)


def _without_base(descriptor: TensorDescriptor) -> TensorDescriptor:
    """A descriptor's layout without its base tensor (a recording holds no caller's tensor)."""
    descriptor = shallow_copy(descriptor)
    descriptor.base = None
    return descriptor


class _Launch:
    """A compiled kernel's launcher with its arguments; ``refs`` say which to bind per replay:
    ``(position, operand, byte offset, descriptor or None)``."""

    __slots__ = ("run", "values", "refs")

    def __init__(self, run, values: list, refs: list):
        self.run, self.values, self.refs = run, values, refs

    def __call__(self, ptrs, tensors, options) -> None:
        values = self.values.copy()
        for pos, slot, offset, descriptor in self.refs:
            if descriptor is None:
                values[pos] = ptrs[slot] + offset
            else:  # a TMA descriptor of an operand: the same layout at the new address
                values[pos] = rebased(descriptor, ptrs[slot] + offset)
        self.run(*values)


class _Interpret:
    """The simulator's step: the interpreter's launch again, on views of the new operands."""

    __slots__ = ("kernel", "grid", "args", "refs", "constexprs", "options")

    def __init__(self, kernel, grid, args: list, refs: list, constexprs: dict, options: dict):
        self.kernel, self.grid, self.args, self.refs = kernel, grid, args, refs
        self.constexprs, self.options = constexprs, options

    def __call__(self, ptrs, tensors, options) -> None:
        args = list(self.args)
        for pos, slot, offset, geometry, descriptor in self.refs:
            view = _view(tensors[slot], offset, *geometry)
            args[pos] = view if descriptor is None else dataclasses.replace(descriptor, base=view)
        self.kernel[self.grid](*args, **self.constexprs, **self.options)


class _Copy:
    """``dst.copy_(src)`` again: ``ends`` are ``(operand or None, byte offset or tensor)`` for dst
    and src; by address on a GPU (``cudaMemcpyAsync``), on views in the simulator."""

    __slots__ = ("ends", "nbytes", "on_gpu", "geometry")

    def __init__(self, ends, nbytes: int, on_gpu: bool, geometry):
        self.ends, self.nbytes, self.on_gpu, self.geometry = ends, nbytes, on_gpu, geometry

    def __call__(self, ptrs, tensors, options) -> None:
        if self.on_gpu:
            to, frm = ((ptrs[slot] + at) if slot is not None else at for slot, at in self.ends)
            _memcpy(to, frm, self.nbytes)
            return
        dst, src = ((_view(tensors[slot], at, *self.geometry) if slot is not None else at) for slot, at in self.ends)
        dst.copy_(src)


def _memcpy(to: int, frm: int, nbytes: int) -> None:
    from ..backends.cuda import checked, cuda_runtime  # the cuda backend's (a replay on a GPU)

    runtime = cuda_runtime()
    stream = torch_private.raw_stream_function()(torch.cuda.current_device())
    checked(runtime.cudaMemcpyAsync(to, frm, nbytes, runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice, stream),
            f"cudaMemcpyAsync of {nbytes} bytes in a replayed call")


class Recording:
    """The steps of one call on ``tensors`` (its operands; None for an absent one), replayable with others.

    Args:
        tensors: the call's operands, inputs and outputs, in a fixed order (the cache key's order).
        heap: ``(lo, hi)`` addresses of this rank's heap: memory there stays put while the cache's
            generation does (the team's ``heap_range``).
        on_gpu: whether steps go through compiled launchers (False: the simulator's interpreter).
        generation: the current generation of the buffers the steps launch on (the cache's), read
            at every step: a recording whose steps span a buffer's move is never replayed.

    Attributes:
        rerun: set by :meth:`rerun_with`: the call is not replayed step by step but by this function
            of the new operands (its decisions kept, its checks skipped).
        kept: False after :meth:`discard`: nothing of this call is kept.
        memo: what the op's run noted for its entry (workspace views it returns), kept with the entry.
    """

    def __init__(self, tensors: tuple, heap: tuple[int, int], on_gpu: bool, generation=lambda: 0):
        self._spans = [None if t is None else (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
                       for t in tensors]
        self._heap, self.on_gpu = heap, on_gpu
        self.steps: list = []
        self.owned: list[torch.Tensor] = []
        self.rerun = None
        self.kept = True
        self.memo: dict = {}  # what the op's run notes for its entry (views it returns), kept with the entry
        self._generation = generation
        self.generations: set[int] = set()  # of the buffers each step was recorded on

    # -- what a call does through its recording -----------------------------------------------------
    def launch(self, kernel, grid: tuple[int, ...], args: tuple, constexprs: dict, **options) -> None:
        """``kernel[grid](*args, **constexprs, **options)`` now, and in every replay."""
        step = prepare(kernel, grid, args, constexprs, **options)
        launcher = step.launcher()
        refs: list[tuple] = []  # (pos, slot, offset, descriptor) on a GPU; geometry too in the simulator
        values: list = []
        for pos, arg in enumerate(args):
            base = arg.base if isinstance(arg, TensorDescriptor) else arg
            if not isinstance(base, torch.Tensor):
                values.append(arg)
                continue
            slot, offset = self._classify(base, f"argument {pos} of {getattr(kernel, '__name__', kernel)}")
            if slot is None:
                values.append(by_address(arg) if launcher is not None else arg)
            elif launcher is not None:
                refs.append((pos, slot, offset, by_address(arg) if base is not arg else None))
                values.append(None)
            else:  # the simulator: a view of the new operand (in the descriptor, if it is one)
                geometry = (base.shape, base.stride(), base.dtype)
                refs.append((pos, slot, offset, geometry, _without_base(arg) if base is not arg else None))
                values.append(None)
        if launcher is None:
            self._keep(_Interpret(kernel, grid, values, refs, constexprs, options))
        else:
            run, tail = launcher
            self._keep(_Launch(run, [*values, *tail], refs))

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """``dst.copy_(src)`` now and in every replay (both contiguous, one dtype and size)."""
        if not (dst.is_contiguous() and src.is_contiguous() and dst.dtype == src.dtype
                and dst.numel() == src.numel()):
            raise UnreplayableCall(f"a recorded copy needs contiguous tensors of one dtype and size, got "
                                   f"{dst.dtype} {tuple(dst.shape)} <- {src.dtype} {tuple(src.shape)}")
        dst.copy_(src)
        ends = []
        for t in (dst, src):
            slot, offset = self._classify(t, "a copy")
            ends.append((slot, offset) if slot is not None else (None, t.data_ptr() if self.on_gpu else t))
        self._keep(_Copy(tuple(ends), src.numel() * src.element_size(), self.on_gpu,
                         (dst.shape, dst.stride(), dst.dtype)))
        return dst

    def every_replay(self, step, now: bool = True) -> None:
        """Run ``step()`` (a host step on owned scratch or heap memory, never on an operand) now (unless
        ``now`` is False) and in every replay, e.g. ``rec.every_replay(counts.zero_)``."""
        if now:
            step()
        self._keep(lambda ptrs, tensors, options: step())

    def per_call(self, step, options: tuple) -> None:
        """Run ``step(options)`` now with this call's ``options`` and in every replay with that call's:
        host work that follows the call's options rather than its operands' addresses (writing
        all_to_all_v's split table into heap memory), for an op whose key leaves those options out
        (:attr:`trident.calls.Op.key_options`)."""
        step(options)
        self._keep(lambda ptrs, tensors, options: step(options))

    def _keep(self, step) -> None:
        """Add ``step`` (called ``step(ptrs, tensors, options)`` by a replay), noting the buffers' generation."""
        self.generations.add(self._generation())
        self.steps.append(step)

    def own(self, *tensors: torch.Tensor) -> None:
        """Keep ``tensors`` (scratch the call made and launches on) alive with the recording; replays reuse them."""
        self.owned.extend(tensors)

    def rerun_with(self, fn) -> None:
        """This call cannot be replayed step by step (it runs torch or torch.distributed work, or a
        nested trident call): later calls run ``fn(*tensors)``, skipping the checks and decisions."""
        self.rerun = fn

    def discard(self) -> None:
        """Keep nothing of this call (an early way out, e.g. an empty shape)."""
        self.kept = False

    # -- later calls ------------------------------------------------------------------------------
    def replay(self, tensors: tuple, options: tuple = (), ptrs: Sequence[int | None] | None = None) -> None:
        """Run the call again on ``tensors`` (the same layout as the recorded ones) and ``options``
        (which only :meth:`per_call` steps read: the rest are in the cache key); ``ptrs``: their
        ``data_ptr()`` when the caller has them (:meth:`CallCache.lookup`)."""
        if self.rerun is not None:
            self.rerun(*tensors)
            return
        if ptrs is None:
            ptrs = addresses(tensors)
        for step in self.steps:
            step(ptrs, tensors, options)

    def _classify(self, t: torch.Tensor, what: str):
        """``(operand, byte offset)`` for memory inside an operand (bound per replay), ``(None, None)``
        for memory that stays put (heap, owned scratch); raises for anything else."""
        ptr = t.data_ptr()
        for exact in (True, False):
            for slot, span in enumerate(self._spans):
                if span is not None and (ptr == span[0] if exact else span[0] <= ptr < span[1]):
                    return slot, ptr - span[0]
        if self._heap[0] <= ptr < self._heap[1]:
            return None, None
        if any(o.data_ptr() <= ptr < o.data_ptr() + max(o.numel() * o.element_size(), 1) for o in self.owned):
            return None, None
        raise UnreplayableCall(
            f"{what} is a tensor ({t.dtype} {tuple(t.shape)}) that is neither one of the call's operands, nor "
            f"heap memory, nor scratch handed to Recording.own: a replay would launch on a stale address")
