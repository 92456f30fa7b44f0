"""Prepared launches: a Triton kernel compiled once, launched again through its own launcher.

What a small call costs on the host is mostly Python, and a good part of it is Triton's own launch
path, which binds and specializes every argument and looks the compiled kernel up on every launch
(about 16 us per empty launch on the H200 host, against about 3 us for the compiled kernel's
launcher alone). :func:`prepare` launches a kernel once through Triton and keeps the compiled
kernel's launcher; :class:`PreparedLaunch` launches it again with new arguments. The call pipeline's
recordings (:mod:`trident.calls.recording`) are built from these, with tensors passed by address
(:func:`by_address`) and TMA descriptors rebased (:func:`rebased`, encoded once per address:
:mod:`trident.kernels.descriptors`).

Example::

    step = prepare(kernel, (programs,), (x, out, n), {"BLOCK": 1024}, num_warps=4)  # launches now
    step(x, torch.empty_like(x), n)                                                 # the same kernel again
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from copy import copy as shallow_copy

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import torch_private
from .descriptors import Address, rebased, splicer

__all__ = ["PreparedLaunch", "by_address", "direct_launcher", "prepare", "rebased"]


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
    _run: Callable | None  # the compiled kernel's direct launcher, or None (the simulator)
    _tail: tuple
    _again: Callable | None  # the full launch again (the simulator), or None

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
        self._run, self._again = direct_launcher(compiled, (*grid, 1, 1)[:3]), None

    @property
    def compiled(self) -> bool:
        """Whether calls go straight to a compiled kernel (False in the simulator: full launches, which
        need the tensors themselves, not their addresses)."""
        return self._run is not None

    def launcher(self):
        """``(run, tail)``: the compiled kernel's launcher and the arguments after the positional
        ones (constexprs, defaults), so that ``run(*values, *tail)`` launches it again; None in the
        simulator."""
        return None if self._run is None else (self._run, self._tail)

    def __call__(self, *args) -> None:
        if self._run is None:
            assert self._again is not None  # the simulator: one of the two is set
            self._again(*args)
        else:
            self._run(*[by_address(a) for a in args], *self._tail)


def _hooked(hook) -> bool:
    """Whether a Triton launch hook is set: a function, or a ``HookChain`` (Triton >= 3.5) with calls."""
    return hook is not None and bool(getattr(hook, "calls", True))


def direct_launcher(compiled, grid: tuple[int, ...]):
    """``compiled[grid]``'s launch without its per-call Python: the compiled kernel's launcher called
    straight with the function handle, the packed metadata and the current stream of the device the
    kernel was compiled on (about 5 us less per launch on the H200 host than Triton's runner, which
    also asks for the current device and builds launch metadata every call). Where the launcher's
    own Python step only passes its arguments on (:func:`_bare_launch`), its C entry is called
    directly. While a Triton launch hook is set (a profiler such as proton) every launch goes
    through Triton's own runner, so the hooks see it.

    Example::

        again = direct_launcher(kernel[grid](*args), grid)
        again(*values)
    """
    from triton import knobs

    raw_stream = torch_private.raw_stream_function()
    runner = compiled[grid]
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    device = torch.cuda.current_device()
    hooks = knobs.runtime
    g0, g1, g2 = grid
    # The launcher's C entry (with its flags) where its Python step only passes arguments on, else the launcher.
    target, flags = _bare_launch(run) or (run, ())
    meta = (*flags, packed, None, None, None)  # the launch metadata, no launch hooks
    # A kernel with TMA descriptor arguments: past Triton's descriptor wrapper too, encoding once per address.
    spliced = splicer(target) if target is not run else None
    splice = None
    if spliced is not None:
        target, splice = spliced

    def launch(*args) -> None:
        if _hooked(hooks.launch_enter_hook) or _hooked(hooks.launch_exit_hook):
            runner(*args)
            return
        target(g0, g1, g2, raw_stream(device), function, *meta, *(args if splice is None else splice(args)))

    return launch


#: A launcher class -> whether its ``__call__`` only passes its arguments on (probed once per class).
_BARE_CLASSES: dict[type, bool] = {}


def _bare_launch(launcher):
    """``(c_launch, flags)`` when ``launcher(gx, gy, gz, stream, function, *rest)`` (Triton's Python
    launcher of one compiled kernel) does nothing but call ``launcher.launch(gx, gy, gz, stream,
    function, *flags, *rest)`` (no scratch memory to allocate), else None.

    Triton 3.6's ``CudaLauncher.__call__`` allocates global and profile scratch when the kernel
    needs them and passes the cooperative-grid and PDL flags; a kernel that needs neither makes
    that a pure pass-through, about a microsecond of Python per launch. Rather than trust a
    version number, the launcher's class is probed once: its real ``__call__`` is run on a copy
    whose C entry records what it receives, and the shortcut is taken only if that is exactly
    ``(grid, stream, function, *flags, *rest)`` with ``flags = (cooperative, pdl, None, None)``.
    """
    c_launch = getattr(launcher, "launch", None)
    flags = (getattr(launcher, "launch_cooperative_grid", None), getattr(launcher, "launch_pdl", None), None, None)
    if c_launch is None or flags[0] is None or flags[1] is None:
        return None
    if getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1):
        return None  # the launcher allocates scratch per launch: its own path
    cls = type(launcher)
    if cls not in _BARE_CLASSES:
        _BARE_CLASSES[cls] = _passes_through(launcher, flags)
    return (c_launch, flags) if _BARE_CLASSES[cls] else None


def _passes_through(launcher, flags: tuple) -> bool:
    """Whether ``launcher``'s ``__call__`` hands ``launch`` exactly its arguments plus ``flags``."""
    seen: list = []
    probe = shallow_copy(launcher)
    probe.launch = lambda *args: seen.append(args)
    rest = ("packed", "meta", "enter", "exit", 11, 22)
    try:
        type(launcher).__call__(probe, 1, 2, 3, 4, 5, *rest)
    except Exception:  # noqa: BLE001 (any surprise: keep Triton's own path)
        return False
    return seen == [(1, 2, 3, 4, 5, *flags, *rest)]


def prepare(kernel, grid: tuple[int, ...], args: tuple, constexprs: dict, **options) -> PreparedLaunch:
    """Launch ``kernel[grid](*args, **constexprs, **options)`` now and return a :class:`PreparedLaunch`
    that launches the same compiled kernel again with new positional arguments.

    Example::

        again = prepare(kernels.rmsnorm_kernel, (rows,), (x, out, hidden), {"BLOCK": 1024}, num_warps=4)
        again(x, torch.empty_like(x), hidden)
    """
    return PreparedLaunch(kernel, grid, args, constexprs, options)


def by_address(value):
    """A launch argument as a recording keeps it: a tensor by its address, a descriptor as its layout at
    its base's address (:class:`~trident.kernels.descriptors.Rebased`, encoded once per address by the
    launch); anything else as it is.

    Example::

        values = [by_address(a) for a in args]   # holds no tensor
    """
    if isinstance(value, torch.Tensor):
        return value.data_ptr()
    if isinstance(value, TensorDescriptor) and isinstance(value.base, torch.Tensor):
        layout = dataclasses.replace(value, base=Address(value.base.data_ptr(), value.base.dtype))
        return rebased(layout, value.base.data_ptr())
    return value
