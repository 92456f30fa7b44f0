"""The one place trident uses torch's private API (names with a leading underscore).

torch has no public name for these things. Every other module calls the functions here, so
that a torch release that moves one breaks one small function, found by one grep, and
``tests/test_architecture.py`` allows private reads of another package only here and in
:mod:`trident.backends.interpreter_fixups` (Triton's, for the simulator).

Each use says why it is needed. Versions: torch >= 2.11 (``pyproject.toml``). The first four ran on the
GPU machine's torch 2.11.0+cu130 (the one-rank runs behind docs/figures.md: ``trident.init``, a
``backend="trident"`` group with its NCCL fallback, the benchmark harness), and are present in
torch 2.13 (the development machine and CI, a CPU build: there ``ProcessGroupNCCL`` is missing
and ``_timeout`` was checked on its base class, ``Backend.Options``). ``custom_cuda_allocator`` has
not run on a GPU yet (written 2026-12-04 while no GPU was lent; the GPU suite's heap-pool tests run it).
``layout_guard`` ran on the GPU machine's torch 2.11 on 2026-12-07 (the call-cache, custom-op, dist
backend and CUDA-graph tests) and on torch 2.13 here.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist


def default_store() -> dist.Store:
    """The store of torch.distributed's initialized default group.

    Why: ``trident.init`` joins a job that torchrun or the user already set up with
    ``dist.init_process_group``, and its rendezvous (heap handles, barriers, the watchdog's
    heartbeats) runs on that job's store; torch exposes the store only as
    ``torch.distributed.distributed_c10d._get_default_store()`` (a plain function of
    ``distributed_c10d.py``, the same in 2.11 and 2.13).
    """
    return dist.distributed_c10d._get_default_store()


def backend_registered(name: str) -> bool:
    """Whether ``dist.Backend.register_backend(name, ...)`` has registered a creator for ``name``.

    Why: registering twice raises, and ``trident.init`` may run again in one process. torch keeps
    the creators in the class attribute ``dist.Backend._plugins`` (a dict keyed by the upper-case
    name, filled last by ``register_backend``; the same in 2.11 and 2.13). The public
    ``Backend.backend_list`` is filled before the creator, so a registration that failed halfway
    would be taken for a done one.
    """
    return name.upper() in dist.Backend._plugins


def set_options_timeout(options, timeout: datetime.timedelta) -> None:
    """Set the timeout of a backend's options (``dist.ProcessGroupNCCL.Options()``).

    Why: ``ProcessGroupNCCL(store, rank, size, options)`` takes its timeout only from its options,
    whose binding names the field ``_timeout`` (``Backend.Options``, a read-write pybind field,
    in 2.11 and 2.13; CPU builds have no ``ProcessGroupNCCL``, but the field is on the base
    ``Backend.Options`` there too).
    """
    options._timeout = timeout


def cuda_sleep(cycles: int) -> None:
    """Keep the current CUDA stream busy for about ``cycles`` GPU clock cycles.

    Why: ``trident.bench.harness.measure`` enqueues it before each timed call, so the host queues
    the call while the GPU sleeps and CUDA events time the device alone. torch's only such kernel
    is ``torch.cuda._sleep`` (in 2.11 and 2.13).
    """
    torch.cuda._sleep(cycles)


def custom_cuda_allocator(alloc_address: int, free_address: int):
    """torch's allocator object around two C functions, ``void* alloc(size_t size, int device,
    cudaStream_t stream)`` and ``void free(void* ptr, size_t size, int device, cudaStream_t stream)``,
    given by address; ``torch.cuda.MemPool(allocator)`` takes it.

    Why: ``ctx.heap_allocations()`` makes a memory pool whose segments come from the symmetric heap.
    torch's public ``CUDAPluggableAllocator`` builds this object only from a shared library's
    symbols (``ctypes.CDLL(path)``), calling ``torch._C._cuda_customAllocator(alloc, free)`` with
    their addresses; trident's functions are ctypes callbacks, with addresses but no library (the
    same binding in 2.11 and 2.13; CUDA builds only).
    """
    return torch._C._cuda_customAllocator(alloc_address, free_address)


def raw_stream_function():
    """The C function ``f(device_index) -> int``: the handle (``cudaStream_t``) of that CUDA device's
    current stream.

    Why: a launch or copy on the current stream needs only its handle, and
    ``torch.cuda.current_stream()`` builds a Python Stream object per call, which cost a third of
    a small replayed copy's host time (host_anatomy.py, H100, 2026-12-06). torch's C entry is
    ``torch._C._cuda_getCurrentRawStream`` (CUDA builds of 2.11 and 2.13; CPU builds lack it, and
    nothing calls this there).

    Example::

        raw = raw_stream_function()
        handle = raw(torch.cuda.current_device())
    """
    return torch._C._cuda_getCurrentRawStream


def layout_guard(tensors):
    """A C check of ``tensors``' layouts: ``guard(*others)`` is True only when ``others`` are tensors
    of the same Python type, dtype, device, sizes, strides, dispatch keys and ``requires_grad``
    (in the same grad mode); None where torch offers no such check (then callers compute keys).

    Why: a repeated small call looks its recording up by its operands' layouts, and reading them
    in Python (``shape``, ``stride()``, ``dtype``, ``device``: about 1.3 us per tensor on a CPU
    machine, 2026-12-07) was the largest part of a replayed collective's host time. torch's own
    compiled code checks the same facts in C for every call of a compiled graph: ``TensorGuards`` of
    ``torch._C._dynamo.guards`` (sizes and strides given as concrete values: none dynamic; the same
    constructor in 2.11 and 2.13), 0.2 us for two tensors.

    Example::

        guard = layout_guard((x, out))
        guard(x2, out2)   # True: x2 and out2 have x's and out's layouts
    """
    try:
        from torch._C._dynamo.guards import TensorGuards

        guards = TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                              dynamic_dims_strides=[list(t.stride()) for t in tensors])
        return guards.check
    except Exception:  # noqa: BLE001 (a torch without it, or a tensor it cannot check: no guard)
        return None
