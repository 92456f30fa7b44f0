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

import importlib
from typing import TYPE_CHECKING

# The backend is chosen now, before any @triton.jit (trident/config.py); without a GPU, torch-free.
from . import config as config
from .errors import BackendUnavailableError as BackendUnavailableError
from .errors import CapacityError as CapacityError
from .errors import ContextClosedError as ContextClosedError
from .errors import ContextRefusedError as ContextRefusedError
from .errors import DeviceError as DeviceError
from .errors import DivergenceError as DivergenceError
from .errors import HeapExhaustedError as HeapExhaustedError
from .errors import NotSymmetricError as NotSymmetricError
from .errors import RankTimeoutError as RankTimeoutError
from .errors import TopologyError as TopologyError
from .errors import TridentError as TridentError

__version__ = "0.1.0"

if TYPE_CHECKING:  # what the lazy names below resolve to, for type checkers and editors
    from . import ccl as ccl
    from . import device as device
    from . import dist_backend as dist_backend
    from . import layout as layout
    from . import platform as platform
    from . import torch_ops as torch_ops
    from . import trace as trace
    from .device import *  # noqa: F403
    from .initialize import init as init
    from .runtime.context import Context as Context
    from .runtime.launch import SpawnError as SpawnError
    from .runtime.launch import spawn as spawn

#: Names loaded on first use (PEP 562), so that ``import trident`` stays light: the ``trident run``
#: launcher, for one, never imports torch. ``trident.<submodule>`` and the device API
#: (``trident.load``, ...: ``trident.device.__all__``) load the same way.
_NAMES = {"init": "initialize", "Context": "runtime.context", "spawn": "runtime.launch",
          "SpawnError": "runtime.launch"}
_PUBLIC = ["init", "Context", "spawn", "config", "platform", "ccl", "trace", "torch_ops", "dist_backend",
           "TridentError", "BackendUnavailableError", "CapacityError", "ContextClosedError", "DeviceError",
           "DivergenceError", "ContextRefusedError", "HeapExhaustedError", "NotSymmetricError",
           "RankTimeoutError", "SpawnError", "TopologyError"]


def __getattr__(name: str):
    """``trident.<name>`` on first use: a submodule, a name of :data:`_NAMES`, or the device API."""
    if name in _NAMES:
        value = getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    elif name == "__all__":
        value = [*_PUBLIC, *importlib.import_module(f"{__name__}.device").__all__]
    elif name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    else:
        try:
            return importlib.import_module(f"{__name__}.{name}")  # binds trident.<name> itself
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise
        device = importlib.import_module(f"{__name__}.device")
        if name not in device.__all__:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(device, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__getattr__("__all__")})


from .backends import interpreter_fixups  # noqa: E402  (after the backend is chosen)

interpreter_fixups.apply_in_simulator()
