"""Registration: a tensor made elsewhere, made reachable by peers (``ctx.register``).

``ctx.heap_allocations()`` puts tensors on the heap as torch makes them; some buffers cannot be
made there (a CUDA graph's inputs captured before ``trident.init``, a serving stack's own KV or
activation buffers). ``win = ctx.register(t)`` (collective: every rank passes its own tensor of the
same shape, strides and dtype) shares each rank's ``t`` with its peers and returns a
:class:`Window`. In a kernel, ``win.bases`` takes the place of ``heap_bases``, so the whole device
API reaches peers' copies of ``t`` as it reaches heap tensors::

    win = ctx.register(kv)                                   # once
    my_kernel[grid](kv, ctx.rank, ctx.world_size, win.bases)  # trident.load(kv + offs, rank, peer, bases)
    ctx.unregister(win)                                      # collective; before the tensor is dropped

How: each rank exports the memory holding its tensor (on a GPU the ``cudaMalloc`` allocation's CUDA
IPC handle, nothing moves; in the simulator the tensor's storage moves into a shared-memory file),
the ranks exchange the handles and each maps every peer's. ``win.bases[p]`` is this rank's heap base
plus the distance from its own tensor to peer ``p``'s, as this process maps it: pointer
translation (``ptr + bases[peer] - bases[rank]``) then lands on peer ``p``'s tensor, and
``bases[rank]`` is still the heap base, where waits and debug mode find the control block. Debug
mode's bounds check accepts each window's bytes as it accepts the heap's.

Costs and limits. Registering is a host exchange through the store and one mapping per peer (about
a millisecond; once per buffer); accesses then cost what heap accesses do. A window holds its tensor
(its memory is not reused) until ``ctx.unregister`` or ``ctx.close()``. trident's collectives and
fused ops treat a registered tensor as a plain one (staged): a window is for your own kernels.
Prefer ``ctx.heap_allocations()`` wherever the tensor can be made inside it: no exchange per
buffer, and trident's own calls use its tensors in place.
"""

from __future__ import annotations

import itertools

import torch

from .. import layout
from ..errors import ContextClosedError, DivergenceError, TopologyError, TridentError

_tags = itertools.count()


class Window:
    """A tensor registered with ``ctx.register``: this rank's ``tensor`` and where every rank's copy lies.

    Attributes:
        tensor: this rank's registered tensor.
        bases: int64 tensor of ``world_size`` words on the context's device: pass it where the device
            API takes ``heap_bases`` to reach peers' copies of ``tensor``.
    """

    def __init__(self, ctx, tensor: torch.Tensor, addresses: list[int], keepalive: list):
        self.tensor = tensor
        self._ctx, self._addresses, self._keepalive = ctx, addresses, keepalive
        heap_base = int(ctx.heap_bases[ctx.rank].item())
        mine = addresses[ctx.rank]
        self.bases: torch.Tensor | None = torch.tensor([heap_base + a - mine for a in addresses], dtype=torch.int64,
                                                       device=ctx.device)
        span = layout.span_bytes(tensor.shape, tensor.stride(), tensor.element_size())
        self.range = (mine - heap_base, mine - heap_base + span)  # bytes from the heap base

    @property
    def registered(self) -> bool:
        """Whether the window is still registered (not unregistered, its context open)."""
        return self.bases is not None

    def peer(self, peer: int) -> torch.Tensor:
        """Rank ``peer``'s registered tensor as this process maps it (host access, as ``ctx.peer_view``).

        Example::

            ctx.barrier()
            left = win.peer((ctx.rank - 1) % ctx.world_size).clone()
        """
        if not self.registered:
            raise ContextClosedError("this window was unregistered (ctx.unregister or ctx.close)")
        if not 0 <= peer < len(self._addresses):
            raise ValueError(f"peer={peer} is not a rank of this job (world size {len(self._addresses)})")
        t = self.tensor
        if peer == self._ctx.rank:
            return t
        mapping = self._keepalive[peer]  # the simulator's is a tensor; a GPU's exposes __cuda_array_interface__
        memory = mapping if self._ctx.platform.simulator else torch.as_tensor(mapping)
        start = (self._addresses[peer] - memory.data_ptr()) // t.element_size()
        # On the device the mapping is on (a peer's memory may sit on another GPU).
        return torch.empty(0, dtype=t.dtype, device=memory.device).set_(memory.untyped_storage(), start, t.shape,
                                                                        t.stride())

    def release(self) -> None:
        """Drop the mappings and the tensor (what ``ctx.unregister`` and ``ctx.close()`` end with)."""
        self.bases, self._keepalive = None, []

    resource_ended = release  # ctx.close() drops the context's resources, its windows among them


def register(ctx, tensor: torch.Tensor, backend, control_words: torch.Tensor) -> Window:
    """Share ``tensor`` (made elsewhere) with every peer; collective. See the module doc.

    ``backend`` is the context's heap backend, ``control_words`` its control block (int64 words).

    Raises:
        TypeError / ValueError: not a tensor on the context's device, on the heap already, empty, or
            not 256-byte aligned.
        DivergenceError: ranks passed different shapes, strides or dtypes.
        TopologyError: the job spans nodes (peers in other nodes cannot map this memory).
    """
    where = f"rank {ctx.rank}: ctx.register"
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{where}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device != ctx.device:
        raise ValueError(f"{where}: the tensor is on {tensor.device}; expected the context's device {ctx.device}")
    if ctx.is_symmetric(tensor):
        raise ValueError(f"{where}: the tensor is on the symmetric heap already: peers reach it with ctx.heap_bases")
    if tensor.numel() == 0:
        raise ValueError(f"{where}: the tensor is empty: there is nothing to share")
    if ctx.spans_nodes:
        raise TopologyError(f"{where}: the job spans nodes ({ctx.topology.describe()}); peers in another node "
                            f"cannot map this memory")
    if ctx.platform.simulator:
        misaligned = tensor.storage_offset() * tensor.element_size() % layout.BASE_ALIGN
    else:
        misaligned = tensor.data_ptr() % layout.BASE_ALIGN
    if misaligned:
        raise ValueError(f"{where}: the tensor starts {misaligned} bytes past a {layout.BASE_ALIGN}-byte boundary; "
                         f"register a tensor that starts on one (a fresh allocation, or a view at such an offset)")
    windows = ctx.resources.windows
    if len(windows) >= layout.MAX_WINDOWS:
        raise TridentError(f"{where}: {layout.MAX_WINDOWS} windows are registered already; ctx.unregister some")
    facts = (tuple(tensor.shape), tuple(tensor.stride()), str(tensor.dtype))
    handle, offset, nbytes = backend.export_tensor(tensor, f"w{next(_tags)}")
    shared = ctx.all_gather_object("ctx.register", (facts, handle, offset, nbytes))
    if len({f for f, *_ in shared}) > 1:
        backend.exported_opened(handle)
        listing = "; ".join(f"rank {r}: shape {f[0]}, strides {f[1]}, {f[2]}" for r, (f, *_) in enumerate(shared))
        raise DivergenceError(f"{where}: every rank must register a tensor of the same shape, strides and dtype: "
                              f"{listing}")
    addresses, keepalive = [], []
    for peer, (_, peer_handle, peer_offset, peer_nbytes) in enumerate(shared):
        if peer == ctx.rank:
            addresses.append(tensor.data_ptr())
            keepalive.append(tensor)
            continue
        address, mapping = backend.open_exported(peer_handle, peer_nbytes)
        addresses.append(address + peer_offset)
        keepalive.append(mapping)
    ctx.all_gather_object("ctx.register (mapped)", True)  # every peer mapped this rank's memory
    backend.exported_opened(handle)
    window = Window(ctx, tensor, addresses, keepalive)
    windows.append(window)
    _write_ranges(control_words, windows)
    return window


def unregister(ctx, window: Window, backend, control_words: torch.Tensor) -> None:
    """End a registration; collective. Waits for this rank's device work first, and for every rank,
    so that no kernel still reaches a peer's tensor through the window.

    Raises:
        TypeError: ``window`` is not a :class:`Window`.
        ValueError: it was unregistered already, or belongs to another context.
    """
    if not isinstance(window, Window):
        raise TypeError(f"rank {ctx.rank}: ctx.unregister expects what ctx.register returned, "
                        f"got {type(window).__name__}")
    windows = ctx.resources.windows
    if window not in windows:
        raise ValueError(f"rank {ctx.rank}: ctx.unregister: this window is not registered with this context "
                         f"(unregistered already, or registered with another)")
    backend.synchronize()
    ctx.all_gather_object("ctx.unregister", True)  # no rank's kernel still uses it
    windows.remove(window)
    _write_ranges(control_words, windows)
    window.release()


def _write_ranges(words: torch.Tensor, windows: list[Window]) -> None:
    """The windows' count and byte ranges into the control block (one copy), for debug mode's bounds check."""
    table = [len(windows)] + [bound for w in windows for bound in w.range]
    words[layout.WINDOW_COUNT:layout.WINDOW_COUNT + len(table)] = torch.tensor(table, dtype=torch.int64)
