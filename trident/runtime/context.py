"""The host runtime: :func:`init` and :class:`Context`, one rank's handle on the symmetric heap."""

from __future__ import annotations

import itertools
import pickle
import secrets
import warnings
import weakref

import torch

from .. import config, layout
from .. import platform as _platform
from ..calls.cache import CallCache
from ..errors import ContextClosedError, DeviceError, DivergenceError, RankTimeoutError
from ..faults import fault_error
from . import group_life, groups, pickling
from .allocator import SymmetricAllocator
from .control import ControlBlock
from .device_loss import naming_lost_peers
from .heap import SymmetricHeapMixin
from .heap_exchange import create_and_exchange
from .nodes import Hierarchy, Topology
from .rendezvous import Rendezvous, join_process_group
from .resources import Resources, refuse_in_capture
from .timeouts import _seconds
from .watchdog import RankWatchdog

DEFAULT_HEAP_SIZE = 1 << 30
_context_ids = itertools.count()


def init(heap_size: int = DEFAULT_HEAP_SIZE, backend: str | None = None, *, timeout: float | None = None,
         wait_timeout: float | None = None, watchdog_interval: float | None = None,
         reserve: dict[str, int] | None = None) -> Context:
    """Create this rank's symmetric heap and map every peer's; collective over all ranks.

    Joins the initialized torch.distributed default group, or creates one from RANK,
    WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (as torchrun, ``trident run`` and
    :func:`trident.spawn` set them; with none set, a one-rank job).

    Args:
        heap_size: bytes per rank (rounded up to 256); the same on every rank.
        backend: ``"cuda"``, ``"sim"`` or None for the one chosen at import (see ``trident.config``).
        timeout: seconds a host-side wait (init, barrier, broadcast) waits for the other ranks
            before raising an error naming them (default ``TRIDENT_TIMEOUT`` or 30).
        wait_timeout: seconds a device-side ``trident.wait`` spins before giving up
            (default ``TRIDENT_WAIT_TIMEOUT`` or 30); changeable later via ``ctx.wait_timeout``.
        watchdog_interval: seconds between checks that every peer's process is still alive
            (default ``TRIDENT_WATCHDOG_INTERVAL`` or 0.5). A lost peer ends this rank's waits,
            host and device, with an error naming it.
        reserve: named byte counts kept at the top of the heap from init on, for integrations
            (``ctx.reserved_region(name)``); ``trident.init`` keeps the dist backend's here.

    Returns:
        The :class:`Context`.

    Example::

        ctx = trident.init(heap_size=1 << 28)
        x = ctx.zeros(1024)
        ctx.barrier()
    """
    if isinstance(heap_size, bool) or not isinstance(heap_size, int):
        raise TypeError(f"heap_size must be an int number of bytes, got {type(heap_size).__name__}")
    minimum = layout.CONTROL_BYTES + layout.ALLOC_ALIGN
    if heap_size < minimum:
        raise ValueError(f"heap_size={heap_size} is too small: the heap needs at least {minimum} bytes "
                         f"({layout.CONTROL_BYTES} of them for trident's control block)")
    heap_size = layout.align_up(heap_size)
    name = _platform.PROCESS_BACKEND if backend is None else str(backend).lower()
    if name not in config.BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {config.BACKENDS} or None")
    if name != _platform.PROCESS_BACKEND:
        raise config.ConfigError(
            f"backend {name!r} was requested, but this process imported trident for {_platform.PROCESS_BACKEND!r}: "
            f"Triton fixes at kernel-definition time whether kernels run on the GPU or in the CPU "
            f"interpreter. Set TRIDENT_BACKEND={name} before importing trident."
        )
    timeout = _seconds("timeout", timeout, "TRIDENT_TIMEOUT")
    wait_timeout = _seconds("wait_timeout", wait_timeout, "TRIDENT_WAIT_TIMEOUT")
    watchdog_interval = _seconds("watchdog_interval", watchdog_interval, "TRIDENT_WATCHDOG_INTERVAL", 0.5)
    if name == "cuda" and not _platform.gpu_available():  # before joining a group that would need NCCL
        from ..backends.cuda import CudaBackend

        CudaBackend.require_gpu()
    store, rank, world, local_rank = join_process_group(name, timeout)
    if world > layout.MAX_WORLD:
        raise ValueError(f"world size {world} is larger than trident supports ({layout.MAX_WORLD})")
    rendezvous = Rendezvous(store, f"trident/ctx{next(_context_ids)}/", rank, world, timeout)
    return Context(rendezvous, name, heap_size, local_rank, wait_timeout, watchdog_interval, reserve)


class Context(SymmetricHeapMixin):
    """One rank's symmetric heap, the mappings of its peers', and the host API around them.

    Made by :func:`trident.init`. Usable as a context manager (``close()`` on exit).

    Attributes:
        rank, world_size: this process's place in the job.
        device: where heap tensors live (``cuda:N`` or ``cpu`` for the simulator).
        backend: ``"cuda"`` or ``"sim"``.
        platform: the :class:`~trident.platform.Platform`: every machine fact (simulator or not,
            SMs, whether NCCL can run for this world) and the defaults that follow from them.
        heap_size: bytes per rank.
        heap_bases: int64 tensor on ``device``: every rank's heap base as mapped in this process.
            Pass it to kernels; the device API translates pointers with it.
        heap_bases_host: the same addresses as a tuple of ints. A peer in another node has 0 in both.
        topology: the :class:`~trident.runtime.nodes.Topology` (which ranks share a node); ``node``,
            ``local_rank`` (this rank's place in its node) and ``nodes`` (each node's ranks) come from it.
        group_name: the whole world's name, the same on every rank (``torch.ops.trident.*`` take it).
        watchdog_interval: seconds between the watchdog's looks at every peer's process.
    """

    def __init__(self, rendezvous: Rendezvous, backend: str, heap_size: int, local_rank: int,
                 wait_timeout: float, watchdog_interval: float, reserve: dict[str, int] | None = None):
        self._rendezvous = rendezvous
        self.rank, self.world_size = rendezvous.rank, rendezvous.world_size
        self.backend, self.heap_size = backend, heap_size
        self._closed = True  # until the heap exists
        job_id = rendezvous.broadcast("init", secrets.token_hex(6).encode(), src=0).decode()
        self.group_name = groups.register(self, f"trident-{job_id}")  # for torch.ops.trident.*
        if backend == "cuda":
            from ..backends.cuda import CudaBackend as Backend
        else:
            from ..backends.sim import SimBackend as Backend  # type: ignore[assignment]  # one HeapBackend or the other
        self._backend = Backend(self.rank, local_rank if backend == "cuda" else job_id)  # type: ignore[arg-type]
        self.device = self._backend.device
        self.platform = _platform.for_device(self.device, self.world_size)
        self._resources = Resources()
        self.call_cache = CallCache(self._resources)  # the recorded calls of this team (trident.calls)
        try:
            exchanged = create_and_exchange(self, self._backend, rendezvous, heap_size)  # its failures named
            sizes = {r: size for r, (size, *_) in enumerate(exchanged)}
            if len(set(sizes.values())) > 1:
                raise DivergenceError(f"rank {self.rank}: ranks asked for different heap sizes: {sizes}")
            self.topology = topo = Topology.from_keys(self.rank, [key for *_, key in exchanged])
            # Peers in other nodes are never mapped: their heap base is 0 (see trident.runtime.nodes).
            self._heaps = self._backend.open_peers([h if topo.reachable(r) else None
                                                    for r, (_, h, _, _) in enumerate(exchanged)])
            self._heap = self._heaps[self.rank]  # type: ignore[assignment]  # a rank always maps its own heap
            bases = [0 if h is None else h.data_ptr() for h in self._heaps]
            misaligned = [r for r, b in enumerate(bases) if b % layout.BASE_ALIGN]
            if misaligned:
                raise DeviceError(f"rank {self.rank}: heaps of ranks {misaligned} are not "
                                  f"{layout.BASE_ALIGN}-byte aligned in this process")
            self.heap_bases = torch.tensor(bases, dtype=torch.int64, device=self.device)
            self.heap_bases_host = tuple(bases)
            self._control = ControlBlock(self._heap, heap_size, self.world_size, *self._backend.abort_word(self._heap))
            self._control.reset(wait_timeout)
            top = groups.keep_reserved(self._resources, self._heap, heap_size, reserve)
            self._allocator = SymmetricAllocator(layout.CONTROL_BYTES, top, layout.ALLOC_ALIGN)
            self._backend.synchronize()
            rendezvous.all_gather("heap mapping", b"")
            self._backend.after_exchange()
        except BaseException:
            self._backend.close()
            raise
        # Only weak references back to the context: a closed context must be freed at once (its
        # heap and peer mappings with it), not whenever the garbage collector breaks a cycle.
        on_gone = weakref.WeakMethod(self._on_rank_gone)
        self.watchdog_interval = watchdog_interval
        self._watchdog = RankWatchdog(self.rank, [who for _, _, who, _ in exchanged], watchdog_interval,
                                      lambda rank, why: (call := on_gone()) is not None and call(rank, why))
        rendezvous.watch(self._watchdog)
        self._watchdog.start()
        self._closed, self._hierarchy = False, None
        self.node, self.local_rank, self.nodes = topo.node, topo.local_rank, topo.nodes
        self.spans_nodes = topo.spans_nodes
        # More than one node: the node's group and torch groups across nodes (collective, made once).
        self._hierarchy = Hierarchy(self, topo) if topo.spans_nodes else None

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Release the heap and the peers' mappings (collective). Idempotent.

        Tensors made on the heap keep their memory alive until they are dropped, but peers no
        longer see them: use heap tensors only while the context is open.
        Always releases; heaps out of step (a caught :class:`DivergenceError`) only warn: close and
        ``trident.init`` again to get back into step.
        """
        if self._closed:
            return
        try:
            try:
                self.barrier()  # no peer may still be reading or writing my heap
            except DivergenceError as exc:  # every rank got here, so nobody touches a heap any more
                warnings.warn(f"{exc} (closing anyway)", RuntimeWarning, stacklevel=2)
            self._rendezvous.farewell()
        finally:
            self._release()

    def _release(self) -> None:
        self._watchdog.stop()
        self._closed = True
        # Drop every view of the heaps now, even if the user keeps this closed context around.
        self._heaps = self._heap = self._hierarchy = None  # type: ignore[assignment]  # closed (the hierarchy refers to us)
        self._control.release()
        self._resources.clear()
        self._backend.close()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # peers may be gone: release without a barrier that could only time out
            self._release()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"heap_size={self.heap_size}"
        nodes = f" nodes={self.topology.describe()!r}" if self.topology.spans_nodes else ""
        return f"<trident.Context rank={self.rank}/{self.world_size} backend={self.backend}{nodes} {state}>"

    def _check_open(self) -> None:
        if self._closed:
            raise ContextClosedError(f"rank {self.rank}: this trident context is closed; "
                                     f"create a new one with trident.init()")

    # -- per-context resources ---------------------------------------------------------------
    def resource(self, key: str, factory):
        """The per-context resource under ``key``, made by ``factory()`` on first use; dropped at
        ``close()`` (or at the end of the :meth:`heap_scope` it was made in).

        Collective when ``factory`` allocates on the heap: every rank asks for it in the same call.
        This is where collectives and fused ops keep their state between calls.

        Example::

            ws = ctx.resource("ccl.workspace", lambda: Workspace(ctx))
        """
        self._check_open()
        return self._resources.get(key, factory, self)

    def all_gather_object(self, what: str, value) -> list:
        """Every rank's picklable ``value``, in rank order (collective, host-side, through the store).

        ``what`` names the step in a timeout message. For small metadata: a tensor travels as a CPU
        copy of its own elements (a heap tensor's own bytes, never the heap).

        Example::

            shapes = ctx.all_gather_object("shapes", tuple(x.shape))
        """
        self._check_open()
        return [pickle.loads(v) for v in self._rendezvous.all_gather(what, pickling.dumps(value))]

    def exchange_among(self, prefix: str, rank: int, world_size: int) -> Rendezvous:
        """A host-side exchange of some of the world's ranks (a group's members: ``rank`` of
        ``world_size``) on the world's store under ``prefix``, with the world's timeout, whose waits
        end as soon as the watchdog sees a rank go (:meth:`Rendezvous.among`)."""
        self._check_open()
        return self._rendezvous.among(prefix, rank, world_size)

    def agree_in_debug(self, what: str, *facts) -> None:
        """Debug mode (``TRIDENT_DEBUG=1``): raise :class:`DivergenceError` on every rank unless every
        rank passed the same ``facts`` (shapes, dtypes, options, placements) to collective ``what``.

        A cheap host-side exchange; nothing at all outside debug mode.

        Example::

            ctx.agree_in_debug("all_gather", tuple(inp.shape), inp.dtype)
        """
        if not config.DEBUG:
            return
        mine = repr((what, *facts))
        everyone = [v.decode() for v in self._rendezvous.all_gather(f"{what} argument check", mine.encode())]
        if len(set(everyone)) > 1:
            listing = "; ".join(f"rank {r}: {v}" for r, v in enumerate(everyone))
            raise DivergenceError(f"rank {self.rank}: ranks called collectives with different arguments: {listing}")

    def who(self) -> str:
        """This rank as errors name it (a group adds its group rank: :meth:`Group.who`)."""
        return f"rank {self.rank}"

    @property
    def debug(self) -> bool:
        """Whether the device debug mode (``TRIDENT_DEBUG=1`` at import) is on."""
        return config.DEBUG

    @property
    def wait_timeout(self) -> float:
        """Seconds a device-side ``trident.wait`` spins before it gives up."""
        self._check_open()
        return self._control.wait_timeout

    @wait_timeout.setter
    def wait_timeout(self, seconds: float) -> None:
        self._check_open()
        if seconds is None:
            raise ValueError("wait_timeout must be a positive number of seconds, got None")
        self._control.wait_timeout = _seconds("wait_timeout", seconds, "TRIDENT_WAIT_TIMEOUT")

    # -- synchronization ----------------------------------------------------------------------
    def check(self) -> None:
        """Raise the first fault a kernel of this rank recorded (a timed-out wait, an out-of-heap
        access in debug mode, an MoE dispatch past its capacity), then clear it. Waits for the device first.

        Example::

            my_kernel[grid](...)
            ctx.check()
        """
        self._check_open()
        refuse_in_capture(self, "ctx.check() and ctx.barrier()")  # before synchronizing: see the function
        with naming_lost_peers(self):  # a peer that died mid-kernel under MPS: say so
            self._backend.synchronize()
        fault = self._control.take_fault()
        if fault is not None:
            kind, message = fault
            raise fault_error(kind)(message)

    def barrier(self) -> None:
        """Wait for this rank's device work, then for every rank (collective).

        Also raises this rank's device faults, and a :class:`DivergenceError` when ranks' heap
        allocations have gone out of step.

        Example::

            fill_kernel[grid](x, ...)
            ctx.barrier()   # every rank's x is now written and visible to its peers
        """
        self.check()
        self._compare_digests("barrier")

    def new_group(self, ranks, workspace_bytes: int = groups.DEFAULT_WORKSPACE_BYTES):
        """A group of ``ranks`` (collective over the world; None elsewhere): :func:`group_life.new_group`."""
        return group_life.new_group(self, ranks, workspace_bytes)

    def destroy_group(self, group) -> None:
        """End a group, freeing its region (collective; None off it): :func:`group_life.destroy_group`."""
        group_life.destroy_group(self, group)

    def groups_from_mesh(self, mesh, dim, workspace_bytes: int = groups.DEFAULT_WORKSPACE_BYTES):
        """This rank's group along a DeviceMesh dimension (collective): :func:`group_life.groups_from_mesh`."""
        return group_life.groups_from_mesh(self, mesh, dim, workspace_bytes)

    def device_barrier(self) -> None:
        """A barrier done by a kernel on the device (collective), usable inside CUDA-graph capture.

        Each rank's kernel announces a new epoch in every peer's control block (release) and
        waits until every peer has announced it here (acquire). Epochs live on the device, so a
        captured graph replays correctly.

        Example::

            produce_kernel[grid](...)
            ctx.device_barrier()
            consume_kernel[grid](...)
        """
        self._check_open()
        if self._hierarchy is not None:  # no device path between nodes: torch.distributed joins them
            return self._hierarchy.device_barrier()
        from ..calls.pipeline import run_call
        from .barrier_ops import WORLD_BARRIER

        run_call(self, WORLD_BARRIER, (self.heap_bases,))

    def abort(self) -> None:
        """Make this rank's device waits give up now (they record an 'aborted' fault), until
        :meth:`clear_abort`.

        Example::

            ctx.abort()   # from a watchdog thread, while a kernel spins
        """
        self._check_open()
        self._control.set_abort(True, "ctx.abort() was called")

    def clear_abort(self) -> None:
        """Lower the abort word again (after ``abort()``), so device waits wait normally.

        Example::

            ctx.clear_abort()
        """
        self._check_open()
        if self._watchdog.gone:
            raise RankTimeoutError(f"rank {self.rank}: cannot resume: {self._control.abort_reason}")
        self._control.set_abort(False)

    def _on_rank_gone(self, rank: int, why: str) -> None:
        """The watchdog saw a peer's process end: stop this rank's device waits, naming every lost rank.

        Ranks often go together (the first one dies, the others then fail and exit), so the reason
        lists all of them, the newly lost ``rank`` included, in rank order."""
        if not self._closed:
            gone = self._watchdog.gone  # the watchdog records ``rank`` before it calls this
            self._control.set_abort(True, "; ".join(f"rank {r} is gone: {w}" for r, w in sorted(gone.items())))

    @property
    def lost_ranks(self) -> dict[int, str]:
        """``{rank: what happened}`` for every peer whose process has ended while this context is open."""
        return self._watchdog.gone

    def broadcast(self, value, src: int = 0):
        """Give every rank ``src``'s ``value`` (collective).

        A tensor is overwritten in place with ``src``'s data (every rank passes a tensor of the
        same shape and dtype) and returned; any other Python object is pickled and returned.

        Example::

            seed = ctx.broadcast(random.randrange(2**31) if ctx.rank == 0 else None)
            ctx.broadcast(weights, src=0)
        """
        self._check_open()
        if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < self.world_size:
            raise ValueError(f"src={src!r} is not a rank of this job (world size {self.world_size})")
        from .broadcast import broadcast

        return broadcast(self, value, src)
