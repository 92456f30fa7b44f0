"""Forward progress: a fused op finishes whichever of its programs run, and in whatever order.

On a GPU shared between ranks (MPS) a process may use only part of the SMs, and a kernel on
another stream may hold some of them when the op starts: the programs of one launch then do not
all run at once, nor necessarily in program-id order. The fused kernels take their roles from an
arrival ticket (docs/reliability.md, "Forward progress when the GPU is shared"), so a program
only ever waits on programs that started before it. Pinned here:

* the defaults scale with the SMs this process may use (``Platform.comm_programs``,
  ``split_roles``): pure functions, no ranks;
* in the simulator, where programs run one at a time (one "resident" program), every fused
  pattern of every op finishes with the right result for grids far larger than that, with each
  launch's programs run in program-id order, in reverse, and shuffled differently on every rank;
* on a GPU, while a kernel on another stream holds every SM of one rank as the op starts.
"""

import contextlib
import dataclasses
import random
import types

import pytest
import torch
import triton
import triton.language as tl

import trident.platform
from tests.helpers import SMALL, relative_error
from trident.device.leaves import now_ns
from trident.ops import OPS, MatmulConfig
from trident.ops.fused.call import FusedCall, split_roles
from trident.platform import SIM_COMM_PROGRAMS, SIM_SM_COUNT, Platform

TOL = 5e-3  # fp16 inputs, fp32 accumulation


# --- the defaults: pure functions of the platform ---------------------------------------------


def _gpu(sm_count: int, world_size: int = 8) -> Platform:
    """An H200 as a process sees it under MPS with ``sm_count`` SMs (what CUDA reports there)."""
    return Platform("cuda", torch.device("cuda", 0), sm_count, "NVIDIA H200", 1, world_size)


def test_comm_programs_take_at_most_a_quarter_of_the_sms():
    # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE 100 / 50 / 25 / 12 on an H200: 132 / 66 / 32 / 14 SMs reported
    assert [_gpu(sms).comm_programs(16) for sms in (132, 66, 32, 14)] == [16, 16, 8, 3]
    assert [_gpu(sms).comm_programs(3) for sms in (132, 14, 8)] == [3, 3, 2]  # a smaller default stays
    assert [_gpu(sms).comm_programs(16) for sms in (1, 2, 3, 4)] == [1, 1, 1, 1]  # at least one
    sim = Platform("sim", torch.device("cpu"), SIM_SM_COUNT, "cpu (simulator)", 0, 8)
    assert sim.comm_programs(16) == SIM_COMM_PROGRAMS


def _roles(platform: Platform, op: str, comm_work: int, other_work: int, comm_programs=None,
           cfg: MatmulConfig = SMALL) -> tuple[int, int]:
    """``split_roles`` for op ``op`` on ``platform`` (a call record needs only the platform here)."""
    spec = OPS[op]
    call = FusedCall(ctx=types.SimpleNamespace(platform=platform), spec=spec, pattern="workgroup_specialized",
                     A=None, B=None, C=None, cfg=cfg, comm_programs=comm_programs or spec.comm_programs(platform))
    return split_roles(call, comm_work=comm_work, other_work=other_work)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_split_roles_leaves_the_gemm_the_most_programs_on_14_sms(op, world_size):
    """The 8-rank MPS case of issue 21: 14 SMs used to leave 13 communication programs and one GEMM program."""
    platform = _gpu(14, world_size)
    for work in (16, 64, 1024):
        gemm, comm = _roles(platform, op, comm_work=work, other_work=work)
        assert 1 <= comm <= gemm and gemm + comm <= 14, (work, gemm, comm)


def test_split_roles_honours_an_explicit_comm_programs_up_to_all_but_one_program():
    assert _roles(_gpu(14), "gemm_all_scatter", 1024, 1024) == (11, 3)  # the default
    assert _roles(_gpu(132), "gemm_all_scatter", 1024, 1024) == (116, 16)  # a whole H200: as before
    assert _roles(_gpu(14), "gemm_all_scatter", 1024, 1024, comm_programs=6) == (8, 6)
    assert _roles(_gpu(14), "gemm_all_scatter", 1024, 1024, comm_programs=100) == (1, 13)
    assert _roles(_gpu(14), "gemm_all_scatter", 5, 1024, comm_programs=100) == (9, 5)  # no more than the work
    # a grid larger than the SMs is capped to them on a GPU, not in the simulator (one program at a time)
    many = dataclasses.replace(SMALL, programs=40)
    assert _roles(_gpu(14), "gemm_all_scatter", 1024, 1024, cfg=many) == (11, 3)
    sim = Platform("sim", torch.device("cpu"), SIM_SM_COUNT, "cpu (simulator)", 0, 2)
    assert _roles(sim, "gemm_all_scatter", 1024, 1024, cfg=many) == (38, 2)


# --- the simulator: grids larger than what is resident, programs in any order ------------------

#: Every pattern that runs trident kernels, by op (``baseline`` is torch's).
FUSED = {
    "gemm_all_scatter": ("bulk_synchronous", "producer_consumer", "fused_sequential", "workgroup_specialized"),
    "all_gather_gemm": ("bulk_synchronous", "fused_sequential", "workgroup_specialized"),
    "gemm_reduce_scatter": ("bulk_synchronous", "fused_sequential", "workgroup_specialized"),
    "gemm_all_reduce": ("bulk_synchronous", "fused_sequential", "workgroup_specialized"),
}
#: (name, config, comm_programs): grids far larger than the one program the simulator runs at a time.
GRIDS = [
    ("comm_programs > tiles", SMALL, 64),
    ("programs > SMs", dataclasses.replace(SMALL, programs=3 * SIM_SM_COUNT), None),
    ("both", dataclasses.replace(SMALL, programs=3 * SIM_SM_COUNT), 64),
]
ORDERS = ("by_id", "reversed", "shuffled")


def _run_order(order: str, programs: int, seed: int) -> list[int]:
    """Program ids in the order the simulator runs them (``seed`` picks the shuffle)."""
    ids = list(range(programs))
    if order == "reversed":
        ids.reverse()
    elif order == "shuffled":
        random.Random(1000 * seed + programs).shuffle(ids)
    return ids


@contextlib.contextmanager
def _programs_run_in(order: str, seed: int):
    """Inside the block, the simulator runs each launch's programs in ``order`` rather than by id:
    the k-th program to run gets program id ``_run_order(...)[k]``, as when a GPU makes programs
    resident in an order of its own."""
    if order == "by_id":  # what the simulator does anyway (and all a GPU run can ask for)
        yield
        return
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    by_id = builder.set_grid_idx

    def set_grid_idx(self, x, y, z):
        by_id(self, _run_order(order, self.grid_dim[0], seed)[x], y, z)

    builder.set_grid_idx = set_grid_idx
    try:
        yield
    finally:
        builder.set_grid_idx = by_id


def _problem(ctx, op: str, seed: int):
    """``(run, C, want)``: ``run(**kwargs)`` calls op ``op`` on fresh fp16 inputs, seeded the same on
    every rank (every rank builds the whole reference ``want``), into ``C`` poisoned with NaN.
    Small blocks of ``SMALL`` give each op several tiles (16 x 16) and row blocks, ragged at the edge."""
    import trident

    gen = torch.Generator().manual_seed(seed)
    w, r, dev = ctx.world_size, ctx.rank, ctx.device

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(torch.float16)

    if op == "gemm_all_scatter":  # C = A @ [B_0 | B_1 | ...]: my column block goes to every rank
        M, n, K = 40, 32, 16
        A, B = randn(M, K), randn(K, n * w)
        C = ctx.empty(M, n * w, dtype=torch.float16)
        args = (A.to(dev), B[:, r * n:(r + 1) * n].contiguous().to(dev), C)
        want = A.double() @ B.double()
    elif op == "all_gather_gemm":  # C = [A_0; A_1; ...] @ B: rows of A gathered
        m, N, K = 24, 32, 16
        A, B = randn(w * m, K), randn(K, N) + r
        C = torch.empty(w * m, N, dtype=torch.float16, device=dev)
        args = (ctx.as_symmetric(A[r * m:(r + 1) * m].to(dev)), B.to(dev), C)
        want = A.double() @ B.double()
    else:  # gemm_reduce_scatter (my rows of the sum) or gemm_all_reduce (all of it): K sharded
        m, N, K = 24, 32, 16
        rows = w * m if op == "gemm_reduce_scatter" else m
        A, B = randn(rows, w * K), randn(w * K, N)
        ks = slice(r * K, (r + 1) * K)
        want = A.double() @ B.double()
        if op == "gemm_reduce_scatter":
            want = want[r * m:(r + 1) * m]
        C = torch.empty(m, N, dtype=torch.float16, device=dev)
        args = (ctx.as_symmetric(A[:, ks].contiguous().to(dev)), B[ks].contiguous().to(dev), C)
    C.fill_(float("nan"))
    fn = getattr(trident.ops, op)
    return lambda **kwargs: fn(ctx, *args, **kwargs), C, want



def _any_order_body(ctx, op, pattern, orders, grids):
    """Each grid in each run order, one call after another on the same sync block (a launch that
    left its arrival count behind would hand the next one wrong roles): the errors."""
    errors = []
    rank_seed = ctx.rank + 1  # every rank starts its programs in an order of its own
    for order in orders:
        for name, cfg, comm_programs in grids:
            run, C, want = _problem(ctx, op, seed=len(errors))
            ctx.barrier()  # no peer stores into C before it is poisoned
            with _programs_run_in(order, rank_seed):
                run(pattern=pattern, config=cfg, comm_programs=comm_programs)
            ctx.barrier()
            errors.append((order, name, relative_error(C, want)))
    return errors


def _check(results, expected: int):
    for errors in results:
        assert len(errors) == expected
        for order, grid, err in errors:
            assert err < TOL, (order, grid, err)


needs_simulator = pytest.mark.skipif(not trident.platform.SIMULATOR,
                                     reason="the run order of a launch's programs is set only in the simulator")


@pytest.mark.parametrize("op,pattern", [(op, p) for op, patterns in FUSED.items() for p in patterns])
def test_every_fused_pattern_finishes_in_any_program_order(pool2, op, pattern):
    """In program-id order, in reverse and shuffled (differently on each rank), with grids larger
    than what is resident: a program waiting on a later one would wait out its timeout and fail.
    On a GPU the same grids run in whatever order the hardware starts the programs."""
    orders = ORDERS if trident.platform.SIMULATOR else ("by_id",)
    _check(pool2.run(_any_order_body, op, pattern, orders, GRIDS), len(orders) * len(GRIDS))


@needs_simulator
@pytest.mark.parametrize("op", ["gemm_all_scatter", "gemm_reduce_scatter"])
def test_workgroup_specialized_at_four_ranks_in_any_order(pool4, op):
    """Four ranks, each running its programs last to first, then each in an order of its own."""
    _check(pool4.run(_any_order_body, op, "workgroup_specialized", ("reversed", "shuffled"), GRIDS[2:]), 2)


def _collectives_body(ctx, orders):
    """Every collective and all_reduce_rmsnorm, each launch's programs in each order (a different
    shuffle on every rank): the k-th program to start on a rank must meet the k-th on every peer."""
    w, r = ctx.world_size, ctx.rank
    n = 5 * 1024 + 7  # more tiles than the simulator's programs: every program loops
    wrong = []
    for order in orders:
        x, gathered, part = ctx.zeros(n), torch.empty(w * n), torch.empty(n)
        big = ctx.zeros(w * n)
        with _programs_run_in(order, r + 1):
            for algorithm in ("one_shot", "two_shot"):
                x.fill_(r + 1.0)
                trident.ccl.all_reduce(ctx, x, algorithm=algorithm)
                if not torch.all(x == w * (w + 1) / 2):
                    wrong.append((order, "all_reduce " + algorithm))
            x.fill_(float(r))
            trident.ccl.all_gather(ctx, gathered, x)
            if not torch.equal(gathered, torch.arange(w, dtype=torch.float32).repeat_interleave(n)):
                wrong.append((order, "all_gather"))
            big.fill_(1.0)
            trident.ccl.reduce_scatter(ctx, part, big)
            if not torch.all(part == w):
                wrong.append((order, "reduce_scatter"))
            big.copy_(torch.arange(w * n, dtype=torch.float32) + 1e5 * r)
            exchanged = torch.empty(w * n)
            trident.ccl.all_to_all(ctx, exchanged, big)
            expect = torch.cat([torch.arange(r * n, (r + 1) * n, dtype=torch.float32) + 1e5 * p for p in range(w)])
            if not torch.equal(exchanged, expect):
                wrong.append((order, "all_to_all"))
            x.fill_(float(r))
            trident.ccl.broadcast(ctx, x, src=w - 1)
            if not torch.all(x == w - 1):
                wrong.append((order, "broadcast"))
            rows = ctx.zeros(9, 64)
            rows.fill_(1.0)
            out, h = trident.ops.all_reduce_rmsnorm(ctx, rows, torch.ones(64))
            if not (torch.all(h == w) and torch.allclose(out, torch.ones(9, 64), atol=1e-3)):
                wrong.append((order, "all_reduce_rmsnorm"))
        ctx.barrier()
    return wrong


@needs_simulator
def test_collectives_finish_whatever_order_each_rank_starts_its_programs_in(pool4):
    """Each rank runs each launch's programs in reverse, then in a shuffle of its own: program
    indices come from arrival tickets, so the ranks' programs still meet in pairs."""
    for wrong in pool4.run(_collectives_body, ("reversed", "shuffled")):
        assert not wrong, wrong


# --- a GPU: another kernel holds one rank's SMs when the op starts -----------------------------

#: How long the busy kernel keeps the SMs (its programs end one after another over this time).
BUSY_NS = 200_000_000


@triton.jit
def _busy_kernel(busy_ns):
    """Spin on the GPU clock: program i of n for ``(i + 1) / n`` of ``busy_ns``, so the SMs come
    free one by one and a kernel launched behind this one gets them a few at a time."""
    start = now_ns()
    until = start + busy_ns.to(tl.int64) * (tl.program_id(0) + 1) // tl.num_programs(0)
    t = start
    while t < until:
        t = now_ns()


def _busy_rank_body(ctx, cases):
    """For each rank in turn: that rank fills its SMs with the busy kernel on a side stream, then
    every rank runs each (op, pattern); the errors."""
    side = torch.cuda.Stream(ctx.device)
    # 512 threads a program, 4 programs an SM: every thread slot of every SM this process may use.
    busy_programs = 4 * ctx.platform.program_limit
    errors = []
    for busy_rank in range(ctx.world_size):
        for op, pattern in cases:
            run, C, want = _problem(ctx, op, seed=busy_rank)
            ctx.barrier()
            torch.cuda.synchronize(ctx.device)
            if ctx.rank == busy_rank:
                with torch.cuda.stream(side):
                    _busy_kernel[(busy_programs,)](BUSY_NS, num_warps=16)
            run(pattern=pattern, config=SMALL)  # small tiles: many programs in each role
            torch.cuda.synchronize(ctx.device)  # the op and the busy kernel
            ctx.barrier()  # raises a wait that gave up on any rank
            errors.append((f"busy rank {busy_rank}", op, pattern, relative_error(C, want)))
    return errors


@pytest.mark.skipif(trident.platform.SIMULATOR, reason="needs a GPU: the simulator runs one program at a "
                                                       "time and no other kernel beside it")
@pytest.mark.parametrize("world", [2, 4])
def test_ops_finish_while_another_kernel_holds_the_sms(request, world):
    cases = [("gemm_all_scatter", "workgroup_specialized"), ("gemm_all_scatter", "producer_consumer"),
             ("all_gather_gemm", "workgroup_specialized"),
             ("gemm_all_reduce", "bulk_synchronous"),      # a ccl all_reduce after the GEMM
             ("gemm_reduce_scatter", "bulk_synchronous")]  # a ccl reduce_scatter after the GEMM
    pool = request.getfixturevalue(f"pool{world}")  # the session's pool of that many ranks
    for errors in pool.run(_busy_rank_body, cases):
        assert len(errors) == world * len(cases)
        for busy, op, pattern, err in errors:
            assert err < TOL, (busy, op, pattern, err)
