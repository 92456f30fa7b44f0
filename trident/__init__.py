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

import functools

# torch_ops and dist_backend register nothing on import: init() registers them (see below).
from . import ccl, config, dist_backend, platform, torch_ops, trace
from .device import (
    arrival_ticket,
    atomic_add,
    atomic_and,
    atomic_cas,
    atomic_max,
    atomic_min,
    atomic_or,
    atomic_sub,
    atomic_xchg,
    atomic_xor,
    control_block,
    copy,
    get,
    load,
    put,
    signal,
    store,
    sync_ranks,
    translate,
    wait,
)
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


@functools.wraps(_context.init)
def init(*args, **kwargs) -> Context:
    # The integrations with torch are registered here, on the first init, never on import:
    # torch.ops.trident.* (custom ops) and the torch.distributed backend "trident". Both idempotent.
    torch_ops.register()
    dist_backend.register()
    return _context.init(*args, **kwargs)

__all__ = [
    "init", "Context", "spawn", "config", "platform", "ccl", "trace", "torch_ops", "dist_backend",
    "translate", "load", "store", "get", "put", "copy",
    "atomic_add", "atomic_sub", "atomic_xchg", "atomic_and", "atomic_or", "atomic_xor",
    "atomic_min", "atomic_max", "atomic_cas", "signal", "wait", "sync_ranks", "arrival_ticket", "control_block",
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
