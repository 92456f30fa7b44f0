"""The one small-call cache (trident.calls): a call with an earlier call's layout replays its recording.

Pinned here, for the collectives and the fused ops: a replay gives the same results as a full call
(new data, heap and plain tensors, every collective, every replayable pattern); new tensors every
call (fresh outputs, as a compiled model makes) still hit one entry; another layout, aliasing or
option makes its own entry; a bad call after good ones still raises; a buffer that grows (or a
heap_scope that ends) drops every entry recorded on it; the debug mode keeps nothing; a recording
holds no caller's tensor and memory stays flat; an op that launches on a tensor the recording
cannot bind fails at once.
"""

import gc
import weakref

import pytest
import torch

from tests.conftest import get_pool
from trident import ccl, ops, platform
from trident.calls import Recording, UnreplayableCall


def _plans(ctx) -> int:
    """Entries of the calls under test: device barriers (``ctx.barrier()``, a growing buffer's) are
    kept in the same cache, by whichever call ran them."""
    return sum(name != "device_barrier" for name in ctx.call_cache.ops())


def _filled(ctx, t, value):
    t.copy_(torch.full(t.shape, float(value), dtype=t.dtype))
    return t


def _repeat_every_collective(ctx, plain):
    """Each collective three times on the same buffers with new data each time; returns what went wrong."""
    w, r = ctx.world_size, ctx.rank
    make = (lambda *shape: torch.zeros(*shape, device=ctx.device)) if plain else (lambda *shape: ctx.zeros(*shape))
    x, gathered, part, inp, out = make(300), make(w * 40), make(40), make(w * 8), make(w * 8)
    wrong = []
    for step in range(3):
        _filled(ctx, x, r + step)
        ccl.all_reduce(ctx, x)
        if not torch.all(x == sum(range(w)) + w * step):
            wrong.append(f"all_reduce step {step}: {x[:3].tolist()}")
        ccl.all_gather(ctx, gathered, _filled(ctx, part, 10 * r + step))
        expect = torch.cat([torch.full((40,), 10.0 * p + step) for p in range(w)])
        if not torch.equal(gathered.cpu(), expect):
            wrong.append(f"all_gather step {step}")
        inp.copy_(torch.arange(w * 8, dtype=inp.dtype) + 100 * r + step)
        ccl.all_to_all(ctx, out, inp)
        expect = torch.cat([torch.arange(r * 8, r * 8 + 8, dtype=inp.dtype) + 100 * p + step for p in range(w)])
        if not torch.equal(out.cpu(), expect):
            wrong.append(f"all_to_all step {step}: {out.tolist()}")
        ccl.reduce_scatter(ctx, part, _filled(ctx, gathered, r + step))
        if not torch.all(part == sum(range(w)) + w * step):
            wrong.append(f"reduce_scatter step {step}")
        ccl.broadcast(ctx, _filled(ctx, x, r + step), src=w - 1)
        if not torch.all(x == w - 1 + step):
            wrong.append(f"broadcast step {step}")
    return wrong, _plans(ctx)


@pytest.mark.parametrize("plain", [False, True], ids=["heap", "plain"])
def test_repeated_calls_replay_their_plan_with_new_data(pool, plain):
    for wrong, plans in pool.run(_repeat_every_collective, plain):
        assert not wrong, wrong
        assert plans == 5  # one plan per collective: the second and third calls replayed it


def _all_to_all_v_new_splits(ctx):
    """all_to_all_v on the same buffers, the split sizes new or repeated from call to call, given on the
    host or the device (the rows each rank sends and receives in all stay the same; the simulator's
    "device" is the CPU, so there every call takes the host path): one entry,
    replayed with each call's splits. A host call repeating the last host splits uploads nothing; one
    after device splits (which rewrote the table) must upload them again."""
    w, r = ctx.world_size, ctx.rank

    def rows(sender, receiver, step):  # 3 for one receiver per sender (a new one each step), else 5
        return 3 if (receiver - sender - step) % w == 0 else 5

    total = 3 + 5 * (w - 1)
    inp, out, wrong = ctx.zeros(total, 2), torch.zeros(total, 2, device=ctx.device), []
    for step, on_device in [(0, False), (0, False), (1, False), (2, True), (1, False), (1, False)]:
        sends = [rows(r, p, step) for p in range(w)]
        inp.copy_(torch.cat([torch.full((sends[p], 2), 1000.0 * r + 10 * p + step) for p in range(w)]))
        receives = [rows(p, r, step) for p in range(w)]
        if on_device:
            sends, receives = (torch.tensor(v, device=ctx.device) for v in (sends, receives))
        ccl.all_to_all_v(ctx, out, inp, receives, sends)
        want = torch.cat([torch.full((rows(p, r, step), 2), 1000.0 * p + 10 * r + step) for p in range(w)])
        if not torch.equal(out.cpu(), want):
            wrong.append(f"step {step}: {out[:, 0].tolist()}")
    return wrong, _plans(ctx)


def test_all_to_all_v_replays_with_each_calls_split_sizes(pool):
    for wrong, entries in pool.run(_all_to_all_v_new_splits):
        assert not wrong, wrong
        assert entries == 1  # the splits are not in the key: the second and third calls replayed the first


def _other_memory_and_options(ctx):
    x = ctx.zeros(64)
    y = ctx.zeros(64)
    ccl.all_reduce(ctx, _filled(ctx, x, 1))
    ccl.all_reduce(ctx, _filled(ctx, y, 2))                     # other memory, one layout: the same entry
    ccl.all_reduce(ctx, _filled(ctx, x, 3), op="max")           # other option: its own plan
    results = [x.cpu().clone(), y.cpu().clone()]
    plans = _plans(ctx)
    try:
        ccl.all_reduce(ctx, x, op="prod")                       # a bad option after good calls still raises
        raised = ""
    except ValueError as exc:
        raised = str(exc)
    return results, plans, raised


def test_a_plan_is_only_replayed_for_its_own_memory_and_options(pool2):
    for (x, y), plans, raised in pool2.run(_other_memory_and_options):
        assert torch.all(x == 3) and torch.all(y == 4)
        assert plans == 2
        assert "not supported" in raised


def _growth_drops_plans(ctx):
    small = torch.zeros(16, device=ctx.device)
    ccl.all_reduce(ctx, _filled(ctx, small, 1))                 # plain: staged through the input buffer
    before = _plans(ctx)
    big = torch.zeros(1 << 16, device=ctx.device)
    ccl.all_reduce(ctx, _filled(ctx, big, 1))                   # the input buffer grows: plans dropped
    after = _plans(ctx)
    ccl.all_reduce(ctx, _filled(ctx, small, 2))                 # recorded afresh on the new buffer
    return before, after, small.cpu().clone(), big[:4].cpu().clone()


def test_a_growing_buffer_drops_every_plan(pool2):
    for before, after, small, big in pool2.run(_growth_drops_plans):
        assert before == 1 and after == 1  # the big call's plan only
        assert torch.all(small == 4) and torch.all(big == 2)


def _grown_inside_a_heap_scope(ctx):
    n = 1 << 14
    x = torch.ones(8, device=ctx.device)
    ccl.all_reduce(ctx, x)                                      # the workspace, made outside any scope
    with ctx.heap_scope():
        ccl.all_reduce(ctx, torch.ones(n, device=ctx.device))   # its input buffer grows inside the scope
    ccl.all_reduce(ctx, _filled(ctx, x, 1))                     # a replay must not use the freed buffer
    user = ctx.full((n,), 7.0)                                  # memory the scope gave back, reused
    big = torch.ones(n, device=ctx.device)
    ccl.all_reduce(ctx, big)                                    # stages its input: not into `user`
    return float(user.min()), float(user.max()), float(big.min()), float(x.min())


def test_a_buffer_that_grew_inside_a_heap_scope_is_let_go_with_the_scope(pool2):
    """The scope frees what was allocated inside it, also a buffer of an older resource that grew
    there: the buffer lets go of that memory (and its plans), so nothing writes to it afterwards."""
    for user_min, user_max, big, x in pool2.run(_grown_inside_a_heap_scope):
        assert (user_min, user_max) == (7.0, 7.0), "the collectives' buffer overwrote a user tensor"
        assert big == 2.0 and x == 2.0


def _debug_records_nothing(ctx):
    x = ctx.zeros(32)
    for step in range(2):
        ccl.all_reduce(ctx, _filled(ctx, x, step))
    return _plans(ctx), x.cpu().clone()


def test_the_debug_mode_records_no_plan():
    for plans, x in get_pool(2, TRIDENT_DEBUG="1").run(_debug_records_nothing):
        assert plans == 0 and torch.all(x == 2)


def _growth_in_capture(ctx):
    import trident.runtime.resources as resources

    x = torch.zeros(16, device=ctx.device)
    ccl.all_reduce(ctx, _filled(ctx, x, 1))            # the buffers for 16 elements exist now
    real = resources._capturing
    resources._capturing = lambda _ctx: True           # as if the stream were being captured
    try:
        ccl.all_reduce(ctx, _filled(ctx, x, 2))        # same sizes: no growth, fine while capturing
        try:
            ccl.all_reduce(ctx, torch.zeros(1 << 16, device=ctx.device))
            refused = ""
        except Exception as exc:  # noqa: BLE001  (the type is checked below)
            refused = f"{type(exc).__name__}: {exc}"
    finally:
        resources._capturing = real
    return float(x[0]), refused


def test_a_buffer_never_grows_inside_cuda_graph_capture(pool2):
    """Growing would free memory that captured work uses: the call is refused with what to do."""
    for value, refused in pool2.run(_growth_in_capture):
        assert value == 4
        assert refused.startswith("TridentError") and "once before capturing" in refused


# -- the fused ops -----------------------------------------------------------------------------------------


def _repeat(ctx):
    w, r = ctx.world_size, ctx.rank
    dtype = torch.float32
    A, B_local, C = torch.zeros(32, 16, device=ctx.device), torch.zeros(16, 8, device=ctx.device), ctx.zeros(32, 8 * w)
    wrong = []
    for step in range(3):
        A.copy_(torch.full((32, 16), float(step + 1)))
        B_local.copy_(torch.full((16, 8), float(r + 1)))
        ops.gemm_all_scatter(ctx, A, B_local, C, pattern="fused_sequential")
        expect = torch.cat([torch.full((32, 8), 16.0 * (step + 1) * (p + 1), dtype=dtype) for p in range(w)], dim=1)
        if not torch.equal(C.cpu(), expect):
            wrong.append(f"step {step}")
    entries = _plans(ctx)
    A2 = torch.ones(32, 16, device=ctx.device)
    ops.gemm_all_scatter(ctx, A2, B_local, C, pattern="producer_consumer")  # other memory: a second entry
    entries2 = _plans(ctx)
    try:
        ops.gemm_all_scatter(ctx, A, B_local, C, pattern="no_such_pattern")
        raised = ""
    except ValueError as exc:
        raised = str(exc)
    probe = weakref.ref(A2)  # producer_consumer is not replayable: its entry holds decisions only
    del A2
    gc.collect()
    return wrong, entries, entries2, raised, probe() is None


def test_repeated_fused_calls_reuse_their_decisions_and_keep_no_tensor(pool2):
    for wrong, entries, entries2, raised, freed in pool2.run(_repeat):
        assert not wrong, wrong
        assert entries == 1 and entries2 == 2
        assert "no_such_pattern" in raised
        assert freed  # the cache holds decisions, never the operands


def _debug(ctx):
    A, B_local, C = torch.ones(16, 16, device=ctx.device), torch.ones(16, 8, device=ctx.device), ctx.zeros(16, 16)
    for _ in range(2):
        ops.gemm_all_scatter(ctx, A, B_local, C, pattern="fused_sequential")
    return _plans(ctx), C.cpu().clone()  # a copy: the heap stays in the rank


def test_the_debug_mode_keeps_no_decision():
    for entries, C in get_pool(2, TRIDENT_DEBUG="1").run(_debug):
        assert entries == 0 and torch.all(C == 16)


#: (op, pattern) pairs whose repeated calls replay the first call's launches.
REPLAYED = [(op, pattern) for op in ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce")
            for pattern in sorted(ops.OPS[op].replayable)]


def _data(p, step, *shape):
    """Rank ``p``'s data at ``step``: small integers, exact in fp32 and TF32 (every rank can make any rank's)."""
    gen = torch.Generator().manual_seed(1000 * step + p)
    return torch.randint(-2, 3, shape, generator=gen).float()


def _operands(ctx, op, heap):
    """The op's operands on this rank: fixed buffers the calls refill (A on the heap or not)."""
    w, dev = ctx.world_size, ctx.device
    make = ctx.zeros if heap else (lambda *shape: torch.zeros(*shape, device=dev))
    if op == "gemm_all_scatter":
        return make(32, 16), torch.zeros(16, 8, device=dev), ctx.zeros(32, 8 * w)
    if op == "all_gather_gemm":
        return make(16, 16), torch.zeros(16, 8, device=dev), torch.zeros(16 * w, 8, device=dev)
    rows = 32 // w if op == "gemm_reduce_scatter" else 32
    return make(32, 16), torch.zeros(16, 8, device=dev), torch.zeros(rows, 8, device=dev)


def _expected(ctx, op, step, shapes):
    """What C holds after a call at ``step``, from every rank's data."""
    w, r = ctx.world_size, ctx.rank
    (a_shape, b_shape) = shapes
    A = [_data(p, step, *a_shape) for p in range(w)]
    B = [_data(p + 100, step, *b_shape) for p in range(w)]
    if op == "gemm_all_scatter":
        return A[0] @ torch.cat(B, dim=1)
    if op == "all_gather_gemm":
        return torch.cat(A) @ B[r]
    total = sum(a @ b for a, b in zip(A, B))
    return total.view(w, -1, total.shape[1])[r] if op == "gemm_reduce_scatter" else total


def _call(ctx, op, pattern, A, B, C, step):
    A.copy_(_data(0 if op == "gemm_all_scatter" else ctx.rank, step, *A.shape))  # gemm_all_scatter: one A
    B.copy_(_data(ctx.rank + 100, step, *B.shape))
    getattr(ops, op)(ctx, A, B, C, pattern=pattern)
    return C.cpu().clone()


def _replays(ctx, op, pattern, heap):
    A, B, C = _operands(ctx, op, heap)
    wrong, recorded = [], []
    cache = ctx.call_cache
    for step in range(3):
        got = _call(ctx, op, pattern, A, B, C, step)
        if not torch.equal(got, _expected(ctx, op, step, (A.shape, B.shape))):
            wrong.append(f"step {step}")
        recorded.append(all(entry.rerun is None for entry in cache.entries(op)))
    return wrong, recorded, len(cache.entries(op))


@pytest.mark.parametrize("heap", [True, False], ids=["heap_A", "plain_A"])
@pytest.mark.parametrize("op,pattern", REPLAYED, ids=[f"{o}-{p}" for o, p in REPLAYED])
def test_repeated_calls_replay_the_recorded_launches_with_new_data(pool2, op, pattern, heap):
    for wrong, recorded, entries in pool2.run(_replays, op, pattern, heap):
        assert not wrong, wrong
        assert recorded == [True, True, True] and entries == 1


def _moved_buffers(ctx):
    op, pattern = "gemm_all_scatter", "workgroup_specialized"
    A, B, C = _operands(ctx, op, heap=False)
    cache = ctx.call_cache
    wrong = []
    _call(ctx, op, pattern, A, B, C, 0)                                    # recorded
    big = (torch.zeros(384, 16, device=ctx.device), torch.zeros(16, 512, device=ctx.device),
           ctx.zeros(384, 512 * ctx.world_size))
    _call(ctx, op, pattern, *big, 1)                                       # 192 tile flags: the sync block grows
    user = ctx.full((64,), 7.0)                                            # where the old block was
    for step in (2, 3):                                                    # recorded afresh on the new block
        if not torch.equal(_call(ctx, op, pattern, A, B, C, step), _expected(ctx, op, step, (A.shape, B.shape))):
            wrong.append(f"after growth, step {step}")
    if not torch.all(user == 7.0):
        wrong.append("a replay wrote into the freed sync block")
    fresh = len(cache.entries(op)) == 2  # the big call and the small one again, both on the new block
    with ctx.heap_scope():                                                 # the sync block grows inside a scope
        _call(ctx, op, pattern, torch.zeros(544, 16, device=ctx.device), torch.zeros(16, 512, device=ctx.device),
              ctx.zeros(544, 512 * ctx.world_size), 4)                     # 272 flags
    user = ctx.full((1024,), 7.0)                                          # where the scope's block was
    for step in (5, 6):                                                    # ... and is let go at its end
        if not torch.equal(_call(ctx, op, pattern, A, B, C, step), _expected(ctx, op, step, (A.shape, B.shape))):
            wrong.append(f"after the scope, step {step}")
    if not torch.all(user == 7.0):
        wrong.append("a replay wrote into the block the scope freed")
    return wrong, fresh


def test_a_recording_is_not_replayed_once_its_buffers_moved(pool2):
    for wrong, fresh in pool2.run(_moved_buffers):
        assert not wrong, wrong
        assert fresh


def _holds_nothing(ctx):
    A, B, C = _operands(ctx, "gemm_all_scatter", heap=False)
    for step in range(2):
        _call(ctx, "gemm_all_scatter", "fused_sequential", A, B, C, step)
    probe = weakref.ref(A)
    del A
    gc.collect()
    return probe() is None


def test_a_recorded_call_holds_no_tensor(pool2):
    assert all(pool2.run(_holds_nothing))

# -- layouts, not addresses ---------------------------------------------------------------------------------

def _fresh_tensors(ctx):
    """New input and output tensors every call (as a compiled model makes them): one entry, right results."""
    w, r, wrong = ctx.world_size, ctx.rank, []
    for step in range(4):
        x = torch.full((300,), float(r + step), device=ctx.device)
        out = torch.empty_like(x)
        ccl.all_reduce(ctx, x, out=out)
        if not (torch.all(out == sum(range(w)) + w * step) and torch.all(x == r + step)):
            wrong.append(f"all_reduce out= step {step}: {out[:3].tolist()} (x {x[:3].tolist()})")
        y = torch.ops.trident.all_reduce(torch.full((300,), float(r + step), device=ctx.device), "sum",
                                         ctx.group_name)
        if not torch.all(y == sum(range(w)) + w * step):
            wrong.append(f"torch.ops.trident.all_reduce step {step}: {y[:3].tolist()}")
    entries = _plans(ctx)
    x = torch.ones(300, device=ctx.device)
    ccl.all_reduce(ctx, x)  # in place: another aliasing, another entry
    return wrong, entries, _plans(ctx), float(x[0])


def test_fresh_tensors_every_call_hit_one_entry(pool2):
    for wrong, entries, after, x in pool2.run(_fresh_tensors):
        assert not wrong, wrong
        assert entries == 1  # the custom op and out= share one layout: (plain x, plain separate out)
        assert after == 2 and x == 2.0


def _fresh_plain_a_local(ctx, pattern):
    """all_gather_gemm on a new plain A_local every call: the kernel stages each at its own address."""
    wrong, B = [], torch.zeros(16, 8, device=ctx.device)
    for step in range(3):
        A = _data(ctx.rank, step, 16, 16).to(ctx.device)  # a new tensor, wherever the allocator puts it
        B.copy_(_data(ctx.rank + 100, step, 16, 8))
        C = torch.empty(16 * ctx.world_size, 8, device=ctx.device)
        ops.all_gather_gemm(ctx, A, B, C, pattern=pattern)
        if not torch.equal(C.cpu(), _expected(ctx, "all_gather_gemm", step, ((16, 16), (16, 8)))):
            wrong.append(f"step {step}")
        del A  # the next call's A may take its memory
    return wrong, len(ctx.call_cache.entries("all_gather_gemm"))


@pytest.mark.parametrize("pattern", sorted(ops.OPS["all_gather_gemm"].replayable))
def test_all_gather_gemm_on_a_fresh_plain_a_local_every_call_hits_one_entry(pool2, pattern):
    for wrong, entries in pool2.run(_fresh_plain_a_local, pattern):
        assert not wrong, wrong
        assert entries == 1


class _Elsewhere:
    """``t``'s layout, address included, as if it lay on ``device`` (a key sees nothing else)."""

    def __init__(self, t: torch.Tensor, device: str):
        self.shape, self.dtype, self.nbytes, self.device = t.shape, t.dtype, t.nbytes, torch.device(device)
        self.data_ptr, self.stride = t.data_ptr, t.stride


def test_a_tensor_on_another_device_never_shares_a_key():
    """Same shape, strides, dtype and address, another device: another key, so such a call is checked
    (and refused) instead of replaying a GPU launch on its address."""
    from trident.calls import layout_key

    x = torch.ones(64)
    keys = {layout_key("all_reduce", (t, t), ("sum",), None) for t in (x, _Elsewhere(x, "cuda:0"),
                                                                       _Elsewhere(x, "cuda:1"))}
    assert len(keys) == 3


def _host_tensor_after_gpu_calls(ctx):
    out = []
    for step in range(2):  # recorded, then replayed
        x = torch.ones(64, device=ctx.device)
        ccl.all_reduce(ctx, x)
    host = torch.ones(64)  # the recorded layout, in host memory
    try:
        ccl.all_reduce(ctx, host)
        out.append("no error")
    except (ValueError, TypeError) as error:
        out.append(str(error))
    return out, float(x[0])


@pytest.mark.skipif(platform.SIMULATOR, reason="the simulator's tensors all lie on the host")
def test_a_host_tensor_of_a_recorded_gpu_layout_is_refused_not_replayed():
    for (message,), x in get_pool(2).run(_host_tensor_after_gpu_calls):
        assert "cpu" in message.lower(), message
        assert x == 2.0


def _flat_memory(ctx):
    """A loop reducing a fresh plain tensor keeps no tensor alive (the cache binds addresses per call)."""
    import gc
    import weakref

    probes = []
    for _ in range(5):
        x = torch.ones(1 << 12, device=ctx.device)
        ccl.all_reduce(ctx, x)
        probes.append(weakref.ref(x))
        del x
    gc.collect()
    return sum(p() is not None for p in probes), _plans(ctx)


def test_a_loop_on_fresh_tensors_keeps_none_alive(pool2):
    for alive, entries in pool2.run(_flat_memory):
        assert alive == 0 and entries == 1


def test_a_launch_on_an_unbindable_tensor_fails_at_once():
    """The rule of the recordings: a tensor a launch takes is an operand, heap memory or owned scratch."""
    x, temp = torch.zeros(4), torch.zeros(4)
    rec = Recording((x,), heap=(0, 0), on_gpu=False)
    with pytest.raises(UnreplayableCall, match="stale address"):
        rec.copy(temp, x)
    rec.own(temp)
    rec.copy(temp, x)  # owned scratch is fine
    x.fill_(3)
    y = torch.full((4,), 5.0)
    rec.replay((y,))  # the copy again, from the new operand
    assert torch.all(temp == 5)


def _launches_match_recording(ctx, op, pattern):
    """The first call of a replayable pattern (buffers already grown) launches exactly what it recorded."""
    from triton.runtime.interpreter import InterpretedFunction

    A, B, C = _operands(ctx, op, heap=False)
    _call(ctx, op, pattern, A, B, C, 0)  # buffers and sync blocks grow here (their barriers launch kernels)
    ctx.call_cache.clear()
    launched, real = [], InterpretedFunction.run

    def counting(self, *args, **kwargs):
        launched.append(self.fn.__name__)
        return real(self, *args, **kwargs)

    InterpretedFunction.run = counting
    try:
        _call(ctx, op, pattern, A, B, C, 1)
    finally:
        InterpretedFunction.run = real
    (entry,) = ctx.call_cache.entries(op)
    recorded = [step.kernel.fn.__name__ for step in entry.steps if hasattr(step, "kernel")]
    return launched, recorded, entry.rerun is None


@pytest.mark.skipif(not platform.SIMULATOR, reason="counts the interpreter's launches")
@pytest.mark.parametrize("op,pattern", REPLAYED, ids=[f"{o}-{p}" for o, p in REPLAYED])
def test_replayable_patterns_launch_only_through_the_recording(pool2, op, pattern):
    """A kernel launched around the recording would be skipped by every replay: none may be."""
    for launched, recorded, replayed in pool2.run(_launches_match_recording, op, pattern):
        assert replayed and launched and launched == recorded, (launched, recorded)


def test_a_launch_hook_is_seen_only_when_one_is_set():
    """Recorded launches skip Triton's runner unless a profiler set a launch hook (an empty
    HookChain, Triton's default since 3.5, is no hook)."""
    from trident.kernels.prepared import _hooked

    class Chain:
        def __init__(self, calls):
            self.calls = calls

    assert not _hooked(None) and not _hooked(Chain([]))
    assert _hooked(Chain([print])) and _hooked(print)


def _fake_cuda_launcher(**sizes):
    """Triton's own CUDA launcher class, made without compiling anything, its C entry recording calls."""
    driver = pytest.importorskip("triton.backends.nvidia.driver")
    launcher = object.__new__(driver.CudaLauncher)
    calls: list = []
    launcher.__dict__.update(num_ctas=1, global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0,
                             profile_scratch_align=1, launch_cooperative_grid=False, launch_pdl=True,
                             launch=lambda *args: calls.append(args))
    launcher.__dict__.update(sizes)
    return launcher, calls


def test_the_bare_launch_passes_what_tritons_launcher_passes():
    """The recorded launch calls the launcher's C entry directly only when that is exactly what Triton's
    Python launcher would do: probed against the installed Triton's real ``__call__``."""
    import triton

    from trident.kernels.prepared import _bare_launch

    launcher, calls = _fake_cuda_launcher()
    bare = _bare_launch(launcher)
    if bare is None:  # this Triton's launcher does more than pass its arguments on: its own path is kept
        assert not triton.__version__.startswith("3.6."), "Triton 3.6 (the GPU machine's) must take the shortcut"
        return
    rest = ("packed", None, None, None, 1234, 7)
    launcher(1, 2, 3, 99, 42, *rest)            # Triton's own path
    c_launch, flags = bare
    c_launch(1, 2, 3, 99, 42, *flags, *rest)    # the recording's path
    assert len(calls) == 2 and calls[0] == calls[1]
    # A kernel that needs scratch memory keeps Triton's path (the launcher allocates it per launch).
    assert _bare_launch(_fake_cuda_launcher(global_scratch_size=128)[0]) is None
    assert _bare_launch(_fake_cuda_launcher(profile_scratch_size=64)[0]) is None


def test_a_launcher_that_does_more_than_pass_through_keeps_its_own_path():
    from trident.kernels.prepared import _bare_launch

    class Launcher:
        global_scratch_size = profile_scratch_size = 0
        launch_cooperative_grid = launch_pdl = False

        def launch(self, *args):
            pass

        def __call__(self, gx, gy, gz, stream, function, *args):
            self.launch(gx, gy, gz, stream, function, False, False, None, None, *args[::-1])  # reorders

    assert _bare_launch(Launcher()) is None


def _barriers(ctx):
    g = ctx.new_group(list(range(ctx.world_size)))
    for _ in range(3):
        ctx.device_barrier()
        g.device_barrier()
    ctx.barrier()
    world, group = ctx.call_cache.ops(), g.call_cache.ops()
    return world.count("device_barrier"), group.count("group_barrier")


def test_repeated_device_barriers_replay_one_recorded_launch(pool2):
    """ctx.device_barrier() and g.device_barrier() go through the call pipeline: one entry each,
    replayed by the later calls (the barriers still meet: the test would hang otherwise)."""
    assert pool2.run(_barriers) == [(1, 1), (1, 1)]
