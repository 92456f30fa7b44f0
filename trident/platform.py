"""What machine this process runs on: the one owner of every hardware and backend fact.

Every other module asks a :class:`Platform` (``ctx.platform``, or :func:`for_device` where no
context exists) instead of asking torch, ``trident.config`` or a tensor's device type:

* which backend runs kernels (``backend``, ``simulator``);
* how many programs can run at once (``sm_count``, ``program_limit``);
* whether ranks share GPUs, so that NCCL (and every torch.distributed baseline) cannot run
  (``ranks_share_gpus``, ``nccl_usable``, ``performance_figure``);
* the defaults that follow from those: ``comm_programs(gpu_default)``.

``tests/test_architecture.py`` keeps other modules from deciding these questions themselves.

Example::

    ctx = trident.init()
    if ctx.platform.simulator:
        print("kernels run in Triton's interpreter, programs one after another")
    grid = (min(tiles, ctx.platform.program_limit),)
"""

from __future__ import annotations

import dataclasses
import functools
import socket

import torch

from . import config

#: The backend every context of this process uses, fixed when trident is imported (``trident.config``
#: reads ``TRIDENT_BACKEND``): Triton decides at kernel-definition time between GPU and interpreter.
PROCESS_BACKEND: str = config.BACKEND
#: Whether this process runs kernels in the CPU simulator (Triton's interpreter).
SIMULATOR: bool = PROCESS_BACKEND == "sim"

#: Stand-in SM count of the simulator: its programs run one after another on the CPU, so a few
#: keep persistent kernels' loops exercised without making the interpreter slow.
SIM_SM_COUNT = 4
#: Communication programs of the fused ops in the simulator (one after another: two suffice to
#: exercise the split between roles).
SIM_COMM_PROGRAMS = 2


@dataclasses.dataclass(frozen=True)
class Platform:
    """Facts about the device one rank runs on, fixed for the life of a context.

    Attributes:
        backend: ``"cuda"`` or ``"sim"`` (the CPU simulator).
        device: where heap tensors and kernels live (``cuda:N`` or ``cpu``).
        sm_count: multiprocessors of the GPU (:data:`SIM_SM_COUNT` in the simulator).
        gpu_name: the GPU's name (``"cpu (simulator)"`` in the simulator).
        gpus_visible: CUDA GPUs this process sees (0 in the simulator).
        world_size: ranks of the job (1 for a platform made without a context).
    """

    backend: str
    device: torch.device
    sm_count: int
    gpu_name: str
    gpus_visible: int
    world_size: int = 1

    @property
    def simulator(self) -> bool:
        """Whether kernels run in Triton's CPU interpreter (programs one after another)."""
        return self.backend == "sim"

    @property
    def program_limit(self) -> int:
        """Most programs a persistent kernel should launch: one per SM this process may use (under MPS
        with an SM share CUDA reports the share's SMs: 14 of 132 at 12 %, measured on the H200)."""
        return self.sm_count

    @property
    def ranks_share_gpus(self) -> bool:
        """Whether several ranks of this job run on one GPU (more ranks than visible GPUs)."""
        return self.backend == "cuda" and self.gpus_visible < self.world_size

    @property
    def nccl_usable(self) -> bool:
        """Whether NCCL can run for this world: a GPU per rank. The simulator has gloo, not NCCL."""
        return self.backend == "cuda" and not self.ranks_share_gpus

    @property
    def performance_figure(self) -> bool:
        """Whether timings here measure real hardware: a GPU per rank, not the simulator."""
        return self.nccl_usable

    @property
    def timing_device(self) -> torch.device:
        """Where benchmark timers run: the GPU (CUDA events), or the CPU (wall clock) in the simulator."""
        return self.device if self.backend == "cuda" else torch.device("cpu")

    def comm_programs(self, gpu_default: int) -> int:
        """Programs a fused op gives to communication when the caller gives none.

        On a GPU, ``gpu_default`` (the op's figure for a whole H200) but at most a quarter of the
        SMs this process may use, and at least 1: the GEMM keeps most of them however few there
        are. ``sm_count`` is already that share under MPS (CUDA reports the limited count), so an
        H200's 132 SMs keep the defaults (16 of 132), while an eighth of it (14 SMs at 8 ranks)
        gives 3 instead of leaving the GEMM one program. :data:`SIM_COMM_PROGRAMS` in the simulator.

        Example::

            ctx.platform.comm_programs(16)   # 16 on a whole H200, 3 with 14 SMs, 2 in the simulator
        """
        if self.simulator:
            return SIM_COMM_PROGRAMS
        return max(1, min(gpu_default, self.sm_count // 4))

    @property
    def device_identity(self) -> str:
        """What names this GPU on this host (``host/uuid``; the host and ``cpu`` in the simulator):
        two ranks with the same identity share a GPU, which NCCL refuses to put in one group."""
        return _device_identity(self.device)

    def with_world(self, world_size: int) -> Platform:
        """The same device as seen by a job of ``world_size`` ranks."""
        return dataclasses.replace(self, world_size=world_size)


@functools.cache
def _for_device(device: torch.device) -> Platform:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return Platform("cuda", device, props.multi_processor_count, props.name, torch.cuda.device_count())
    if PROCESS_BACKEND == "cuda":
        raise ValueError(f"trident runs its kernels on the GPU in this process (backend 'cuda'); a tensor on "
                         f"{device} cannot be used. Move it to the GPU, or run with TRIDENT_BACKEND=sim.")
    return Platform("sim", torch.device("cpu"), SIM_SM_COUNT, "cpu (simulator)", 0)


@functools.cache
def _device_identity(device: torch.device) -> str:
    mine = str(torch.cuda.get_device_properties(device).uuid) if device.type == "cuda" else str(device)
    return f"{socket.gethostname()}/{mine}"


def for_device(device: torch.device | str, world_size: int = 1) -> Platform:
    """The :class:`Platform` of ``device`` (cached): for code that has tensors but no context.

    Example::

        sms = trident.platform.for_device(A.device).sm_count
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _for_device(device).with_world(world_size)


def gpu_available() -> bool:
    """Whether torch sees a CUDA GPU (the cuda backend's precondition)."""
    return torch.cuda.is_available()


def gpus_visible() -> int:
    """How many CUDA GPUs this process sees (0 without any)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
