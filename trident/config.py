"""Import-time settings: which backend this process runs, and the debug switch.

Triton decides at *decoration* time whether a ``@triton.jit`` function is compiled for a GPU
or run by its CPU interpreter (``TRITON_INTERPRET=1``). The simulator needs the interpreter
for trident's own device functions *and* for the user's kernels, so the choice is made here,
when ``trident`` is imported, before any kernel is defined:

* ``TRIDENT_BACKEND=sim`` or ``cuda`` forces a backend;
* otherwise the simulator is chosen when no CUDA GPU is visible. Where no NVIDIA driver device
  exists at all (no ``/dev/nvidiactl``, no WSL ``/dev/dxg``) that is known without importing
  torch, so ``import trident`` (and the ``trident run`` launcher) stays light there.

Import ``trident`` before defining kernels (``import trident`` at the top of the module is
enough). ``trident.init(backend=...)`` must agree with the choice made here.
"""

from __future__ import annotations

import os

BACKENDS = ("cuda", "sim")


class ConfigError(ValueError):
    """An environment variable or setting has a value trident cannot use."""


def _env_flag(name: str) -> bool:
    value = os.environ.get(name, "0").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={value!r} is not a boolean; expected 0/1, true/false, yes/no or on/off")


#: Device files the NVIDIA driver makes (Linux; WSL 2): without any, CUDA cannot run in this process.
DRIVER_DEVICES = ("/dev/nvidiactl", "/dev/dxg")


def _choose_backend() -> str:
    requested = os.environ.get("TRIDENT_BACKEND", "").strip().lower()
    if requested and requested not in BACKENDS:
        raise ConfigError(f"TRIDENT_BACKEND={requested!r} is not a backend; expected one of {BACKENDS}")
    if requested:
        return requested
    if _env_flag("TRITON_INTERPRET"):
        return "sim"
    if not any(os.path.exists(node) for node in DRIVER_DEVICES):
        return "sim"  # no NVIDIA driver here: torch.cuda.is_available() could only say False
    import torch  # a GPU may be here: torch decides (a CPU-only torch build says no)

    return "cuda" if torch.cuda.is_available() else "sim"


#: The backend every context of this process uses ("cuda" or "sim").
BACKEND: str = _choose_backend()

#: Device debug mode: every translated access checks that it stays inside the heap.
DEBUG: bool = _env_flag("TRIDENT_DEBUG")

if BACKEND == "sim":
    # Must be in force before any @triton.jit runs, trident's own included.
    os.environ["TRITON_INTERPRET"] = "1"
elif _env_flag("TRITON_INTERPRET"):
    raise ConfigError(
        "TRIDENT_BACKEND=cuda but TRITON_INTERPRET=1: the cuda backend compiles kernels for the GPU; "
        "unset TRITON_INTERPRET, or use TRIDENT_BACKEND=sim for the CPU simulator"
    )

# NVLink multicast (NVLS) can take a shared host's GPUs out of service; trident never uses it, and
# NCCL groups that trident's processes create (for the baselines, or by the user) keep it off too.
# This is the one place that says how: NO_MULTICAST_ENV (the launcher, the benchmarks and the GPU
# suites pass it to their processes).
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
for _name, _value in NO_MULTICAST_ENV.items():
    os.environ.setdefault(_name, _value)
