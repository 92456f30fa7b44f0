"""The CUDA backend: heaps from ``cudaMalloc``, shared between processes with CUDA IPC.

Each rank allocates its heap on its GPU, exports an IPC handle (64 bytes), and opens every
peer's handle with ``cudaIpcMemLazyEnablePeerAccess``, which enables peer access where the
peer's heap sits on another GPU. Ranks may share one GPU (each process has its own context;
IPC works between them), which is how a one-GPU machine runs multi-rank tests.
Runtime calls go through NVIDIA's ``cuda-bindings``.
"""

from __future__ import annotations

import os
import weakref

import torch

from ..errors import BackendUnavailableError, ContextRefusedError, TridentError
from .base import HeapBackend


def cuda_runtime():
    """``cuda.bindings.runtime`` (NVIDIA's CUDA runtime bindings), or a clear error where it is missing.

    Example::

        checked(cuda_runtime().cudaSetDevice(0), "cudaSetDevice(0)")
    """
    try:
        from cuda.bindings import runtime
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise BackendUnavailableError(
            "the cuda backend needs NVIDIA's cuda-bindings package (pip install cuda-bindings)"
        ) from exc
    return runtime


def checked(result, what: str):
    """Unpack a cuda-bindings result tuple (error code first), raising a TridentError naming ``what``
    on an error code; returns the values after the code (one value as itself).

    Example::

        ptr = checked(cuda_runtime().cudaMalloc(1024), "cudaMalloc(1024)")
    """
    cudart = cuda_runtime()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        _, text = cudart.cudaGetErrorString(err)
        raise TridentError(f"{what} failed: {err.name} ({text.decode() if isinstance(text, bytes) else text})")
    return values[0] if len(values) == 1 else values


def refused_context(exc: BaseException, rank: int, index: int) -> ContextRefusedError | None:
    """The clear error for CUDA refusing this process a context ("busy or unavailable"), or None
    when ``exc`` is another error. Under MPS that means the daemon admits no more clients for now."""
    if "busy or unavailable" not in str(exc):
        return None
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    why = (f"the MPS daemon at {pipe} admits a limited number of client processes per GPU (see NVIDIA's MPS "
           "documentation) and may be serving that many: start the rank again once other clients have "
           "ended, or run fewer processes on the GPU at once" if pipe else
           "another process may hold the GPU in an exclusive compute mode")
    return ContextRefusedError(f"rank {rank}: CUDA refused a context on GPU {index} (busy or unavailable): {why}")


class _DeviceMemory:
    """Device memory exposed to torch (``__cuda_array_interface__``) and released when unused.

    torch keeps this object alive as long as any tensor views the memory, so a tensor that
    outlives ``ctx.close()`` stays valid; the memory goes when the last view goes.
    """

    def __init__(self, ptr: int, nbytes: int, release):
        self.ptr, self.nbytes = ptr, nbytes
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3, "strides": None,
        }
        weakref.finalize(self, release, ptr)


def _free(ptr: int) -> None:
    try:
        cuda_runtime().cudaFree(ptr)
    except Exception:  # interpreter shutdown: the driver may already be gone
        pass


def _close_ipc(ptr: int) -> None:
    try:
        cuda_runtime().cudaIpcCloseMemHandle(ptr)
    except Exception:
        pass


#: Peers' exported allocations mapped in this process, by handle; an entry goes with its last user.
_opened: weakref.WeakValueDictionary[bytes, _DeviceMemory] = weakref.WeakValueDictionary()


class CudaBackend(HeapBackend):
    """Heaps in GPU memory; rank ``r`` uses GPU ``local_rank % device_count``."""

    name = "cuda"

    @staticmethod
    def require_gpu() -> None:
        """Raise a clear error when torch sees no CUDA GPU."""
        if not torch.cuda.is_available():
            raise BackendUnavailableError(
                "backend 'cuda' was requested but torch sees no CUDA GPU; use TRIDENT_BACKEND=sim "
                "(or leave TRIDENT_BACKEND unset) to run on the CPU simulator"
            )

    def __init__(self, rank: int, local_rank: int):
        self.require_gpu()
        self.index = local_rank % torch.cuda.device_count()
        self.device = torch.device("cuda", self.index)
        try:
            torch.cuda.set_device(self.device)
        except RuntimeError as exc:
            refused = refused_context(exc, rank, self.index)
            if refused is None:
                raise
            raise refused from exc
        checked(cuda_runtime().cudaSetDevice(self.index), f"cudaSetDevice({self.index})")
        self.rank = rank
        self.heap_size = 0
        self._local: _DeviceMemory | None = None

    def create(self, heap_size: int) -> bytes:
        cudart = cuda_runtime()
        free, total = torch.cuda.mem_get_info(self.device)
        if heap_size > free:
            raise ValueError(
                f"heap_size={heap_size} bytes does not fit on GPU {self.index}: {free} of {total} bytes are free"
            )
        ptr = checked(cudart.cudaMalloc(heap_size), f"cudaMalloc({heap_size})")
        self._local = _DeviceMemory(int(ptr), heap_size, _free)
        self.heap_size = heap_size
        handle = checked(cudart.cudaIpcGetMemHandle(ptr), "cudaIpcGetMemHandle")
        return bytes(handle.reserved)

    def open_peers(self, handles: list[bytes | None]) -> list[torch.Tensor | None]:
        cudart = cuda_runtime()
        views: list[torch.Tensor | None] = []
        for peer, raw in enumerate(handles):
            if raw is None:  # a peer in another node: never mapped
                views.append(None)
                continue
            if peer == self.rank:
                memory = self._local
            else:
                handle = cudart.cudaIpcMemHandle_t()
                handle.reserved = raw
                ptr = checked(cudart.cudaIpcOpenMemHandle(handle, cudart.cudaIpcMemLazyEnablePeerAccess),
                             f"cudaIpcOpenMemHandle (heap of rank {peer})")
                memory = _DeviceMemory(int(ptr), self.heap_size, _close_ipc)
            # No device= here: a peer's heap may sit on another GPU, and as_tensor would copy it.
            views.append(torch.as_tensor(memory))
        return views

    def abort_word(self, heap: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Pinned host memory mapped into the GPU's address space (UVA): kernels read it directly and
        the host writes it without a CUDA call, which a busy or wedged driver could stall."""
        word = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        address = checked(cuda_runtime().cudaHostGetDevicePointer(word.data_ptr(), 0), "cudaHostGetDevicePointer")
        return word, int(address)

    def close(self) -> None:
        self._local = None  # freed once no tensor views it

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def export_tensor(self, tensor: torch.Tensor, tag: str) -> tuple[bytes, int, int]:
        """The IPC handle of the ``cudaMalloc`` allocation holding ``tensor`` (torch's caching allocator
        hands out parts of larger allocations), and the tensor's place in it. Nothing moves."""
        from cuda.bindings import driver

        err, base, size = driver.cuMemGetAddressRange(tensor.data_ptr())
        if err != driver.CUresult.CUDA_SUCCESS:
            raise TridentError(f"rank {self.rank}: ctx.register: cuMemGetAddressRange failed ({err.name}): the "
                               f"tensor's memory is not a CUDA allocation this process made")
        try:
            handle = checked(cuda_runtime().cudaIpcGetMemHandle(int(base)), "cudaIpcGetMemHandle")
        except TridentError as exc:
            raise TridentError(
                f"rank {self.rank}: ctx.register needs memory from cudaMalloc (torch's default caching allocator); "
                f"this tensor's cannot be shared with CUDA IPC ({exc}). With expandable segments "
                f"(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) or another allocator, make the tensor "
                f"inside ctx.heap_allocations() instead") from None
        return bytes(handle.reserved), tensor.data_ptr() - int(base), int(size)

    def open_exported(self, handle: bytes, nbytes: int) -> tuple[int, object]:
        memory = _opened.get(handle)  # CUDA maps an allocation once per process: share the mapping
        if memory is None:
            ipc = cuda_runtime().cudaIpcMemHandle_t()
            ipc.reserved = handle
            ptr = checked(cuda_runtime().cudaIpcOpenMemHandle(ipc, cuda_runtime().cudaIpcMemLazyEnablePeerAccess),
                         "cudaIpcOpenMemHandle (a registered tensor of a peer)")
            memory = _DeviceMemory(int(ptr), nbytes, _close_ipc)
            _opened[handle] = memory
        return memory.ptr, memory
