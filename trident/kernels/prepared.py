"""Host calls that repeat: each step prepared once per key, replayed on every later call.

What a small collective costs on the host is mostly Python: argument checks, workspace lookups,
and Triton's own launch path, which binds and specializes every argument and looks the compiled
kernel up on every launch (about 16 us per empty launch on the H200 machine, against about
3 us for the compiled kernel's launcher alone). A decode loop calls the same collective on the
same buffers every step, so all of that gives the same answer every time.

A :class:`PlanCache` maps a key (everything a call's work is made from: the tensors' addresses,
shapes, strides and dtypes, and the call's options) to a :class:`Plan`, the list of steps that
call ran. The first call with a key checks everything and runs normally through
:func:`launch`, which records each kernel launch as a step bound to its final arguments; later
calls with the same key run the steps straight away. A key only ever holds a plan made by a
call that passed every check, and the arguments are the same by construction (the key holds
everything they come from), so the replay launches exactly what a full call would.

A call that must launch on new tensors every time (an op that returns fresh outputs) keeps a
:class:`PreparedLaunch` instead (:func:`prepare`): the same compiled kernel, launched with new
arguments.

Example::

    plans = PlanCache()
    plan = plans.get(key)
    if plan is None:
        check(...)                                   # raises before anything is recorded
        plan = Plan()
        launch(plan, kernel, (programs,), (x, n, ...), {"BLOCK": 1024}, num_warps=4)
        plans.put(key, plan)
    else:
        plan()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from copy import copy as shallow_copy

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

#: Plans a cache keeps; past this many keys the oldest is dropped (a loop with ever-new buffers
#: must not grow the cache without bound).
MAX_PLANS = 256


class Plan:
    """The steps of one call, in order; calling the plan runs them.

    A step is a callable without arguments: a prepared kernel launch (:func:`launch`), a copy
    (:func:`copy`), or any host step that must run again on every call
    (``plan.steps.append(lambda: out.copy_(stage))``).
    """

    __slots__ = ("steps", "owned")

    def __init__(self):
        self.steps: list[Callable[[], object]] = []
        self.owned: list[torch.Tensor] = []  # scratch the steps launch on, kept alive with the plan

    def own(self, *tensors: torch.Tensor) -> None:
        """Keep ``tensors`` (scratch the recorded launches use, not the caller's) alive with the plan."""
        self.owned.extend(tensors)

    def __call__(self) -> None:
        for step in self.steps:
            step()


class PlanCache:
    """Plans (or any per-call record) by key, at most :data:`MAX_PLANS`, the oldest dropped first;
    :meth:`clear` forgets all (call it when memory a plan points at may have moved, e.g. when a
    workspace buffer grew)."""

    def __init__(self, max_plans: int = MAX_PLANS):
        self.max_plans = max_plans
        self._plans: dict = {}

    def get(self, key) -> Plan | None:
        """The plan recorded for ``key``, or None."""
        return self._plans.get(key)

    def put(self, key, plan: Plan) -> None:
        """Remember ``plan`` for ``key``."""
        if key not in self._plans and len(self._plans) >= self.max_plans:  # a key put again evicts nothing
            del self._plans[next(iter(self._plans))]
        self._plans[key] = plan

    def clear(self) -> None:
        """Forget every plan."""
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)


def plan_key(*parts):
    """A key for a call: tensors by address, shape, strides and dtype, anything else as it is; None when
    a part is neither a tensor nor hashable (the call then takes the full path, which says why).

    Example::

        key = plan_key("all_reduce", tensor, op, algorithm)
    """
    try:
        key = tuple((p.data_ptr(), p.shape, p.stride(), p.dtype) if isinstance(p, torch.Tensor) else p
                    for p in parts)
        hash(key)
    except (TypeError, RuntimeError):
        return None
    return key


class PreparedLaunch:
    """One kernel launch, compiled once, launched again with new runtime arguments.

    :func:`prepare` launches ``kernel[grid](*args, **constexprs, **options)`` once; calling the
    result launches the same compiled kernel (same constexprs, options and grid) with new
    positional arguments through the compiled kernel's own launcher, skipping Triton's binding,
    specialization and cache lookup. Tensors are passed by address. The new arguments must
    specialize as the first ones did (the same ones None, the same ints equal to 1, pointers and
    ints as divisible by 16): the caller's key guarantees it (fresh ``torch.empty`` outputs are
    aligned as every allocation is). Where Triton's JIT returns no compiled kernel (the CPU
    simulator, where the interpreter runs the kernel), a call is the full launch again.

    Example::

        step = prepare(kernel, (programs,), (x, out, n), {"BLOCK": 1024}, num_warps=4)  # launches now
        step(x, torch.empty_like(x), n)                                                 # the same kernel again
    """

    __slots__ = ("_run", "_tail", "_again")

    def __init__(self, kernel, grid: tuple[int, ...], args: tuple, constexprs: dict, options: dict):
        compiled = kernel[grid](*args, **constexprs, **options)
        if compiled is None or not hasattr(compiled, "packed_metadata"):  # the simulator
            self._run, self._tail = None, ()
            self._again = lambda *new: kernel[grid](*new, **constexprs, **options)
            return
        # The launcher takes every parameter in kernel.arg_names order, constexprs included: those
        # after the positional ones come from constexprs or the parameters' defaults.
        params = kernel.signature.parameters
        self._tail = tuple(by_address(constexprs[name] if name in constexprs else params[name].default)
                           for name in kernel.arg_names[len(args):])
        self._run, self._again = compiled[(*grid, 1, 1)[:3]], None

    @property
    def compiled(self) -> bool:
        """Whether calls go straight to a compiled kernel (False in the simulator: full launches, which
        need the tensors themselves, not their addresses)."""
        return self._run is not None

    def __call__(self, *args) -> None:
        if self._run is None:
            self._again(*args)
        else:
            self._run(*[by_address(a) for a in args], *self._tail)

    def bind(self, *args) -> Callable[[], None]:
        """A step without arguments that launches with ``args`` (converted once, tensors by address;
        in the simulator the step holds them)."""
        if self._run is None:
            return lambda: self._again(*args)
        values = (*[by_address(a) for a in args], *self._tail)
        run = self._run
        return lambda: run(*values)


def prepare(kernel, grid: tuple[int, ...], args: tuple, constexprs: dict, **options) -> PreparedLaunch:
    """Launch ``kernel[grid](*args, **constexprs, **options)`` now and return a :class:`PreparedLaunch`
    that launches the same compiled kernel again with new positional arguments.

    Example::

        again = prepare(kernels.rmsnorm_kernel, (rows,), (x, out, hidden), {"BLOCK": 1024}, num_warps=4)
        again(x, torch.empty_like(x), hidden)
    """
    return PreparedLaunch(kernel, grid, args, constexprs, options)


def launch(plan: Plan | None, kernel, grid: tuple[int, ...], args: tuple, constexprs: dict, **options) -> None:
    """Launch ``kernel[grid](*args, **constexprs, **options)`` now; record it in ``plan`` as a step
    that launches the same compiled kernel with the same arguments (:meth:`PreparedLaunch.bind`).

    The step goes through the compiled kernel's own launcher (``CompiledKernel[grid]``), skipping
    Triton's argument binding and cache lookup. Tensors are bound by address: the plan's key must
    hold every tensor's address, so that a replay only happens for a call on the same memory.
    With ``plan`` None it only launches. Where Triton's JIT returns no compiled kernel (the CPU
    simulator, where the interpreter runs the kernel), the step is the same full launch again
    (holding the tensors, so that no other tensor can take their addresses meanwhile).

    Args:
        plan: where to record the step, or None.
        kernel: a ``@triton.jit`` function.
        grid: the launch grid (1 to 3 ints).
        args: the positional arguments.
        constexprs: keyword arguments (meta-parameters and any others).
        options: launch options (``num_warps``, ``num_stages``).

    Example::

        launch(plan, kernels.all_gather_kernel, (programs,), (source, out, n, sync, rank, world_size,
               heap_bases), {"BLOCK": 1024, "WORLD_BLOCK": 4}, num_warps=4)
    """
    if plan is None:
        kernel[grid](*args, **constexprs, **options)
        return
    plan.steps.append(prepare(kernel, grid, args, constexprs, **options).bind(*args))


class _Address:
    """A tensor's address and dtype, all a host TensorDescriptor's launch reads of its base: a plan's
    descriptors hold no tensor (a tensor kept alive by a plan would hold its memory)."""

    __slots__ = ("ptr", "dtype")

    def __init__(self, tensor: torch.Tensor):
        self.ptr, self.dtype = tensor.data_ptr(), tensor.dtype

    def data_ptr(self) -> int:
        return self.ptr


def rebased(descriptor: TensorDescriptor, tensor: torch.Tensor) -> TensorDescriptor:
    """``descriptor`` (shape, strides and block of ``tensor``'s layout) at ``tensor``'s address, holding
    no tensor: a new call's descriptor from an earlier call's, without building and checking it again.

    Example::

        again(rebased(first_descriptor, A), ...)   # a PreparedLaunch whose first launch made first_descriptor
    """
    descriptor = shallow_copy(descriptor)
    descriptor.base = _Address(tensor)
    return descriptor


def by_address(value):
    """A launch argument as a plan keeps it: tensors (also a descriptor's base) by address; anything
    else as it is.

    Example::

        values = [by_address(a) for a in args]   # holds no tensor
    """
    if isinstance(value, torch.Tensor):
        return value.data_ptr()
    if isinstance(value, TensorDescriptor) and isinstance(value.base, torch.Tensor):
        return dataclasses.replace(value, base=_Address(value.base))
    return value


def copy(plan: Plan | None, dst: torch.Tensor, src: torch.Tensor, on_gpu: bool) -> None:
    """``dst.copy_(src)`` now (both contiguous, one dtype); record in ``plan`` a step that copies the
    same bytes again on the then current stream, by address (``cudaMemcpyAsync``), holding neither
    tensor. In the simulator (``on_gpu`` False) the step is ``dst.copy_(src)`` again, holding both.

    Example::

        copy(plan, stage, A_local, not ctx.platform.simulator)    # a plain input staged on the heap
    """
    dst.copy_(src)
    if plan is None:
        return
    if not on_gpu:
        plan.steps.append(lambda: dst.copy_(src))
        return
    from cuda.bindings import runtime  # the cuda backend's dependency (trident.backends.cuda)

    to, frm, nbytes = dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size()
    kind, device = runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice, dst.device

    def step():
        (err,) = runtime.cudaMemcpyAsync(to, frm, nbytes, kind, torch.cuda.current_stream(device).cuda_stream)
        if err != runtime.cudaError_t.cudaSuccess:
            raise RuntimeError(f"cudaMemcpyAsync of {nbytes} bytes in a replayed call failed: {err}")

    plan.steps.append(step)
