"""trident: multi-GPU programming in Triton on NVIDIA GPUs, with a CPU simulator.

Host API::

    ctx = trident.init(heap_size=1 << 30)        # one process per rank (torchrun, `trident run`, spawn)
    x = ctx.zeros(1024, dtype=torch.float32)      # symmetric: same offset on every rank
    ctx.barrier()

Device API (inside ``@triton.jit`` kernels), every call ``(..., rank, peer, heap_bases)``::

    v = trident.load(x_ptr + offs, rank, peer, heap_bases, mask=mask)
    trident.store(y_ptr + offs, v, rank, peer, heap_bases, mask=mask)
    trident.signal(flag_ptr, 1, rank, peer, heap_bases)
    trident.wait(flag_ptr, 1, rank, rank, heap_bases)

Import trident before defining kernels: on a machine without a GPU it switches Triton to its
CPU interpreter (the simulator), which must happen before any ``@triton.jit``.
"""

# torch_ops and dist_backend register nothing on import: init() registers them (see below).
from . import ccl, config, device, dist_backend, layout, platform, torch_ops, trace

# The device API (trident.load, trident.atomic_add, ...): what trident.device.__all__ lists, listed there only.
from .device import *  # noqa: F403
from .errors import (
    BackendUnavailableError,
    CapacityError,
    ContextClosedError,
    ContextRefusedError,
    DeviceError,
    DivergenceError,
    HeapExhaustedError,
    NotSymmetricError,
    RankTimeoutError,
    TopologyError,
    TridentError,
)
from .runtime import context as _context
from .runtime.context import Context
from .runtime.launch import SpawnError, spawn

__version__ = "0.1.0"


def init(heap_size: int = _context.DEFAULT_HEAP_SIZE, backend: str | None = None, *,
         dist_groups: int = dist_backend.INIT_SLOTS, **kwargs) -> Context:
    """``trident.runtime.context.init`` (its arguments: ``timeout``, ``wait_timeout``, ...), with
    trident's integrations with torch: registers ``torch.ops.trident.*`` and the torch.distributed
    backend "trident" (on the first call; importing trident registers nothing), and keeps
    ``dist_groups`` heap slots at the top of the heap for ``dist.new_group(ranks, backend="trident")``,
    each of ``heap_size / 64`` bytes (0 keeps none; :mod:`trident.dist_backend`).

    Example::

        ctx = trident.init(heap_size=1 << 28)
    """
    torch_ops.register()
    dist_backend.register()
    if isinstance(heap_size, int) and not isinstance(heap_size, bool):  # else the runtime says what is wrong
        kept = dist_backend.init_bytes(layout.align_up(heap_size), dist_groups)  # the heap init makes
        kwargs["reserve"] = {dist_backend.NAME: kept, **kwargs.get("reserve", {})}
    return _context.init(heap_size, backend, **kwargs)


init.__doc__ = (init.__doc__ or "") + "\n" + (_context.init.__doc__ or "")

__all__ = [
    "init", "Context", "spawn", "config", "platform", "ccl", "trace", "torch_ops", "dist_backend",
    *device.__all__,
    "TridentError", "BackendUnavailableError", "CapacityError", "ContextClosedError", "DeviceError", "DivergenceError",
    "ContextRefusedError", "HeapExhaustedError", "NotSymmetricError", "RankTimeoutError", "SpawnError", "TopologyError",
]


if platform.SIMULATOR:
    from .backends import interpreter_fixups

    interpreter_fixups.apply()  # before any kernel runs in the interpreter, with or without a context


def __getattr__(name):
    # trident.ops (GEMM + communication) and trident.testing (the multiprocess test harness) are
    # imported on first use: `import trident` stays fast, and a problem inside them cannot break it.
    if name in ("ops", "testing"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'trident' has no attribute {name!r}")
