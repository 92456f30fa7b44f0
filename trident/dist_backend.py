"""A torch.distributed backend named ``"trident"``: ``dist.new_group(ranks, backend="trident")``.

``trident.init`` registers it (or :func:`register`). Its process groups run ``dist.all_reduce`` (sum, max, min),
``all_gather_into_tensor`` / ``all_gather_single``, ``reduce_scatter_tensor`` /
``reduce_scatter_single``, ``all_to_all_single`` (equal splits), ``broadcast`` and ``barrier``
on :mod:`trident.ccl`, over a trident group of the same ranks. Everything else (other ops,
unequal splits, ``ReduceOp.AVG``, tensors on another device or larger than a quarter of the
group's workspace) goes to an inner fallback group made from the same store: NCCL when every
rank has a GPU of its own, gloo otherwise (the simulator; ranks sharing a GPU, where every fallback
call runs on host copies of its CUDA tensors, :mod:`trident.runtime.host_staging`). So existing code switches a group
to trident with one line.

A trident group needs a heap region at the same offset on every member, and torch calls a
backend's creator on the member ranks only, so the regions are kept up front, on every rank of
the world: ``trident.init`` keeps ``dist_groups`` slots (4 by default) of ``heap_size / 64`` bytes
at the top of the heap, and :func:`reserve` (collective) reserves other sizes instead. A new
torch group takes the lowest slot free on all of its members (they agree through the group's
store), and gives it back when the group is destroyed.

Example::

    ctx = trident.init()                                # keeps 4 slots for trident torch groups
    tp = dist.new_group([0, 1], backend="trident")      # every rank, as always
    if dist.get_rank() in (0, 1):
        dist.all_reduce(x, group=tp)                    # runs on trident.ccl
        dist.all_gather(parts, x, group=tp)             # a list: falls back to NCCL / gloo
"""

from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist

from . import ccl, torch_private
from .dist_slots import (  # the public ones are this module's too: trident.dist_backend.reserve(...)
    DEFAULT_GROUP_BYTES,
    DEFAULT_GROUPS,
    INIT_SLOTS,
    NAME,
    SLOTS_ENDED,
    Arena,
    agree_on_slot,
    current_arena,
    init_bytes,
    init_slots,
    reserve,
    slots_in,
)
from .errors import ContextClosedError, TridentError
from .runtime.groups import clear_region, group_in_region
from .runtime.host_staging import CompletedWork, HostStaged

#: Every trident collective (``trident.ccl.OPS``) and the ProcessGroup method that runs it on trident,
#: or None with why torch.distributed's call cannot reach it (tests/test_registry.py holds every
#: collective to a row here).
COLLECTIVE_METHODS = {
    "all_reduce": "allreduce", "all_gather": "_allgather_base", "reduce_scatter": "_reduce_scatter_base",
    "all_to_all": "alltoall_base", "broadcast": "broadcast",
    "all_to_all_v": None,  # all_to_all_single with unequal splits: its input is plain, so it goes to the fallback
}
#: The reductions trident runs, by the value of torch's op type (``int(opts.reduceOp.op)``: hashing the
#: pybind enum itself took 0.7 us on the CPU machine, the int and its lookup 0.3); anything else falls back.
# (torch's stub declares RedOpType without its members)
_OP_NAMES = {int(dist.ReduceOp.RedOpType.SUM): "sum", int(dist.ReduceOp.RedOpType.MAX): "max",  # type: ignore[attr-defined]
             int(dist.ReduceOp.RedOpType.MIN): "min"}  # type: ignore[attr-defined]
_REDUCIBLE = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64,
                        torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64))


_SUM = dist.ReduceOp.SUM


def _op_name(opts) -> str | None:
    """The reduction of a call's options as trident names it, or None (one trident does not run).
    The usual sum is one comparison (reading the op's type costs as much again)."""
    if opts is None:
        return "sum"
    op = opts.reduceOp
    return "sum" if op == _SUM else _OP_NAMES.get(int(op.op))

def _make_fallback(ctx, store, rank: int, size: int, timeout) -> dist.ProcessGroupNCCL | dist.ProcessGroupGloo:
    """The group that runs what trident does not: NCCL with a GPU per rank, gloo otherwise."""
    store = dist.PrefixStore("fallback/", store)
    if ctx.platform.nccl_usable:
        options = dist.ProcessGroupNCCL.Options()
        torch_private.set_options_timeout(options, timeout)
        return dist.ProcessGroupNCCL(store, rank, size, options)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


class TridentProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group whose common collectives run on :mod:`trident.ccl`.

    Made by ``dist.new_group(ranks, backend="trident")`` (see the module's docstring); ``group``
    is the trident group (``trident.ccl.all_reduce(ctx, t, group=pg.group)`` calls it directly);
    ``counts`` says how many calls ran on trident and how many on the fallback; ``algorithm`` picks
    the all-reduce algorithm (a row of ``trident.ccl.ALL_REDUCE_ALGORITHMS``, or "auto").
    """

    def __init__(self, arena: Arena, slot: int, ranks, group_id: str, fallback, rank: int, size: int):
        super().__init__(rank, size)  # type: ignore[call-arg]  # torch's stub lists only (store, rank, size)
        self._slot: int | None  # None once shutdown() gave it back
        self.ctx, self.fallback, self._arena, self._slot = arena.ctx, fallback, arena, slot
        self.group = group_in_region(arena.ctx, ranks, arena.slot(slot), f"{arena.ctx.group_name}-pg{group_id}")
        arena.live.add(self.group)
        self._limit, self._device = arena.group_bytes // 4, arena.ctx.device
        self._device_index = torch.empty(0, device=self._device).get_device()  # what _ours compares
        self.counts = {"trident": 0, "fallback": 0}
        #: The all-reduce algorithm of ``dist.all_reduce`` on this group: a row of
        #: ``trident.ccl.ALL_REDUCE_ALGORITHMS`` or "auto" (torch's API has no way to pass one).
        self.algorithm = "auto"
        self._spare = CompletedWork(None)
        self._free_refs = self._spare_refs()  # what a spare nothing else holds counts, in this Python
        # The fallback is the group's torch backend too: torch reads the group's name from it, and
        # ops reaching the group through torch's dispatcher (not overridden here) run on it.
        types = dist.ProcessGroup.BackendType
        kind = types.NCCL if arena.ctx.platform.nccl_usable else types.GLOO
        self._set_default_backend(kind)
        for device in ("cpu", "cuda"):
            self._register_backend(torch.device(device), kind, fallback)
        if not arena.ctx.platform.nccl_usable and not arena.ctx.platform.simulator:
            # Ranks share a GPU: gloo falls back, and fails on most calls on CUDA tensors (send, recv, gather...).
            gpu = self._device
            self.fallback = HostStaged(fallback, stage=lambda t: t.device == gpu)

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        """The backend's name, as torch asks it."""
        return NAME

    def name(self) -> str:
        """The backend's name."""
        return NAME

    def _ours(self, *tensors) -> bool:
        """Whether trident runs a call on these tensors (else the fallback does). Never once the
        trident slot is gone (its heap_scope ended); a closed context raises ContextClosedError."""
        if self.group.closed:  # (the group of a closed context is closed too)
            if self.ctx.closed:
                raise ContextClosedError(
                    f"rank {self.ctx.rank}: torch group {self.group.group_name} (backend 'trident'): its trident "
                    f"context is closed; destroy the group (dist.destroy_process_group) before ctx.close(), or "
                    f"make a new context and group")
            return False
        device, limit = self._device_index, self._limit
        for t in tensors:  # (get_device: an int, where comparing devices builds a torch.device)
            if not (t.get_device() == device and t.is_contiguous() and not t.is_complex()
                    and 0 < t.nbytes <= limit):
                return False
        return True

    def _fall(self, name: str, *args, opts=None):
        """Run ``name`` on the fallback group."""
        return self._ran(getattr(self.fallback, name)(*args, *([opts] if opts is not None else [])), "fallback")

    def _ran(self, result, on: str = "trident"):
        self.counts[on] += 1
        return self._completed(result) if on == "trident" else result

    def _spare_refs(self) -> int:
        return sys.getrefcount(self._spare)

    def _completed(self, result) -> dist.Work:
        """A completed Work holding ``result``: the last one again when nothing else holds it (torch
        dropped it after ``wait()``), since making a Work costs more than a small collective's host
        time; a new one otherwise (a caller kept the last, e.g. ``async_op=True``). Whether something
        else holds it is its reference count against the one measured when nothing did (the count a
        call site sees differs between Python versions, so it is measured, not assumed)."""
        if self._spare_refs() > self._free_refs:
            self._spare = CompletedWork(result)
        else:
            self._spare.hold(result)
        return self._spare

    # -- what runs on trident -------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        """``dist.all_reduce``: sum, max or min of one tensor on trident; anything else falls back."""
        op = _op_name(opts)
        if op is not None and len(tensors) == 1 and tensors[0].dtype in _REDUCIBLE and self._ours(tensors[0]):
            ccl.all_reduce(self.group, tensors[0], op=op, algorithm=self.algorithm)
            self.counts["trident"] += 1
            return self._completed(tensors)
        return self._fall("allreduce", tensors, opts=opts)

    def _allgather_base(self, out, inp, opts=None):
        """``dist.all_gather_into_tensor`` (torch <= 2.12's name)."""
        if self._ours(out, inp) and out.dtype == inp.dtype and out.numel() == inp.numel() * self.size():
            ccl.all_gather(self.group, _flat(out), _flat(inp))
            return self._ran([out])
        return self._fall("_allgather_base", out, inp, opts=opts)

    all_gather_single = _allgather_base  # torch >= 2.13's name

    def _reduce_scatter_base(self, out, inp, opts=None):
        """``dist.reduce_scatter_tensor`` (torch <= 2.12's name): sum, max or min on trident."""
        op = _op_name(opts)
        if (op and self._ours(out, inp) and out.dtype == inp.dtype and out.dtype in _REDUCIBLE
                and inp.numel() == out.numel() * self.size()):
            ccl.reduce_scatter(self.group, _flat(out), _flat(inp), op=op)
            return self._ran([out])
        return self._fall("_reduce_scatter_base", out, inp, opts=opts)

    reduce_scatter_single = _reduce_scatter_base  # torch >= 2.13's name

    def alltoall_base(self, out, inp, out_splits, in_splits, opts=None):
        """``dist.all_to_all_single`` (torch <= 2.12's name): equal splits on trident."""
        w = self.size()
        equal = all(not splits or len(set(splits)) == 1 for splits in (out_splits, in_splits))
        if (equal and self._ours(out, inp) and out.dtype == inp.dtype and out.numel() == inp.numel()
                and inp.numel() % w == 0 and inp.dim() > 0 and inp.shape[0] % w == 0):
            ccl.all_to_all(self.group, _flat(out), _flat(inp))
            return self._ran([out])
        return self._fall("alltoall_base", out, inp, out_splits, in_splits, opts=opts)

    all_to_all_single = alltoall_base  # torch >= 2.13's name

    def broadcast(self, tensors, opts=None):
        """``dist.broadcast`` of one tensor from ``opts.rootRank`` (a group rank)."""
        root = 0 if opts is None else opts.rootRank
        if len(tensors) == 1 and self._ours(tensors[0]):
            ccl.broadcast(self.group, tensors[0], src=root)
            return self._ran(tensors)
        return self._fall("broadcast", tensors, opts=opts)

    def barrier(self, opts=None):
        """``dist.barrier``: this rank's device work done, then every member's (trident's group barrier;
        the fallback's once the trident slot is gone)."""
        self._ours()  # a closed context raises
        if self.group.closed:
            return self._fall("barrier", opts=opts)
        self.group.barrier()
        return self._completed([])

    def shutdown(self) -> None:
        """Give the group's slot back (``dist.destroy_process_group(pg)`` calls this)."""
        if self._slot is not None:
            self._arena.free.add(self._slot)
            self._arena.live.discard(self.group)
            self._slot = None
        if hasattr(self.fallback, "shutdown"):
            self.fallback.shutdown()

    abort = shutdown


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``t`` as one dimension (contiguous: checked by ``_ours``); itself when it already is (a view costs
    about two microseconds, next to a small collective's ten)."""
    return t if t.dim() == 1 else t.view(-1)


def _forward(name: str):
    def call(self, *args):
        return self._ran(getattr(self.fallback, name)(*args), "fallback")

    call.__name__ = name
    call.__doc__ = f"``{name}`` on the fallback group (NCCL or gloo)."
    return call


#: ProcessGroup methods trident does not run: they go to the fallback group.
FALLBACK_OPS = ("allgather", "allgather_coalesced", "allgather_into_tensor_coalesced", "allreduce_coalesced",
                "alltoall", "gather", "scatter", "reduce", "reduce_scatter", "reduce_scatter_tensor_coalesced",
                "all_gather_single_coalesced", "reduce_scatter_single_coalesced", "send", "recv",
                "recv_anysource", "monitored_barrier")
for _name in FALLBACK_OPS:
    setattr(TridentProcessGroup, _name, _forward(_name))


def _create(options, pg_options=None) -> TridentProcessGroup:
    """The backend's creator (torch's extended API): runs on the new group's member ranks."""
    arena = current_arena()
    store, rank, size = options.store, options.group_rank, options.group_size
    timeout = options.timeout if isinstance(options.timeout, datetime.timedelta) else datetime.timedelta(seconds=300)
    ranks = list(options.global_ranks_in_group) or list(range(size))
    if dist.get_world_size() != arena.ctx.world_size:
        raise TridentError(f"rank {arena.ctx.rank}: the torch world ({dist.get_world_size()} ranks) is not "
                           f"trident's ({arena.ctx.world_size}): the trident backend needs them to be one")
    slot = agree_on_slot(arena, store, rank, size, str(options.group_id), timeout)
    arena.free.discard(slot)
    try:
        clear_region(arena.slot(slot))  # the barrier words a previous group may have left
        arena.ctx.check()  # zeroed on the device before a member can signal into them
        _sync(store, "zeroed", rank, size, timeout)
        fallback = _make_fallback(arena.ctx, store, rank, size, timeout)
        return TridentProcessGroup(arena, slot, ranks, str(options.group_id), fallback, rank, size)
    except BaseException:
        arena.free.add(slot)
        raise


def _sync(store, what: str, rank: int, size: int, timeout) -> None:
    """A store barrier of the group's members."""
    store.set(f"trident/{what}/{rank}", b"1")
    store.wait([f"trident/{what}/{r}" for r in range(size)], timeout)


def register() -> None:
    """Register the "trident" backend with torch.distributed (``trident.init`` does; idempotent).

    Example::

        trident.dist_backend.register()
        tp = dist.new_group([0, 1], backend="trident")
    """
    if torch_private.backend_registered(NAME):
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])


__all__ = ["NAME", "DEFAULT_GROUPS", "DEFAULT_GROUP_BYTES", "INIT_SLOTS", "SLOTS_ENDED", "COLLECTIVE_METHODS",
           "TridentProcessGroup", "init_bytes", "init_slots", "register", "reserve", "slots_in"]
