"""trident.ccl: every collective against a torch reference at 2, 3 and 4 ranks, for every dtype, ragged
sizes and 2-D shapes, on heap and plain tensors (also chosen differently by each rank, and views that start
inside their storage); all_reduce's algorithms and ops; fp32 accumulation of half-precision sums, rounded once;
repeated and back-to-back calls on the same buffers; a new context's first call with a late rank; bad input;
CUDA-graph capture.

Each rank computes every rank's input itself (``_data`` is deterministic), so it checks its own result
against the torch reference in the rank and returns a list of what went wrong (empty when all is well).
Float inputs are multiples of 1/4 in [-4, 4], so every sum over 4 ranks is exact in every dtype and the
results must equal the references bit for bit; ints go beyond what float32 (int32) and float64 (int64)
hold exactly, so a detour through floats shows. Outputs are views of larger buffers whose tail must stay
untouched (writes past a ragged end show).
"""

import math
import re
import time

import pytest
import torch
import torch.distributed as dist

import trident
from tests.conftest import POOL_KWARGS, get_pool
from tests.helpers import assert_no_problems, capture_graph, run_graph_test
from trident import ccl

FLOATS = [torch.float16, torch.bfloat16, torch.float32]
DTYPES = FLOATS + [torch.int32, torch.int64]
ALGORITHMS = list(ccl.ALGORITHMS)  # the table's rows and "auto"
OPS = ["sum", "max", "min"]
REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
PLACES = ["heap", "plain", "mixed"]  # mixed: inputs on the heap, outputs plain torch tensors
# A rank's input of all_gather / all_reduce / broadcast: one element, ragged ends, one block, more tiles than
# the simulator's 4 programs (so programs loop), 2-D. Cases pair them with dtypes in rotation (5 and 6 are
# coprime), so each dtype meets several shapes without running the whole product.
SHAPES = [(1,), (4099,), (7,), (3, 37), (1000,), (33, 41)]
CHUNKS = [(1,), (1029,), (7,), (2, 37), (1001,), (33, 41)]  # one rank's chunk of reduce_scatter / all_to_all
GUARD = 5  # sentinel elements after every output
SENTINEL = -77


@pytest.fixture
def pool3():
    """Three ranks: an odd world size."""
    return get_pool(3)


@pytest.fixture(params=[2, 3, 4], ids=["2ranks", "3ranks", "4ranks"])
def world_pool(request):
    """Pools of 2, 3 and 4 ranks (tests using it run once for each)."""
    return get_pool(request.param)


# -- inputs, references and checks (used inside the ranks) -------------------------------------------


def _data(rank, shape, dtype, salt=0):
    """Rank ``rank``'s input: different on every rank and element, exact in every dtype when summed."""
    i = torch.arange(math.prod(shape), dtype=torch.int64)
    if dtype.is_floating_point:
        v = ((i * 7 + rank * 13 + salt * 5) % 33 - 16).to(torch.float64) / 4
    else:
        v = (i * 7919 + rank * 104729 + salt * 31337) % (1 << 28) - (1 << 27)
        if dtype == torch.int64:
            v = v * (1 << 31) + i % 1000 + rank  # more than float64's 53 bits
    return v.to(dtype).reshape(shape)


def _reduce(tensors, op):
    """The elementwise reduction of every rank's tensor; half-precision sums accumulate in fp32, rounded once."""
    stacked = torch.stack(tensors)
    if op == "sum":
        return (stacked.float() if stacked.dtype.is_floating_point else stacked).sum(0).to(stacked.dtype)
    return stacked.amax(0) if op == "max" else stacked.amin(0)


def _place(ctx, t, heap):
    """``t`` copied onto the heap, or a plain torch tensor on ``ctx.device``."""
    return ctx.as_symmetric(t) if heap else t.to(ctx.device).clone()


def _output(ctx, shape, dtype, heap):
    """A contiguous view of ``shape`` at the start of a buffer GUARD elements longer, filled with SENTINEL."""
    n = math.prod(shape)
    buf = ctx.full((n + GUARD,), SENTINEL, dtype=dtype) if heap else torch.full((n + GUARD,), SENTINEL, dtype=dtype,
                                                                                 device=ctx.device)
    return buf[:n].view(shape), buf


def _free(ctx, *tensors):
    ctx.free(*[t for t in tensors if ctx.is_symmetric(t)])


def _diff(what, got, want):
    """``[]`` when ``got`` equals ``want`` exactly (shape, dtype, values), else one line saying how it differs."""
    got = got.detach().cpu()
    if got.shape != want.shape or got.dtype != want.dtype:
        return [f"{what}: got shape {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}"]
    if torch.equal(got, want):
        return []
    bad = (got != want).nonzero()
    at = tuple(bad[0].tolist())
    return [f"{what}: {len(bad)} of {want.numel()} elements differ, first at {at}: got {got[at].item()}, "
            f"expected {want[at].item()}"]


def _check_output(what, result, out, buf, want):
    """The result is ``out``, equals ``want``, and nothing after it in its buffer was written."""
    problems = [] if result is out else [f"{what}: returned {type(result).__name__}, not the output tensor"]
    problems += _diff(what, out, want)
    tail = buf[out.numel():].cpu()
    if not torch.all(tail == SENTINEL):
        problems.append(f"{what}: wrote past the end of the output: {tail.tolist()}")
    return problems


def _all_reduce_case(ctx, what, inputs, heap, reduce_op, **call) -> list[str]:
    """``ccl.all_reduce(ctx, out, **call)`` in place, ``out`` a fresh heap or plain output holding my
    entry of ``inputs`` (every rank's), checked against their ``reduce_op`` reduction; the problems."""
    tensor, buf = _output(ctx, inputs[0].shape, inputs[0].dtype, heap)
    tensor.copy_(inputs[ctx.rank])
    result = ccl.all_reduce(ctx, tensor, **call)
    problems = _check_output(what, result, tensor, buf, _reduce(inputs, reduce_op))
    _free(ctx, buf)
    return problems


def _out_of_place_case(ctx, what, inputs, place, out_shape, call, want) -> list[str]:
    """``call(out, inp)``: ``inp`` my entry of ``inputs`` (every rank's) placed as ``place`` says, ``out``
    a fresh output of ``out_shape`` (on the heap for "heap"); checked against ``want``, with the input
    left unchanged; the problems."""
    inp = _place(ctx, inputs[ctx.rank], place != "plain")
    out, buf = _output(ctx, out_shape, inputs[0].dtype, place == "heap")
    result = call(out, inp)
    problems = _check_output(what, result, out, buf, want)
    problems += _diff(f"{what} (input changed)", inp, inputs[ctx.rank])
    _free(ctx, inp, buf)
    return problems


def _rotation(count):
    """``count`` (case number, dtype, shape index, placement) tuples, each in its own rotation."""
    return [(i, DTYPES[i % len(DTYPES)], i % len(SHAPES), PLACES[(i + i // len(SHAPES)) % 3]) for i in range(count)]


def _skew(ctx, step):
    """Let the ranks arrive at a call at different times (a different rank last at every step)."""
    time.sleep(0.02 * ((ctx.rank + step) % ctx.world_size))


# -- every collective, every dtype, ragged and 2-D shapes, heap and plain tensors ----------------------


def _all_gather_body(ctx):
    w, me, problems = ctx.world_size, ctx.rank, []
    for _, dtype, k, place in _rotation(8):
        shape = SHAPES[k]
        what = f"rank {me}/{w} all_gather {dtype} {shape} {place}"
        inputs = [_data(p, shape, dtype) for p in range(w)]
        problems += _out_of_place_case(ctx, what, inputs, place, (w * shape[0],) + shape[1:],
                                       lambda out, inp: ccl.all_gather(ctx, out, inp), torch.cat(inputs))
    return problems


def test_all_gather(world_pool):
    assert_no_problems(world_pool, _all_gather_body)


def _all_reduce_body(ctx):
    """Every op x dtype, each op with every algorithm (op given as a name or a ReduceOp in turn), shapes and
    placements rotating."""
    w, me, problems = ctx.world_size, ctx.rank, []
    for i, (op, dtype) in enumerate((o, d) for o in OPS for d in DTYPES):
        algorithm, shape, heap = ALGORITHMS[i % 3], SHAPES[(i + i // 3) % len(SHAPES)], i % 2 == 0
        what = f"rank {me}/{w} all_reduce {algorithm} {op} {dtype} {shape} {'heap' if heap else 'plain'}"
        inputs = [_data(p, shape, dtype) for p in range(w)]
        problems += _all_reduce_case(ctx, what, inputs, heap, op, op=REDUCE_OPS[op] if i % 4 == 1 else op,
                                     algorithm=algorithm)
    return problems


def test_all_reduce_every_op_dtype_and_algorithm(world_pool):
    assert_no_problems(world_pool, _all_reduce_body)


def _all_reduce_sizes_body(ctx):
    """Sums for each algorithm over the sizes that matter most to it, on the heap and in plain tensors."""
    w, me, problems = ctx.world_size, ctx.rank, []
    shapes = [(1,), (4099,), (7,), (33, 41)]  # fewer elements than ranks, programs looping, ragged, 2-D
    for i, (algorithm, shape) in enumerate((a, s) for a in ALGORITHMS for s in shapes):
        dtype, heap = [torch.bfloat16, torch.float32, torch.int64][i % 3], i % 2 == 1
        what = f"rank {me}/{w} all_reduce {algorithm} sum {dtype} {shape} {'heap' if heap else 'plain'}"
        inputs = [_data(p, shape, dtype, salt=i) for p in range(w)]
        problems += _all_reduce_case(ctx, what, inputs, heap, "sum", algorithm=algorithm)
    return problems


def test_all_reduce_every_algorithm_and_size(world_pool):
    assert_no_problems(world_pool, _all_reduce_sizes_body)


def _reduce_scatter_body(ctx):
    w, me, problems = ctx.world_size, ctx.rank, []
    for i, (op, dtype) in enumerate((o, d) for o in OPS for d in DTYPES):
        chunk, place = CHUNKS[i % len(CHUNKS)], PLACES[(i // 3) % 3]
        shape = (w * chunk[0],) + chunk[1:]
        what = f"rank {me}/{w} reduce_scatter {op} {dtype} in {shape} {place}"
        inputs = [_data(p, shape, dtype) for p in range(w)]
        call_op = REDUCE_OPS[op] if i % 4 == 3 else op
        problems += _out_of_place_case(ctx, what, inputs, place, chunk,
                                       lambda out, inp, op=call_op: ccl.reduce_scatter(ctx, out, inp, op=op),
                                       _reduce(inputs, op).split(chunk[0])[me])
    return problems


def test_reduce_scatter(world_pool):
    assert_no_problems(world_pool, _reduce_scatter_body)


def _all_to_all_body(ctx):
    w, me, problems = ctx.world_size, ctx.rank, []
    for _, dtype, k, place in _rotation(8):
        chunk = CHUNKS[k]
        shape = (w * chunk[0],) + chunk[1:]
        what = f"rank {me}/{w} all_to_all {dtype} {shape} {place}"
        inputs = [_data(p, shape, dtype) for p in range(w)]
        want = torch.cat([inputs[p].split(chunk[0])[me] for p in range(w)])
        problems += _out_of_place_case(ctx, what, inputs, place, shape,
                                       lambda out, inp: ccl.all_to_all(ctx, out, inp), want)
    return problems


def test_all_to_all(world_pool):
    assert_no_problems(world_pool, _all_to_all_body)


def _split_patterns(w):
    """``sends[p][q]``: rows rank p sends to rank q, for several patterns (zeros included)."""
    return {
        "uneven": [[(p * 3 + q * 5 + 1) % 4 for q in range(w)] for p in range(w)],
        "ring": [[5 if q == (p + 1) % w else 0 for q in range(w)] for p in range(w)],
        "large": [[600 + 37 * p - 11 * q for q in range(w)] for p in range(w)],
        # rank 0 sends nothing, nobody sends to the last rank (it receives zero rows)
        "silent": [[0 if p == 0 or q == w - 1 else p + q for q in range(w)] for p in range(w)],
    }


def _all_to_all_v_body(ctx, patterns):
    w, me, problems = ctx.world_size, ctx.rank, []
    cases = [(name, sends, cols, dtype) for name, sends in _split_patterns(w).items() if name in patterns
             for cols, dtype in (((), torch.float16), ((3,), torch.float32), ((2,), torch.int64))]
    for i, (name, sends, cols, dtype) in enumerate(cases):
        place = PLACES[i % 3]
        in_splits = sends[me]
        out_splits = [sends[p][me] for p in range(w)]
        if i % 4 == 1:
            in_splits, out_splits = torch.tensor(in_splits), torch.tensor(out_splits, dtype=torch.int32)
        what = f"rank {me}/{w} all_to_all_v {name} {dtype} cols={cols} {place} splits={sends}"
        inputs = [_data(p, (sum(sends[p]),) + cols, dtype) for p in range(w)]
        rows = max(max(sum(s) for s in sends), max(sum(s[q] for s in sends) for q in range(w)))
        # heap buffers are as large on every rank (allocation is collective); views give each rank its rows
        in_full, in_buf = _output(ctx, (rows,) + cols, dtype, place != "plain")
        inp = in_full[:sum(sends[me])]
        inp.copy_(inputs[me])
        full, buf = _output(ctx, (rows,) + cols, dtype, place == "heap")
        out = full[:sum(sends[p][me] for p in range(w))]
        if place == "plain":  # sizes differ between ranks, so inputs cannot be staged: they must be on the heap
            try:
                ccl.all_to_all_v(ctx, out, inp, out_splits, in_splits)
                problems.append(f"{what}: a plain (non-heap) input was accepted")
            except trident.NotSymmetricError as exc:
                if "must lie on the heap" not in str(exc):
                    problems.append(f"{what}: unclear error {exc}")
            _free(ctx, in_buf, buf)
            continue
        result = ccl.all_to_all_v(ctx, out, inp, out_splits, in_splits)
        want = torch.cat([inputs[p].split(sends[p])[me] for p in range(w)])
        problems += _check_output(what, result, out, buf, want)  # the rest of buf must keep its sentinels
        problems += _diff(f"{what} (input changed)", inp, inputs[me])
        _free(ctx, in_buf, buf)
    return problems


def test_all_to_all_v(world_pool):
    assert_no_problems(world_pool, _all_to_all_v_body, ["uneven", "ring", "large"])


def test_all_to_all_v_with_a_rank_that_sends_nothing_and_one_that_receives_nothing(world_pool):
    assert_no_problems(world_pool, _all_to_all_v_body, ["silent"])


def _broadcast_body(ctx):
    """In place, and (every other case) into ``out`` on the other placement, ``tensor`` left as it was."""
    w, me, problems = ctx.world_size, ctx.rank, []
    for i, dtype, k, place in _rotation(8):
        shape, src, heap, into = SHAPES[k], (i + w - 1) % w, place != "plain", i % 2 == 1
        what = (f"rank {me}/{w} broadcast src={src} {dtype} {shape} {'heap' if heap else 'plain'}"
                + (f" into a {'plain' if heap else 'heap'} out" if into else ""))
        tensor, buf = _output(ctx, shape, dtype, heap)
        tensor.copy_(_data(me, shape, dtype))
        if into:
            out, out_buf = _output(ctx, shape, dtype, not heap)
            result = ccl.broadcast(ctx, tensor, src, out=out)
            problems += _check_output(what, result, out, out_buf, _data(src, shape, dtype))
            problems += _diff(f"{what} (tensor changed)", tensor, _data(me, shape, dtype))
            _free(ctx, out_buf)
        else:
            result = ccl.broadcast(ctx, tensor, src)
            problems += _check_output(what, result, tensor, buf, _data(src, shape, dtype))
        _free(ctx, buf)
    return problems


def test_broadcast(world_pool):
    assert_no_problems(world_pool, _broadcast_body)


# -- precision ---------------------------------------------------------------------------------------


def _half_precision_body(ctx):
    """Sums of fp16/bf16 accumulate in fp32 and are rounded once, to nearest even.

    Element i is +-1 on rank b = i % w, +-h (half an ulp of 1) on rank b+1, +-x on rank b+2, 0 elsewhere.
    First half, x = h: the exact sum 1 + 2h = 1 + ulp is representable, but adding one term at a time in
    fp16/bf16 loses each h next to the 1 (a tie, rounded to even). Second half, x = 2h: the exact sum
    1 + 1.5 ulp must round to nearest even, 1 + 2 ulp (truncating would give 1 + ulp)."""
    w, me, problems = ctx.world_size, ctx.rank, []
    n = 24 * w
    i = torch.arange(n)
    sign = 1 - 2 * ((i // w) % 2)
    for dtype, h in ((torch.float16, 2.0 ** -11), (torch.bfloat16, 2.0 ** -8)):
        x = torch.where(i < n // 2, h, 2 * h)
        inputs = [(torch.where(i % w == p, 1.0, 0.0) + torch.where((i + 1) % w == p, h, 0.0)
                   + torch.where((i + 2) % w == p, x, 0.0)) * sign for p in range(w)]
        inputs = [t.to(dtype) for t in inputs]
        want = _reduce(inputs, "sum")
        naive = inputs[0].clone()
        for t in inputs[1:]:
            naive += t
        assert not torch.equal(naive[:n // 2], want[:n // 2]), "the inputs do not tell fp32 from fp16 accumulation"
        assert torch.all(want[n // 2:].abs() == 1 + 4 * h), "the exact sums do not round up to even"
        results = []
        for k, algorithm in enumerate(ALGORITHMS):
            tensor, buf = _output(ctx, (n,), dtype, k != 1)
            tensor.copy_(inputs[me])
            ccl.all_reduce(ctx, tensor, algorithm=algorithm)
            results.append((f"all_reduce {algorithm}", tensor.cpu().clone(), want))
            _free(ctx, buf)
        inp = ctx.as_symmetric(inputs[me])
        out = ctx.zeros(n // w, dtype=dtype)
        ccl.reduce_scatter(ctx, out, inp)
        results.append(("reduce_scatter", out.cpu().clone(), want.split(n // w)[me]))
        _free(ctx, inp, out)
        for name, got, expected in results:
            # where the second half starts in what this rank got (reduce_scatter: its chunk of the elements)
            half = n // 2 if name.startswith("all_reduce") else max(0, min(n // w, n // 2 - me * (n // w)))
            problems += _diff(f"rank {me}/{w} {name} {dtype} accumulation in fp32", got[:half], expected[:half])
            problems += _diff(f"rank {me}/{w} {name} {dtype} rounding to nearest even", got[half:], expected[half:])
    return problems


@pytest.mark.parametrize("world", [3, 4])  # with two ranks, a single addition rounds once anyway
def test_half_precision_sums_accumulate_in_fp32_and_round_once(world):
    pool = get_pool(world)
    results = pool.run(_half_precision_body)
    assert results == [[]] * world, "\n".join(results[0])


# -- repeated and back-to-back calls on the same buffers ---------------------------------------------


def _rounds_body(ctx, rounds):
    """Each round all-reduces the same tensor in place; the next round's input is the result plus the rank,
    negated, written at once (while slower ranks may still be in the call), with ranks arriving skewed."""
    w, me, problems = ctx.world_size, ctx.rank, []
    for k, (algorithm, dtype) in enumerate(zip(ALGORITHMS, (torch.bfloat16, torch.int32, torch.float16))):
        heap, shape = k % 2 == 0, [(1000,), (5, 41)][k % 2]
        tensor, buf = _output(ctx, shape, dtype, heap)
        inputs = [_data(p, shape, dtype, salt=k) for p in range(w)]
        tensor.copy_(inputs[me])
        for r in range(rounds):
            if k or r:  # the first call of a task is test_first_collective_with_a_late_rank's business
                _skew(ctx, r + k)
            result = ccl.all_reduce(ctx, tensor, algorithm=algorithm)
            want = _reduce(inputs, "sum")
            problems += _check_output(f"rank {me}/{w} {algorithm} {dtype} round {r}", result, tensor, buf, want)
            tensor.add_(me).neg_()
            inputs = [(want + p).neg_() for p in range(w)]
        _free(ctx, buf)
    return problems


def test_repeated_all_reduce_on_the_same_buffer(world_pool):
    assert_no_problems(world_pool, _rounds_body, 3)


def _chain_body(ctx, where):
    """Different collectives back to back on the same buffers, no barrier between them, ranks skewed; each
    step's output is a later step's input and is overwritten by the next step while slower ranks may still
    be in the call. Every rank tracks every rank's buffers to know what to expect."""
    w, me, problems, steps = ctx.world_size, ctx.rank, [], []
    c, dtype = 301, torch.float32
    a, a_buf = _output(ctx, (w * c,), dtype, where == "heap")
    b, b_buf = _output(ctx, (c,), dtype, where == "heap")
    d, d_buf = _output(ctx, (w * c,), dtype, where == "heap")

    def step(name, call, out, want):
        if steps:  # the first call of a task is test_first_collective_with_a_late_rank's business
            _skew(ctx, len(steps))
        what = f"rank {me}/{w} {where} step {len(steps)} {name}"
        if call() is not out:
            problems.append(f"{what}: did not return its output tensor")
        problems.extend(_diff(what, out, want))
        steps.append(name)

    A = [_data(p, (w * c,), dtype) for p in range(w)]  # every rank's a as it should be
    a.copy_(A[me])
    S = _reduce(A, "sum")
    step("reduce_scatter sum", lambda: ccl.reduce_scatter(ctx, b, a), b, S.split(c)[me])
    A = [S] * w
    step("all_gather", lambda: ccl.all_gather(ctx, a, b), a, S)
    D = [torch.cat([A[p].split(c)[r] for p in range(w)]) for r in range(w)]  # rank r: chunk r of S, w times
    step("all_to_all", lambda: ccl.all_to_all(ctx, d, a), d, D[me])
    D = [_reduce(D, "max")] * w
    step("all_reduce max one_shot", lambda: ccl.all_reduce(ctx, d, op="max", algorithm="one_shot"), d, D[me])
    a.copy_(_data(me, (w * c,), dtype, salt=1))
    A = [_data(w - 1, (w * c,), dtype, salt=1)] * w
    step("broadcast", lambda: ccl.broadcast(ctx, a, w - 1), a, A[me])
    d.add_(me)
    D = [_reduce([t + p for p, t in enumerate(D)], "sum")] * w
    step("all_reduce sum two_shot", lambda: ccl.all_reduce(ctx, d, algorithm="two_shot"), d, D[me])
    # uneven all_to_all_v from the start of d into the start of a, then the min of a scattered into b
    sends = [[(p + 2 * q) % 3 * 50 for q in range(w)] for p in range(w)]
    rows = [sum(s[r] for s in sends) for r in range(w)]
    received = [torch.cat([D[p][:sum(sends[p])].split(sends[p])[r] for p in range(w)]) for r in range(w)]
    A = [torch.cat([received[r], A[r][rows[r]:]]) for r in range(w)]  # the rest of a keeps the broadcast
    a_head = a[:rows[me]]
    e = d if where == "heap" else ctx.as_symmetric(d)  # all_to_all_v takes only heap inputs
    step("all_to_all_v", lambda: ccl.all_to_all_v(ctx, a_head, e[:sum(sends[me])], [s[me] for s in sends],
                                                  sends[me]), a_head, received[me])
    problems.extend(_diff(f"rank {me}/{w} {where} all of a after all_to_all_v", a, A[me]))
    step("reduce_scatter min", lambda: ccl.reduce_scatter(ctx, b, a, op="min"), b, _reduce(A, "min").split(c)[me])
    for name, buf, t in (("a", a_buf, a), ("b", b_buf, b), ("d", d_buf, d)):
        if not torch.all(buf[t.numel():].cpu() == SENTINEL):
            problems.append(f"rank {me}/{w} {where}: wrote past the end of {name}")
    _free(ctx, a_buf, b_buf, d_buf, *([] if e is d else [e]))
    return problems, steps


@pytest.mark.parametrize("where", ["heap", "plain"])
def test_back_to_back_collectives_on_the_same_buffers(world_pool, where):
    results = world_pool.run(_chain_body, where)
    assert [problems for problems, _ in results] == [[]] * world_pool.world_size, results
    assert len(results[0][1]) == 8


def _offset_views_body(ctx):
    """Outputs and inputs that start an odd number of elements into their storage (not 16-byte aligned)."""
    w, me, problems = ctx.world_size, ctx.rank, []
    n, dtype = 1003, torch.float16
    inputs = [_data(p, (w * n,), dtype) for p in range(w)]
    for where in ("heap", "plain"):
        big_in, in_buf = _output(ctx, (w * n + 3,), dtype, where == "heap")
        inp = big_in[3:]
        inp.copy_(inputs[me])
        big_out, buf = _output(ctx, (w * n + 1,), dtype, where == "heap")
        out, tail = big_out[1:], buf[1:]
        result = ccl.all_gather(ctx, out, inp[:n])
        problems += _check_output(f"{where} all_gather", result, out, tail, torch.cat([t[:n] for t in inputs]))
        out.copy_(inputs[me])
        result = ccl.all_reduce(ctx, out, algorithm="two_shot")
        problems += _check_output(f"{where} all_reduce two_shot", result, out, tail, _reduce(inputs, "sum"))
        out.copy_(inputs[me])
        result = ccl.all_reduce(ctx, out, op="min", algorithm="one_shot")
        problems += _check_output(f"{where} all_reduce one_shot", result, out, tail, _reduce(inputs, "min"))
        result = ccl.reduce_scatter(ctx, out[:n], inp, op="max")
        problems += _diff(f"{where} reduce_scatter", result, _reduce(inputs, "max").split(n)[me])
        result = ccl.all_to_all(ctx, out, inp)
        problems += _check_output(f"{where} all_to_all", result, out, tail,
                                  torch.cat([t.split(n)[me] for t in inputs]))
        problems += _diff(f"{where} broadcast", ccl.broadcast(ctx, inp, 1), inputs[1])
        problems += _diff(f"{where} element before the output", big_out[:1], torch.full((1,), SENTINEL, dtype=dtype))
        _free(ctx, in_buf, buf)
    return problems


def test_views_that_start_inside_their_storage(pool3):
    assert_no_problems(pool3, _offset_views_body)


def _late_arrival_body(ctx, delay):
    """The first collectives of a new context with one rank arriving late: the others are already in the
    kernel, signalling into the late rank's heap, before the late rank has done anything."""
    w, me, problems = ctx.world_size, ctx.rank, []
    with trident.init(heap_size=1 << 22, timeout=60.0, wait_timeout=10.0) as fresh:
        x = fresh.as_symmetric(_data(me, (300,), torch.float32))
        g = fresh.zeros(w * 300)
        if me == w - 1:
            time.sleep(delay)
        ccl.all_reduce(fresh, x)
        problems += _diff(f"rank {me}/{w} all_reduce", x, _reduce([_data(p, (300,), torch.float32)
                                                                   for p in range(w)], "sum"))
        if me == 0:
            time.sleep(delay)
        ccl.all_gather(fresh, g, x)
        problems += _diff(f"rank {me}/{w} all_gather", g, x.cpu().repeat(w))
    return problems


def test_first_collective_with_a_late_rank(pool3):
    assert_no_problems(pool3, _late_arrival_body, 0.5)


def _placement_per_rank_body(ctx):
    """Each rank chooses for itself where its tensors live, as with torch.distributed: rank 0 passes heap
    tensors, the others plain ones; then every rank passes a different heap tensor (different offsets)."""
    w, me, problems = ctx.world_size, ctx.rank, []
    n, dtype = 1000, torch.float32
    inputs = [_data(p, (w * n,), dtype) for p in range(w)]
    heap_in, heap_t = ctx.as_symmetric(inputs[me]), ctx.zeros(w * n)
    pool_in = [ctx.zeros(w * n) for _ in range(w)]  # every rank allocates all of them
    for case in ("rank 0 heap, others plain", "different heap tensors"):
        def arg(heap_tensor, data):
            if case == "different heap tensors":  # rank r passes pool_in[r]; its other pool tensors hold junk
                for t in pool_in:
                    t.fill_(SENTINEL)
                return pool_in[me].copy_(data)
            return heap_tensor.copy_(data) if me == 0 else data.to(ctx.device).clone()  # .to(cpu) is no copy
        what = f"rank {me}/{w} {case}"
        out = torch.zeros(w * w * n, dtype=dtype, device=ctx.device)
        ccl.all_gather(ctx, out, arg(heap_in, inputs[me]))
        problems += _diff(f"{what}: all_gather", out, torch.cat(inputs))
        for algorithm in ("one_shot", "two_shot"):
            t = arg(heap_t, inputs[me])
            ccl.all_reduce(ctx, t, algorithm=algorithm)
            problems += _diff(f"{what}: all_reduce {algorithm}", t, _reduce(inputs, "sum"))
        out = torch.zeros(n, dtype=dtype, device=ctx.device)
        ccl.reduce_scatter(ctx, out, arg(heap_in, inputs[me]))
        problems += _diff(f"{what}: reduce_scatter", out, _reduce(inputs, "sum").split(n)[me])
        out = torch.zeros(w * n, dtype=dtype, device=ctx.device)
        ccl.all_to_all(ctx, out, arg(heap_in, inputs[me]))
        problems += _diff(f"{what}: all_to_all", out, torch.cat([t.split(n)[me] for t in inputs]))
        t = arg(heap_t, inputs[me])
        ccl.broadcast(ctx, t, 0)
        problems += _diff(f"{what}: broadcast from 0", t, inputs[0])
        t = arg(heap_t, inputs[me])
        ccl.broadcast(ctx, t, 1)
        problems += _diff(f"{what}: broadcast from 1", t, inputs[1])
    return problems


def test_each_rank_chooses_where_its_tensors_live(pool3):
    results = pool3.run(_placement_per_rank_body)
    assert results == [[]] * 3, results


# -- bad input -----------------------------------------------------------------------------------------


def _size(t):
    """A pattern matching ``t``'s shape as a tuple, a list or a torch.Size, or its number of elements."""
    shape = tuple(t.shape)
    forms = [re.escape(str(shape)), re.escape(str(list(shape))), rf"(?<![\d.]){t.numel()}(?![\d.])"]
    return "|".join(forms)


def _errors_body(ctx):
    w, me, dev = ctx.world_size, ctx.rank, ctx.device
    f32 = {"dtype": torch.float32, "device": dev}
    n = 13

    def filled(*shape, dtype=torch.float32):
        return torch.full(shape, SENTINEL, dtype=dtype, device=dev)

    inp = torch.ones(n, **f32)
    heap_out = ctx.full((w * n + 1,), SENTINEL, dtype=torch.float32)
    meta = torch.empty(n, device="meta")
    t_inp = torch.ones(3, n, **f32).t()  # (n, 3), not contiguous
    t_out = filled(3, w * n).t()
    rows = ctx.ones(w * 4 + 1)  # all_to_all_v takes only heap inputs: checks of its splits need one
    bad = {
        "all_gather out too large": (lambda o: ccl.all_gather(ctx, o, inp), filled(w * n + 1), [_size]),
        "all_gather heap out too large": (lambda o: ccl.all_gather(ctx, o, inp), heap_out, [_size]),
        "all_gather out too small": (lambda o: ccl.all_gather(ctx, o, inp), filled(w * n - 1), [_size]),
        "all_gather dtypes": (lambda o: ccl.all_gather(ctx, o, inp), filled(w * n, dtype=torch.float16),
                              ["float16", "float32"]),
        "all_gather meta input": (lambda o: ccl.all_gather(ctx, o, meta), filled(w * n), ["meta"]),
        "all_gather meta output": (lambda o: ccl.all_gather(ctx, torch.empty(w * n, device="meta"), inp),
                                   filled(1), ["meta"]),
        "all_gather strided input": (lambda o: ccl.all_gather(ctx, o, t_inp), filled(w * n, 3), ["contiguous"]),
        "all_gather strided output": (lambda o: ccl.all_gather(ctx, o, torch.ones(n, 3, **f32)), t_out,
                                      ["contiguous"]),
        "all_reduce op prod": (lambda o: ccl.all_reduce(ctx, o, op="prod"), filled(n), ["prod"]),
        "all_reduce ReduceOp.PRODUCT": (lambda o: ccl.all_reduce(ctx, o, op=dist.ReduceOp.PRODUCT), filled(n),
                                        ["prod"]),
        "all_reduce algorithm": (lambda o: ccl.all_reduce(ctx, o, algorithm="ring"), filled(n), ["ring"]),
        "all_reduce meta": (lambda o: ccl.all_reduce(ctx, meta), filled(1), ["meta"]),
        "all_reduce strided": (lambda o: ccl.all_reduce(ctx, o), filled(3, n).t(), ["contiguous"]),
        "reduce_scatter out too large": (lambda o: ccl.reduce_scatter(ctx, o, inp.repeat(w)), filled(n + 1),
                                         [_size]),
        "reduce_scatter dtypes": (lambda o: ccl.reduce_scatter(ctx, o, inp.repeat(w)),
                                  filled(n, dtype=torch.bfloat16), ["bfloat16", "float32"]),
        "reduce_scatter op": (lambda o: ccl.reduce_scatter(ctx, o, inp.repeat(w), op="prod"), filled(n), ["prod"]),
        "reduce_scatter meta input": (lambda o: ccl.reduce_scatter(ctx, o, torch.empty(w * n, device="meta")),
                                      filled(n), ["meta"]),
        "reduce_scatter strided input": (lambda o: ccl.reduce_scatter(ctx, o, torch.ones(3, w * n, **f32).t()),
                                         filled(n, 3), ["contiguous"]),
        "all_to_all out too small": (lambda o: ccl.all_to_all(ctx, o, inp.repeat(w)), filled(w * n - 1), [_size]),
        "all_to_all rows not divisible": (lambda o: ccl.all_to_all(ctx, o, torch.ones(w * n + 1, **f32)),
                                          filled(w * n + 1), [lambda o: _size(o) + "|divisib"]),
        "all_to_all dtypes": (lambda o: ccl.all_to_all(ctx, o, inp.repeat(w)), filled(w * n, dtype=torch.int32),
                              ["int32", "float32"]),
        "all_to_all strided output": (lambda o: ccl.all_to_all(ctx, o, torch.ones(w * n, 3, **f32)),
                                      filled(3, w * n).t(), ["contiguous"]),
        "all_to_all_v in_splits sum": (lambda o: ccl.all_to_all_v(ctx, o, rows, [4] * w, [4] * w), filled(4 * w),
                                       ["in_splits"]),
        "all_to_all_v out_splits sum": (lambda o: ccl.all_to_all_v(ctx, o, rows[:4 * w], [4] * (w - 1) + [5],
                                                                   [4] * w), filled(4 * w), ["out_splits"]),
        "all_to_all_v splits length": (lambda o: ccl.all_to_all_v(ctx, o, rows[:4 * w], [4] * w + [0],
                                                                  [4] * w + [0]), filled(4 * w), ["split"]),
        "all_to_all_v plain input": (lambda o: ccl.all_to_all_v(ctx, o, torch.ones(w * 4, **f32), [4] * w,
                                                                [4] * w), filled(4 * w), ["must lie on the heap"]),
        "all_to_all_v dtypes": (lambda o: ccl.all_to_all_v(ctx, o, torch.ones(w * 4, **f32), [4] * w, [4] * w),
                                filled(4 * w, dtype=torch.int64), ["int64", "float32"]),
        "all_to_all_v meta": (lambda o: ccl.all_to_all_v(ctx, o, torch.empty(w * 4, device="meta"), [4] * w,
                                                         [4] * w), filled(4 * w), ["meta"]),
        "broadcast src too large": (lambda o: ccl.broadcast(ctx, o, w), filled(n), ["src", str(w)]),
        "broadcast src negative": (lambda o: ccl.broadcast(ctx, o, -1), filled(n), ["src", "-1"]),
        "broadcast meta": (lambda o: ccl.broadcast(ctx, meta, 0), filled(1), ["meta"]),
        "broadcast strided": (lambda o: ccl.broadcast(ctx, o, 0), filled(3, n).t(), ["contiguous"]),
        "broadcast out shape": (lambda o: ccl.broadcast(ctx, inp, 0, out=o), filled(n + 1), [_size]),
        "broadcast out overlaps": (lambda o: ccl.broadcast(ctx, o[1:], 0, out=o[:-1]), filled(n + 1), ["share memory"]),
    }
    problems = []
    for name, (call, out, wanted) in bad.items():
        try:
            call(out)
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, (ValueError, trident.TridentError)):
                problems.append(f"{name}: raised {message} (expected a ValueError or TridentError)")
            for fragment in wanted:  # regular expressions, or functions of the output giving one
                pattern = fragment(out) if callable(fragment) else fragment
                if not re.search(pattern, str(exc), re.IGNORECASE):
                    problems.append(f"{name}: the message does not name {pattern!r}: {message}")
        else:
            problems.append(f"{name}: no error")
        if out.device.type != "meta" and not torch.all(out.cpu() == SENTINEL):
            problems.append(f"{name}: the output was written before the error")
    # the ranks are still in step: valid calls work
    x = ctx.as_symmetric(_data(me, (100,), torch.float32))
    for algorithm in ALGORITHMS:
        x.copy_(_data(me, (100,), torch.float32))
        ccl.all_reduce(ctx, x, algorithm=algorithm)
        problems += _diff(f"all_reduce {algorithm} after the errors", x, _reduce(
            [_data(p, (100,), torch.float32) for p in range(w)], "sum"))
    g = torch.zeros(w * n, **f32)
    ccl.all_gather(ctx, g, inp)
    problems += _diff("all_gather after the errors", g, torch.ones(w * n))
    return problems


def test_bad_input_raises_before_anything_runs(pool3):
    results = pool3.run(_errors_body)
    assert results == [[]] * 3, "\n".join(results[0])


# -- CUDA graphs ---------------------------------------------------------------------------------------


def _graph_body(ctx, replays):
    if ctx.backend != "cuda":
        return "skipped"
    w, me, problems = ctx.world_size, ctx.rank, []
    n = 3001
    one, two = ctx.zeros(n), ctx.zeros(n, dtype=torch.bfloat16)
    g_in, g_out = ctx.zeros(n, dtype=torch.float16), ctx.zeros(w * n, dtype=torch.float16)

    def fill(salt):
        one.copy_(_data(me, (n,), torch.float32, salt))
        two.copy_(_data(me, (n,), torch.bfloat16, salt))
        g_in.copy_(_data(me, (n,), torch.float16, salt))

    def step():
        ccl.all_reduce(ctx, one, algorithm="one_shot")
        ccl.all_reduce(ctx, two, algorithm="two_shot")
        ccl.all_gather(ctx, g_out, g_in)

    def check(what, salt):
        for name, t, dtype in (("one_shot", one, torch.float32), ("two_shot", two, torch.bfloat16)):
            want = _reduce([_data(p, (n,), dtype, salt) for p in range(w)], "sum")
            problems.extend(_diff(f"rank {me}/{w} {what} all_reduce {name}", t, want))
        want = torch.cat([_data(p, (n,), torch.float16, salt) for p in range(w)])
        problems.extend(_diff(f"rank {me}/{w} {what} all_gather", g_out, want))

    fill(0)
    step()  # compile and set up outside the capture
    torch.cuda.synchronize()
    check("warm-up", 0)
    ctx.barrier()
    graph = capture_graph(step)
    ctx.barrier()
    for r in range(1, replays + 1):
        fill(r)  # the inputs change in place between replays
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        check(f"replay {r}", r)
    ctx.barrier()
    return problems


def test_cuda_graph_capture(world_pool):
    results = run_graph_test(world_pool, _graph_body, 3)
    assert results == [[]] * world_pool.world_size, results


@pytest.mark.parametrize("world", [5, 6])
def test_every_collective_back_to_back_at_5_and_6_ranks(world):
    """World sizes that are neither 2, 3 nor 4 (odd, and not a power of two): the whole chain once.
    Its own pool, closed at the end, so that 11 more rank processes do not stay up for the session."""
    from trident.testing import RankPool

    pool = RankPool(world, **POOL_KWARGS)
    try:
        results = pool.run(_chain_body, "plain")
    finally:
        pool.close()
    assert [problems for problems, _ in results] == [[]] * world, results
    assert len(results[0][1]) == 8


# -- every dtype, with ranks placing their tensors differently ----------------------------------------

MOVE_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.float16, torch.bfloat16, torch.float32,
               torch.float64, torch.int32, torch.int64]


def _any_data(rank, n, dtype):
    """Rank ``rank``'s ``n`` elements of ``dtype`` (bool too), different on every rank."""
    i = torch.arange(n, dtype=torch.int64)
    if dtype == torch.bool:
        return (i * 7 + rank) % 3 == 0
    return ((i * 7 + rank * 13) % 61 - 30).to(dtype)


def _mixed_placement_body(ctx, dtype):
    """Rank 0 passes heap tensors and the others plain ones, then every rank a different heap tensor:
    the data-movement collectives in ``dtype`` (reductions too where the dtype has them)."""
    w, me, n, problems = ctx.world_size, ctx.rank, 37, []
    inputs = [_any_data(p, w * n, dtype) for p in range(w)]
    heap_in = ctx.zeros(w * n, dtype=dtype)
    pool_in = [ctx.zeros(w * n, dtype=dtype) for _ in range(w)]  # every rank allocates all of them
    reducible = dtype not in (torch.bool, torch.float64)
    for case in ("rank 0 heap, others plain", "different heap tensors"):
        def arg(data):
            if case == "different heap tensors":
                return pool_in[me].copy_(data)
            return heap_in.copy_(data) if me == 0 else data.to(ctx.device).clone()
        what = f"rank {me}/{w} {dtype} {case}"
        out = torch.zeros(w * w * n, dtype=dtype, device=ctx.device)
        ccl.all_gather(ctx, out, arg(inputs[me]))
        problems += _diff(f"{what}: all_gather", out, torch.cat(inputs))
        out = torch.zeros(w * n, dtype=dtype, device=ctx.device)
        ccl.all_to_all(ctx, out, arg(inputs[me]))
        problems += _diff(f"{what}: all_to_all", out, torch.cat([t.split(n)[me] for t in inputs]))
        t = arg(inputs[me])
        ccl.broadcast(ctx, t, w - 1)
        problems += _diff(f"{what}: broadcast from {w - 1}", t, inputs[w - 1])
        if reducible:
            t = arg(inputs[me])
            ccl.all_reduce(ctx, t, op="max")
            problems += _diff(f"{what}: all_reduce max", t, torch.stack(inputs).amax(0))
    return problems


@pytest.mark.parametrize("dtype", MOVE_DTYPES, ids=str)
def test_every_dtype_with_ranks_placing_tensors_differently(pool3, dtype):
    assert_no_problems(pool3, _mixed_placement_body, dtype)
