"""The CPU simulator backend: heaps in shared-memory files, kernels in Triton's interpreter.

Each rank's heap is a file in ``/dev/shm`` (mode 0600, its name unique to the job) that every
rank maps with ``MAP_SHARED``. Triton's interpreter reads and writes raw addresses, so a
translated pointer into a peer's mapping reaches the peer's memory, and its atomics are real
atomics across processes. The files are unlinked as soon as every rank has mapped them: the
memory lives until the last mapping goes, and nothing remains on disk even if a rank is killed.
"""

from __future__ import annotations

import atexit
import os
import re

import torch

from .. import layout
from ..errors import BackendUnavailableError
from .base import HeapBackend

SHM_DIR = "/dev/shm"
_NAME = re.compile(r"^trident-u(\d+)-p(\d+)-[0-9a-f]+-r\d+$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_files() -> list[str]:
    """Remove heap files left by this user's processes that no longer exist (after a SIGKILL)."""
    removed = []
    for name in os.listdir(SHM_DIR) if os.path.isdir(SHM_DIR) else []:
        match = _NAME.match(name)
        if match and int(match.group(1)) == os.getuid() and not _pid_alive(int(match.group(2))):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class SimBackend(HeapBackend):
    """Heaps in ``/dev/shm`` files; the device is the CPU."""

    name = "sim"

    def __init__(self, rank: int, job_id: str):
        if not os.path.isdir(SHM_DIR):
            raise BackendUnavailableError(f"the simulator needs {SHM_DIR} (shared memory); it does not exist")
        self.rank = rank
        self.device = torch.device("cpu")
        self.path = os.path.join(SHM_DIR, f"trident-u{os.getuid()}-p{os.getpid()}-{job_id}-r{rank}")
        self.heap_size = 0
        self._unlinked = False
        atexit.register(self._unlink)

    def create(self, heap_size: int) -> bytes:
        sweep_stale_files()
        stat = os.statvfs(SHM_DIR)
        capacity = stat.f_blocks * stat.f_frsize
        if heap_size > capacity:
            raise ValueError(f"heap_size={heap_size} bytes is larger than {SHM_DIR} ({capacity} bytes)")
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, heap_size)  # sparse: pages are only backed once touched
        finally:
            os.close(fd)
        self.heap_size = heap_size
        return self.path.encode()

    def open_peers(self, handles: list[bytes | None]) -> list[torch.Tensor | None]:
        return [None if h is None else torch.from_file(h.decode(), shared=True, size=self.heap_size, dtype=torch.uint8)
                for h in handles]

    def abort_word(self, heap: torch.Tensor) -> tuple[torch.Tensor, int]:
        """A word of the control block: kernels and the host share the CPU's memory."""
        word = heap[:layout.CONTROL_BYTES].view(torch.int64)[layout.ABORT:layout.ABORT + 1]
        return word, word.data_ptr()

    def after_exchange(self) -> None:
        self._unlink()

    def _unlink(self) -> None:
        if not self._unlinked:
            self._unlinked = True
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        self._unlink()
        atexit.unregister(self._unlink)

    def synchronize(self) -> None:
        pass  # the interpreter runs kernels to completion before the launch returns

    def export_tensor(self, tensor: torch.Tensor, tag: str) -> tuple[bytes, int, int]:
        """Move ``tensor``'s storage into a new shared-memory file (peers map it by name) and point the
        tensor at it (``set_``): the tensor keeps its values, shape and strides. Other views of its old
        storage keep the old, private memory."""
        storage = tensor.untyped_storage()
        nbytes = max(storage.nbytes(), 1)
        path = f"{self.path}-{tag}"
        shared = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
        atexit.register(_unlink_quietly, path)  # gone even if the registration never completes
        shared[:storage.nbytes()].copy_(torch.empty(0, dtype=torch.uint8).set_(storage))
        with torch.no_grad():
            tensor.set_(shared.untyped_storage(), tensor.storage_offset(), tensor.shape, tensor.stride())
        return path.encode(), int(tensor.storage_offset()) * tensor.element_size(), nbytes

    def open_exported(self, handle: bytes, nbytes: int) -> tuple[int, object]:
        view = torch.from_file(handle.decode(), shared=True, size=nbytes, dtype=torch.uint8)
        return view.data_ptr(), view

    def exported_opened(self, handle: bytes) -> None:
        _unlink_quietly(handle.decode())  # every peer maps it: the memory lives on, no file remains
