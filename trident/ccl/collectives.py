"""The collectives inside a node, declared for the call pipeline (:mod:`trident.calls.pipeline`).

Each collective is an :class:`~trident.calls.Op`: a check, the facts ranks agree on in the debug
mode, and a ``run`` that stages plain inputs through the workspace where needed and launches one
kernel through the call's recording. The public entries (:mod:`trident.ccl.api`) add the
across-nodes versions. Operands are given in a fixed order (outputs first, except all_reduce's
``(inp, out)``), which is the order of the cache key and of the recording's bound tensors.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import numbers
from collections.abc import Callable

import torch
import triton

from ..calls import Op, Recording
from ..errors import NotSymmetricError
from ..runtime.resources import refuse_in_capture
from ..runtime.team import Team
from . import kernels
from .checks import (
    acc_dtype,
    check_equal_chunks,
    check_rows,
    check_separate,
    check_src,
    check_tensors,
    check_world_multiple,
    op_name,
)
from .kernels import MAX_PROGRAMS
from .workspace import workspace

#: The workspace buffer that stages inputs not on the heap. A caller that fills
#: ``input_stage(ctx, numel, dtype)`` itself and passes it as the input saves a heap buffer and a copy.
INPUT_STAGE = "input"
#: all_reduce "auto" uses one_shot up to this many bytes, two_shot above (see docs/collectives.md).
ONE_SHOT_MAX_BYTES = 256 * 1024


def input_stage(ctx: Team, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The heap buffer the collectives stage a plain input in (``numel`` elements, flat; collective:
    every rank asks for the same size). Writing an input straight into it, then passing it to a
    collective, saves the staging copy and a second heap buffer of that size.

    Example::

        partial = trident.ccl.collectives.input_stage(ctx, M * N, torch.bfloat16).view(M, N)
        torch.matmul(A, B, out=partial)
        trident.ccl.reduce_scatter(ctx, out, partial)
    """
    return workspace(ctx).buffer(INPUT_STAGE, numel, dtype)


def _launch(team: Team, rec: Recording, kernel, work_items: int | None, *args, **constexprs) -> None:
    """Launch ``kernel`` with enough programs for the work, up to the limit, through ``rec``.

    ``work_items`` must be the same on every rank: program ``pid`` meets program ``pid`` of the
    other ranks. None launches the limit (for work whose size differs between ranks).
    """
    block = constexprs["BLOCK"]
    limit = min(team.platform.program_limit, MAX_PROGRAMS)
    programs = limit if work_items is None else max(1, min(triton.cdiv(max(work_items, 1), block), limit))
    rec.launch(kernel, (programs,), (*args, workspace(team).sync, team.rank, team.world_size, team.heap_bases),
               {**constexprs, "WORLD_BLOCK": triton.next_power_of_2(team.world_size)},
               num_warps=4 if block <= 2048 else 8)


def _block(team: Team, numel: int) -> int:
    """Elements per tile: larger tiles for large tensors on a GPU; the simulator keeps one size."""
    if team.platform.simulator:
        return 1024
    return 1024 if numel <= 64 * 1024 else 4096


def on_heap(team: Team, t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when it lies on the heap, else the staging buffer, which the kernel fills with
    t's data before its entry sync (every collective stages a plain input inside its kernel).

    Ranks may decide differently (and pass heap tensors at different offsets): the kernels
    exchange where each rank's tensor lies. The staging buffer is allocated on every rank all the
    same, so that allocations stay in step."""
    stage = input_stage(team, t.numel(), t.dtype).view(t.shape)
    return t if team.is_symmetric(t) else stage


# -- all_gather ----------------------------------------------------------------------------------

def _check_all_gather(team: Team, tensors: tuple, options: tuple) -> None:
    out, inp = tensors
    check_tensors(team, "all_gather", out=out, inp=inp)
    check_world_multiple(team, "all_gather", out, inp, "out", "inp")


def _run_all_gather(team: Team, rec: Recording, tensors: tuple, options: tuple) -> None:
    out, inp = tensors
    source = on_heap(team, inp)  # staged inside the kernel
    _launch(team, rec, kernels.all_gather_kernel, inp.numel(), inp, source, out, inp.numel(),
            STAGE=source is not inp, BLOCK=_block(team, inp.numel()))


ALL_GATHER = Op("all_gather", _check_all_gather, _run_all_gather,
                facts=lambda tensors, options: (tuple(tensors[1].shape), tensors[1].dtype))


# -- reduce_scatter ------------------------------------------------------------------------------

def _check_reduce_scatter(team: Team, tensors: tuple, options: tuple) -> None:
    out, inp = tensors
    check_tensors(team, "reduce_scatter", out=out, inp=inp)
    op_name(team, options[0])
    acc_dtype(team, inp.dtype, "reduce_scatter")
    check_world_multiple(team, "reduce_scatter", inp, out, "inp", "out")


def _run_reduce_scatter(team: Team, rec: Recording, tensors: tuple, options: tuple) -> None:
    out, inp = tensors
    source = on_heap(team, inp)  # staged inside the kernel
    _launch(team, rec, kernels.reduce_scatter_kernel, out.numel(), inp, source, out, out.numel(),
            OP=op_name(team, options[0]), ACC=acc_dtype(team, inp.dtype, "reduce_scatter"),
            STAGE=source is not inp, BLOCK=_block(team, out.numel()))


REDUCE_SCATTER = Op("reduce_scatter", _check_reduce_scatter, _run_reduce_scatter,
                    facts=lambda tensors, options: (tuple(tensors[1].shape), tensors[1].dtype, str(options[0])))


# -- all_reduce ----------------------------------------------------------------------------------

def _check_all_reduce(team: Team, tensors: tuple, options: tuple) -> None:
    inp, out = tensors
    check_tensors(team, "all_reduce", tensor=inp, out=out)
    if out.shape != inp.shape:
        raise ValueError(f"{team.who()}: all_reduce: out {tuple(out.shape)} must have the input's shape "
                         f"{tuple(inp.shape)}")
    if out is not inp and out.data_ptr() != inp.data_ptr():
        check_separate(team, "all_reduce", out, inp)
    op_name(team, options[0])
    acc_dtype(team, inp.dtype, "all_reduce")
    if options[1] not in ALGORITHMS:  # the table's rows and "auto"
        raise ValueError(f"{team.who()}: all_reduce: algorithm={options[1]!r} is not one of {ALGORITHMS}")


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One all-reduce algorithm: a row of :data:`ALL_REDUCE_ALGORITHMS`.

    Attributes:
        name: what ``algorithm=`` takes.
        kernel: its ``@triton.jit`` kernel.
        work_items: ``work_items(n, world_size)``: the elements one program index covers on every
            rank (the grid is sized from it).
        extra: ``extra(n, world_size)``: the kernel's arguments after ``n`` (two_shot: its chunk).
        scratch: ``scratch(n)``: elements of the workspace's scratch buffer it needs.
        auto_max_bytes: the largest message ``auto`` gives it (None: any size); ``auto`` takes the
            first row of the table whose limit the message is within.
    """

    name: str
    kernel: object
    work_items: Callable[[int, int], int]
    extra: Callable[[int, int], tuple]
    scratch: Callable[[int], int]
    auto_max_bytes: int | None


#: The all-reduce algorithms, in the order ``auto`` considers them (docs/collectives.md): every
#: entry (the public API, ``torch.ops.trident.all_reduce``, the dist backend, tests, benchmarks)
#: reads this table.
ALL_REDUCE_ALGORITHMS = {a.name: a for a in (
    Algorithm("one_shot", kernels.all_reduce_one_shot_kernel, lambda n, w: n, lambda n, w: (), lambda n: n,
              ONE_SHOT_MAX_BYTES),
    Algorithm("two_shot", kernels.all_reduce_two_shot_kernel, lambda n, w: triton.cdiv(n, w),
              lambda n, w: (triton.cdiv(n, w),), lambda n: n, None),
)}
#: What ``algorithm=`` takes: the table's rows, and "auto".
ALGORITHMS = (*ALL_REDUCE_ALGORITHMS, "auto")


def algorithm_for(nbytes: int, algorithm: str) -> str:
    """The all_reduce algorithm ``algorithm`` runs for ``nbytes`` ("auto": the first row of
    :data:`ALL_REDUCE_ALGORITHMS` whose ``auto_max_bytes`` the message is within)."""
    if algorithm != "auto":
        return algorithm
    return next(a.name for a in ALL_REDUCE_ALGORITHMS.values()
                if a.auto_max_bytes is None or nbytes <= a.auto_max_bytes)


def _run_all_reduce(team: Team, rec: Recording, tensors: tuple, options: tuple) -> None:
    inp, out = tensors
    n = inp.numel()
    row = ALL_REDUCE_ALGORITHMS[algorithm_for(n * inp.element_size(), options[1])]
    x = on_heap(team, inp)  # staged inside the kernel
    scratch = workspace(team).buffer("scratch", row.scratch(n), inp.dtype)
    meta = {"OP": op_name(team, options[0]), "ACC": acc_dtype(team, inp.dtype, "all_reduce"),
            "STAGE": x is not inp, "BLOCK": _block(team, n)}
    w = team.world_size
    _launch(team, rec, row.kernel, row.work_items(n, w), inp, x, scratch, out, n, *row.extra(n, w), **meta)


ALL_REDUCE = Op("all_reduce", _check_all_reduce, _run_all_reduce,
                facts=lambda tensors, options: (tuple(tensors[0].shape), tensors[0].dtype, str(options[0]),
                                                algorithm_for(tensors[0].numel() * tensors[0].element_size(),
                                                              options[1])))


# -- all_to_all ----------------------------------------------------------------------------------

def _check_all_to_all(team: Team, tensors: tuple, options: tuple) -> None:
    out, inp = tensors
    check_tensors(team, "all_to_all", out=out, inp=inp)
    check_equal_chunks(team, "all_to_all", out, inp)


def _run_all_to_all(team: Team, rec: Recording, tensors: tuple, options: tuple) -> None:
    out, inp = tensors
    rows, inner = inp.shape[0] // team.world_size, math.prod(inp.shape[1:])
    source = on_heap(team, inp)  # staged inside the kernel
    # Equal splits: the offsets follow from the row count, so no split table is built or read.
    _launch(team, rec, kernels.all_to_all_kernel, rows * inner, inp, source, out, workspace(team).table, inner,
            rows, EQUAL=True, STAGE=source is not inp, BLOCK=_block(team, out.numel()))


ALL_TO_ALL = Op("all_to_all", _check_all_to_all, _run_all_to_all,
                facts=lambda tensors, options: (tuple(tensors[1].shape), tensors[1].dtype))


# -- broadcast -----------------------------------------------------------------------------------

def _check_broadcast(team: Team, tensors: tuple, options: tuple) -> None:
    tensor, out = tensors
    check_tensors(team, "broadcast", tensor=tensor, out=out)
    if out.data_ptr() != tensor.data_ptr():
        if out.shape != tensor.shape:
            raise ValueError(f"{team.who()}: broadcast: out {tuple(out.shape)} must have the tensor's shape "
                             f"{tuple(tensor.shape)}")
        check_separate(team, "broadcast", out, tensor)
    check_src(team, "broadcast", options[0])


def _run_broadcast(team: Team, rec: Recording, tensors: tuple, options: tuple) -> None:
    (tensor, out), (src,) = tensors, options
    n, mine = tensor.numel(), team.rank == src
    x = on_heap(team, tensor)  # src stages inside the kernel; the others pull into out
    _launch(team, rec, kernels.broadcast_kernel, n, tensor, x, out, n, src,
            STAGE=mine and x is not tensor, COPY=mine and out.data_ptr() != tensor.data_ptr(),
            BLOCK=_block(team, n))


BROADCAST = Op("broadcast", _check_broadcast, _run_broadcast,
               facts=lambda tensors, options: (tuple(tensors[0].shape), tensors[0].dtype, options[0]))


# -- all_to_all_v: kept by layout; the split sizes, which differ from call to call, fill the table --------

def _split_table(team: Team, in_splits, out_splits, rows_in: int, rows_out: int) -> None:
    """Fill this rank's split table: rows sent to each rank, where they start, where received rows go.

    Splits given on the host (lists, CPU tensors) are checked here and the table is made in Python
    and uploaded through page-locked memory (:class:`trident.runtime.uploads.Uploads`): queued on the
    stream, never a host wait for the device. Splits already on the GPU are not checked, since
    checking them would make the host wait for the device (and break graph capture), and the
    table is made there.
    """
    space, w = workspace(team), team.world_size
    given = (("in_splits", in_splits, rows_in), ("out_splits", out_splits, rows_out))
    if any(isinstance(splits, torch.Tensor) and not splits.is_cpu for _, splits, _ in given):
        space.table_holds = None  # made on the device: not known on the host
        _device_split_table(team, space.table, given)
        return
    sent, received = (_host_splits(team, name, splits, rows) for name, splits, rows in given)
    refuse_in_capture(team, "all_to_all_v with split sizes given on the host (pass device tensors in a graph)")
    values = [*sent, *_starts(sent), *_starts(received)]
    if values != space.table_holds:  # the same splits as the last call (a loop's usual case): nothing to upload
        space.uploads.write(space.table[:3 * w], values)
        space.table_holds = values


def _starts(sizes: list[int]) -> list[int]:
    """Where each of ``sizes`` consecutive runs starts."""
    return [0, *itertools.accumulate(sizes)][:-1]


def _host_splits(team: Team, name: str, splits, rows: int) -> list[int]:
    """``splits`` (a sequence or CPU tensor) as ``world_size`` Python ints, checked against ``rows``."""
    if isinstance(splits, torch.Tensor) and (splits.dtype.is_floating_point or splits.dtype.is_complex
                                             or splits.dtype == torch.bool):
        raise TypeError(f"{team.who()}: all_to_all_v: {name} must hold integer row counts, got {splits.dtype} "
                        f"{splits.tolist()}")
    values = splits.reshape(-1).tolist() if isinstance(splits, torch.Tensor) else list(splits)
    if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in values):
        raise TypeError(f"{team.who()}: all_to_all_v: {name} must hold integer row counts, got {values}")
    if len(values) != team.world_size:
        raise ValueError(f"{team.who()}: all_to_all_v: {name} has {len(values)} entries, expected "
                         f"world_size = {team.world_size}")
    if sum(values) != rows or min(values) < 0:
        raise ValueError(f"{team.who()}: all_to_all_v: {name} {values} must be non-negative and sum "
                         f"to the {rows} rows along dim 0")
    return [int(v) for v in values]


def _device_split_table(team: Team, table: torch.Tensor, given) -> None:
    """The split table made on the GPU, from splits of which at least one is a device tensor."""
    w, sizes = team.world_size, []
    for name, splits, rows in given:
        if not isinstance(splits, torch.Tensor) or splits.is_cpu:
            splits = torch.tensor(_host_splits(team, name, splits, rows))
        elif splits.dtype.is_floating_point or splits.dtype.is_complex or splits.dtype == torch.bool:
            raise TypeError(f"{team.who()}: all_to_all_v: {name} must hold integer row counts, got {splits.dtype}")
        elif splits.numel() != w:
            raise ValueError(f"{team.who()}: all_to_all_v: {name} has {splits.numel()} entries, expected "
                             f"world_size = {w}")
        sizes.append(splits.reshape(-1).to(team.device, torch.int64))
    sent, received = sizes
    table[:3 * w].copy_(torch.cat([sent, sent.cumsum(0) - sent, received.cumsum(0) - received]))


def _check_all_to_all_v(team: Team, tensors: tuple, options: tuple) -> None:
    out, inp = tensors
    check_tensors(team, "all_to_all_v", out=out, inp=inp)
    check_separate(team, "all_to_all_v", out, inp)
    if not team.spans_nodes and not team.is_symmetric(inp):  # across nodes it is staged
        raise NotSymmetricError(
            f"{team.who()}: all_to_all_v: inp must lie on the heap (its size differs between ranks, so it "
            f"cannot be staged): allocate a buffer of the largest size with ctx.empty and pass a slice of it")
    check_rows(team, "all_to_all_v", out, inp)


def _run_all_to_all_v(team: Team, rec: Recording, tensors: tuple, options: tuple) -> None:
    out, inp = tensors
    rows_in, rows_out = inp.shape[0], out.shape[0]
    # The table follows each call's splits (they are not in the cache key: a replay refills it).
    rec.per_call(lambda splits: _split_table(team, splits[1], splits[0], rows_in, rows_out), options)
    # Row counts differ between ranks: launch the limit (program pid must meet pid everywhere).
    _launch(team, rec, kernels.all_to_all_kernel, None, inp, inp, out, workspace(team).table,
            math.prod(inp.shape[1:]), 0, EQUAL=False, STAGE=False, BLOCK=_block(team, out.numel()))


ALL_TO_ALL_V = Op("all_to_all_v", _check_all_to_all_v, _run_all_to_all_v,
                  facts=lambda tensors, options: (tuple(tensors[1].shape[1:]), tensors[1].dtype),
                  key_options=lambda options: ())

#: Every collective, by name: what the public API, ``torch.ops.trident`` and the dist backend run.
COLLECTIVES = {op.name: op for op in (ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, ALL_TO_ALL, BROADCAST, ALL_TO_ALL_V)}
