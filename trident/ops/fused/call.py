"""The machinery the three fused GEMM + communication ops share.

An op call goes through three steps, each op supplying only what is its own:

1. validate: the op's own argument check (built from :func:`check_gemm_call`, or from
   :func:`check_fused_operands` and :func:`check_pattern`), raised before anything runs, with the
   rank in the message;
2. prepare: :func:`prepare_call` resolves ``auto``, picks the tile config and the number of
   communication programs, and returns a :class:`FusedCall` record;
3. run: :meth:`FusedCall.run` calls the pattern's function from the op's :class:`OpSpec`.

Every op declares one :class:`OpSpec`: its name, its patterns table, its measured ``auto`` table
and its GPU default for communication programs.

Example::

    _check_my_op_args(ctx, A, B, C, pattern, config, comm_programs)
    call = prepare_call(ctx, MY_OP, pattern, A, B, C, gemm=(M, N, K), size=M * N * K, config=config,
                        comm_programs=comm_programs, trace=trace)
    call.run()
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import triton

from ...calls import Op, Recording
from ...errors import NotSymmetricError
from ...runtime.team import Team
from ..gemm.matmul import MatmulConfig, check_matrices, pick_config
from .sync import sync_block

if TYPE_CHECKING:
    from ...trace import Trace

#: ``auto``'s table: (GPU name part, world size) -> [(minimum M*N*K, pattern), ...], largest first.
AutoTable = dict[tuple[str, int], list[tuple[int, str]]]


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """What makes one fused op: its name, patterns, ``auto`` table and communication programs.

    Attributes:
        name: the op's name (``trident.ops.OPS[name]``).
        patterns: pattern name -> function running a prepared :class:`FusedCall` (``baseline``
            included; ``auto`` is not a pattern but a choice among them).
        auto_table: measured choices of ``auto`` (:func:`table_choice`); empty: ``baseline``.
        gpu_comm_programs: world size -> programs that communicate on a GPU when the caller
            gives none (the simulator always takes ``trident.platform.SIM_COMM_PROGRAMS``).
        shared_gpu_pattern: what ``auto`` runs when ranks share a GPU (NCCL cannot run there).
        replayable: the patterns whose every launch and copy goes through :meth:`FusedCall.launch`
            and :meth:`FusedCall.copy`: a repeated call replays them (:mod:`trident.calls`); the
            others are run again with the first call's decisions.
        zero_when_k_is_zero: whether a call with K == 0 only zeroes C (the ops whose C is a plain
            product); the partial-sum ops run their collective all the same.
        extra_bytes: ``extra_bytes(pattern, (M, N, K), world_size, element_size)``: the bytes a
            pattern reads and writes on one rank beyond its GEMM (its machinery budget, in
            docs/tensor-parallel-ops.md), ``(M, N, K)`` being the op's whole product as its
            benchmark names it; None for ``baseline`` (torch's, not trident's).
    """

    name: str
    patterns: dict[str, Callable[[FusedCall], None]]
    auto_table: AutoTable
    gpu_comm_programs: Callable[[int], int]
    shared_gpu_pattern: str = "fused_sequential"
    replayable: frozenset[str] = frozenset()
    zero_when_k_is_zero: bool = False
    extra_bytes: Callable[[str, tuple[int, int, int], int, int], int | None] = lambda *_: None

    @property
    def pattern_names(self) -> tuple[str, ...]:
        """Every value the op's ``pattern`` argument takes: the patterns, then ``auto``."""
        return (*self.patterns, "auto")

    def comm_programs(self, platform) -> int:
        """Communication programs when the caller gives none, on ``platform``.

        Example::

            OPS["all_gather_gemm"].comm_programs(ctx.platform)   # 16 on an H200, 2 in the simulator
        """
        return platform.comm_programs(self.gpu_comm_programs(platform.world_size))

    def choose(self, platform, size: int) -> str:
        """What ``auto`` runs for a product of ``size`` = M*N*K on ``platform``.

        :attr:`shared_gpu_pattern` when ranks share a GPU (a correctness setting: NCCL cannot
        run), else the table's choice where NCCL runs, else ``baseline``.

        Example::

            OPS["gemm_all_scatter"].choose(ctx.platform, 8192 * 4608 * 36864)  # measured choice, else 'baseline'
        """
        if platform.ranks_share_gpus:
            return self.shared_gpu_pattern
        if not platform.nccl_usable:
            return "baseline"
        return table_choice(self.auto_table, platform.gpu_name, platform.world_size, size)


@dataclasses.dataclass(frozen=True)
class FusedCall:
    """One prepared call of a fused op: everything its pattern function needs.

    ``A``, ``B`` and ``C`` are the op's operands in its argument order (their meaning is the op's);
    ``cfg`` the GEMM's tile config, the same on every rank; ``comm_programs`` the programs that
    communicate where the pattern splits roles; ``trace`` a ``trident.trace.Trace`` or None;
    ``rec`` the recording the run launches through (:mod:`trident.calls`), or None (plain launches).
    """

    ctx: Team
    spec: OpSpec
    pattern: str
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    cfg: MatmulConfig
    comm_programs: int
    trace: Trace | None = None
    rec: Recording | None = None

    @property
    def trace_ptr(self) -> torch.Tensor | None:
        """What a kernel's ``trace_ptr`` gets: the trace buffer, or None (tracing off)."""
        return None if self.trace is None else self.trace.ptr

    @property
    def world_block(self) -> int:
        """The world size rounded up to a power of two (a kernel's ``WORLD_BLOCK``)."""
        return triton.next_power_of_2(self.ctx.world_size)

    def sync(self, flags: int = 0) -> torch.Tensor:
        """The context's sync block with room for ``flags`` tile flags (collective, see
        :func:`~trident.ops.fused.sync.sync_block`)."""
        return sync_block(self.ctx, flags)

    def run(self) -> None:
        """Run the pattern (its function from the op's table)."""
        self.spec.patterns[self.pattern](self)

    def launch(self, kernel, grid: tuple[int, ...], args: tuple, constexprs: dict, **options) -> None:
        """``kernel[grid](*args, **constexprs, **options)``, recorded in :attr:`rec` (if any)."""
        if self.rec is None:
            kernel[grid](*args, **constexprs, **options)
        else:
            self.rec.launch(kernel, grid, args, constexprs, **options)

    def launch_gemm(self, kernel, grid: tuple[int, ...], args: tuple, tile_as_tuple: bool = False,
                    **constexprs) -> None:
        """:meth:`launch` of a kernel that multiplies tiles: the tile config's ``BLOCK_M``, ``BLOCK_N``,
        ``BLOCK_K``, ``GROUP_M`` (or, ``tile_as_tuple``, one ``TILE`` of the four), ``num_warps`` and
        ``num_stages``, and :attr:`world_block`, go with the kernel's own ``constexprs``.

        Example::

            call.launch_gemm(kernels.pull_kernel, (programs,), (a_local, B, C, ...), USE_TMA=False)
        """
        cfg = self.cfg
        tile = (cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K, cfg.GROUP_M)
        tiling = dict(TILE=tile) if tile_as_tuple else dict(BLOCK_M=tile[0], BLOCK_N=tile[1], BLOCK_K=tile[2],
                                                             GROUP_M=tile[3])
        self.launch(kernel, grid, args, dict(**tiling, WORLD_BLOCK=self.world_block, **constexprs),
                    num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """``dst.copy_(src)``, recorded in :attr:`rec` (if any)."""
        return dst.copy_(src) if self.rec is None else self.rec.copy(dst, src)

    def own(self, *tensors: torch.Tensor) -> None:
        """Scratch this run made and launches on: a recording keeps it alive and reuses it."""
        if self.rec is not None:
            self.rec.own(*tensors)


def prepare_call(ctx: Team, spec: OpSpec, pattern: str, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, *,
                 gemm: tuple[int, int, int], size: int, config: MatmulConfig | None, comm_programs: int | None,
                 trace) -> FusedCall:
    """A :class:`FusedCall` with ``auto`` resolved and every default filled in.

    Args:
        ctx, spec, pattern: the context, the op, and the pattern asked for (``auto`` included).
        A, B, C: the op's operands (already checked).
        gemm: ``(M, N, K)`` of the GEMM this rank runs, which the tile config is picked for.
        size: the M*N*K that ``auto`` looks up (:meth:`OpSpec.choose`).
        config, comm_programs, trace: the caller's, None for the defaults.

    Returns:
        The call record; :meth:`FusedCall.run` runs it.

    Example::

        call = prepare_call(ctx, GEMM_ALL_SCATTER, "auto", A, B_local, C, gemm=(M, n_local, K),
                            size=M * N * K, config=None, comm_programs=None, trace=None)
    """
    if pattern == "auto":
        pattern = spec.choose(ctx.platform, size)
        if pattern == "baseline" and getattr(ctx, "ranks", None) is not None:
            pattern = spec.shared_gpu_pattern  # the NCCL baseline runs over the world, never in a group
    cfg = config or pick_config(*gemm, A.dtype, ctx.platform, column_tail=False)  # the fused kernels: no tails
    return FusedCall(ctx, spec, pattern, A, B, C, cfg=cfg,
                     comm_programs=comm_programs or spec.comm_programs(ctx.platform), trace=trace)


def fused_op(spec: OpSpec, check, shape, across_nodes=None, refusal=None) -> Op:
    """The call pipeline's record (:class:`trident.calls.Op`) of a fused GEMM op.

    Operands are ``(A, B, C)`` in the op's order, options ``(pattern, config, comm_programs, trace)``.

    Args:
        spec: the op's patterns, ``auto`` table and defaults.
        check: ``check(team, A, B, C, pattern, config, comm_programs)``: the op's argument check.
        shape: ``shape(team, A, B, C)`` -> ``((M, N, K), size, empty)``: the GEMM this rank runs
            (its tile config is picked for it), the M*N*K ``auto`` looks up, and whether C is empty
            (nothing to do).
        across_nodes: ``across_nodes(team, tensors, options, op)``, the op across nodes given ``op``,
            this record, to run over each node (:mod:`trident.ops.fused.multinode`); or None (the op
            refuses, with ``refusal(team)``).

    Example::

        GEMM_ALL_REDUCE_OP = fused_op(GEMM_ALL_REDUCE, check, lambda team, A, B, C: (...))
    """

    def run(team: Team, rec: Recording, tensors: tuple, options: tuple) -> None:
        A, B, C = tensors
        pattern, config, comm_programs, trace = options
        gemm, size, empty = shape(team, A, B, C)
        call = prepare_call(team, spec, pattern, A, B, C, gemm=gemm, size=size, config=config,
                            comm_programs=comm_programs, trace=trace)
        if empty or (gemm[2] == 0 and spec.zero_when_k_is_zero):
            rec.discard()  # cheap either way: a later call takes the full path again
            if not empty:
                C.zero_()
            return
        if call.pattern in spec.replayable:
            dataclasses.replace(call, rec=rec).run()
            return
        # torch work, nested calls: run again. The operands are dropped (not kept alive by the
        # recording); every run binds the new call's, so the record never runs with None in them.
        decided = dataclasses.replace(call, A=None, B=None, C=None)  # type: ignore[arg-type]
        rec.rerun_with(lambda A, B, C: dataclasses.replace(decided, A=A, B=B, C=C).run())
        call.run()

    def run_across_nodes(team: Team, tensors: tuple, options: tuple):
        return across_nodes(team, tensors, options, op)

    op = Op(spec.name, check=lambda team, t, o: check(team, *t, *o[:3]), run=run,
            across_nodes=None if across_nodes is None else run_across_nodes,
            cacheable=lambda options: options[3] is None, refusal=refusal)
    return op


def split_roles(call: FusedCall, comm_work: int, other_work: int) -> tuple[int, int]:
    """``(other, comm)``: how many programs of a ``workgroup_specialized`` launch do the GEMM side
    and the communication side (also ``producer_consumer``'s two grids): at least one GEMM program,
    and at least one communication program unless ``comm_work`` is 0 (then none: alone, a rank has
    nothing to gather, scatter or reduce from peers).

    ``comm`` is the call's ``comm_programs`` (the caller's, honoured, or the platform's default:
    at most a quarter of the SMs), capped by ``comm_work`` and by all programs but one, so that
    the GEMM keeps at least one. The whole grid is one program per SM this process may use
    (``program_limit``) on a GPU, or ``call.cfg.programs`` when smaller: a persistent kernel
    gains nothing from more. Correctness does not depend on that cap: the kernels take roles from
    arrival tickets (:func:`~trident.ops.fused.sync.enter_call`), so a launch finishes however few
    of its programs are resident; and ``producer_consumer``'s scatter grid, fewer programs than
    the SMs, always leaves its GEMM kernel room. The simulator runs programs one at a time and
    takes ``call.cfg.programs`` as given.

    Example::

        gemm_programs, comm = split_roles(call, comm_work=blocks, other_work=tiles)
    """
    platform = call.ctx.platform
    programs = call.cfg.programs or platform.program_limit
    if not platform.simulator:
        programs = min(programs, platform.program_limit)
    comm = max(1, min(call.comm_programs, comm_work, programs - 1)) if comm_work else 0
    return max(1, min(other_work, programs - comm)), comm


def table_choice(table: AutoTable, gpu_name: str, world_size: int, mnk: int) -> str:
    """The pattern a measured ``table`` gives a GPU model, world size and M*N*K; else ``baseline``.

    ``table`` maps (GPU name part, world size) to [(minimum M*N*K, pattern), ...], largest first.

    Example::

        table_choice({("H200", 8): [(1 << 36, "fused_sequential")]}, "NVIDIA H200", 8, 8192 * 4608 * 36864)
    """
    for (gpu, world), rules in table.items():
        if world == world_size and gpu in gpu_name:
            for threshold, pattern in rules:
                if mnk >= threshold:
                    return pattern
    return "baseline"


def check_gemm_call(ctx, spec: OpSpec, pattern: str, config, comm_programs, dims: tuple[str, str],
                    symmetric: tuple[str, ...] = (), **tensors) -> str:
    """The checks every fused GEMM op makes before anything runs: :func:`check_pattern`,
    :func:`check_fused_operands`, and that A's columns match B's rows; returns the messages'
    prefix, ``"rank r: <op>"``, for the op's own checks.

    Args:
        ctx, spec, pattern, config, comm_programs: the call's.
        dims: A's and B's shapes as the op's docs write them (``("M x K", "K x N/world_size")``),
            for the K mismatch message.
        symmetric: the operands that must lie on the heap.
        tensors: the operands A, B, C, in that order, by the op's names (``A=A, B_local=B, C=C``).

    Example::

        where = check_gemm_call(ctx, GEMM_ALL_SCATTER, pattern, config, comm_programs, ("M x K", "K x N/world_size"),
                                ("C",), A=A, B_local=B_local, C=C)
    """
    where = f"{ctx.who()}: {spec.name}"
    check_pattern(ctx, where, pattern, spec, comm_programs)
    check_fused_operands(ctx, where, config, symmetric, **tensors)
    (a_name, A), (b_name, B) = list(tensors.items())[:2]
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"{where}: K mismatch: {a_name} is {tuple(A.shape)} ({dims[0]}) but {b_name} is "
                         f"{tuple(B.shape)} ({dims[1]})")
    return where


def check_fused_operands(ctx, where: str, config, symmetric: tuple[str, ...] = (), **tensors) -> None:
    """Raise a clear error unless every tensor is 2-D, contiguous, on ``ctx.device``, of one
    supported dtype, the names in ``symmetric`` lie on the heap, and ``config`` is valid.

    Example::

        check_fused_operands(ctx, f"{ctx.who()}: all_gather_gemm", None, ("A_local",), A_local=A, B=B, C=C)
    """
    check_matrices(where, ctx.device, True, **tensors)
    for name in symmetric:
        if not ctx.is_symmetric(tensors[name]):
            raise NotSymmetricError(f"{where}: {name} must be a symmetric tensor (peers access it): allocate it "
                                    f"with ctx.empty / ctx.zeros, or copy it with ctx.as_symmetric")
    if config is not None:
        if not isinstance(config, MatmulConfig):
            raise TypeError(f"{where}: config must be a trident.ops.MatmulConfig, got {type(config).__name__}")
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            v = getattr(config, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{where}: config.{name}={v} must be a power of two >= 16")
        if config.tail_n:
            raise ValueError(f"{where}: config.tail_n={config.tail_n}: tiles with a tail of columns are the "
                             f"matmul's only (trident.ops.matmul); the fused ops' tiles are BLOCK_N wide, tail_n=0")


def check_tensor(where: str, name: str, t, device, dtypes, dims: int) -> None:
    """Raise a clear error unless ``t`` is a contiguous torch.Tensor on ``device`` with ``dims``
    dimensions and one of ``dtypes`` (the single-tensor check of the ops that are not GEMMs).

    Example::

        check_tensor(f"{ctx.who()}: moe_dispatch", "x", x, ctx.device, (torch.bfloat16,), dims=2)
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != device:
        raise ValueError(f"{where}: {name} is on {t.device}, expected {device}")
    if t.dim() != dims:
        raise ValueError(f"{where}: {name} must have {dims} dimension{'s' if dims > 1 else ''}, "
                         f"got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{where}: {name} has dtype {t.dtype}; expected one of {', '.join(str(d) for d in dtypes)}")
    if not t.is_contiguous():
        raise ValueError(f"{where}: {name} must be contiguous (call .contiguous())")


def check_pattern(ctx, where: str, pattern: str, spec: OpSpec, comm_programs=None) -> None:
    """Raise unless ``pattern`` is one of the op's and can run here (the NCCL baseline needs a GPU
    per rank), and ``comm_programs`` is None or a positive int.

    Example::

        check_pattern(ctx, f"{ctx.who()}: gemm_all_scatter", pattern, GEMM_ALL_SCATTER, comm_programs)
    """
    if pattern not in spec.pattern_names:
        raise ValueError(f"{where}: pattern={pattern!r} is not one of {spec.pattern_names}")
    if pattern == "baseline" and getattr(ctx, "ranks", None) is not None:
        raise ValueError(f"{where}: pattern='baseline' (torch.distributed over the whole world) cannot run in a "
                         f"group; pick one of trident's patterns")
    if pattern == "baseline" and ctx.platform.ranks_share_gpus:
        raise ValueError(f"{where}: pattern='baseline' needs one GPU per rank (NCCL cannot place "
                         f"{ctx.world_size} ranks on {ctx.platform.gpus_visible} GPU(s))")
    if comm_programs is not None and not (isinstance(comm_programs, int) and comm_programs >= 1):
        raise ValueError(f"{where}: comm_programs={comm_programs!r} must be a positive int")


def comm_span(trace):
    """``trace.span()`` (the block's device work as one communication event), or nothing when
    ``trace`` is None: how the bulk patterns show the library collective they call.

    Example::

        with comm_span(call.trace):
            trident.ccl.all_gather(ctx, a_full, A_local)
    """
    return contextlib.nullcontext() if trace is None else trace.span()
