"""The host API around a context: lifecycle, bad input, broadcast, barriers, peer views, launching
processes (spawn, ``trident run``, torchrun), failures of the rendezvous, and heap-file cleanup."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import trident
from tests.conftest import script_env
from trident import config, layout
from trident.runtime.rendezvous import free_port

REPO = Path(__file__).resolve().parent.parent
SHM = "/dev/shm"


def _heap_files(pid):
    prefix = f"trident-u{os.getuid()}-p{pid}-"
    return sorted(n for n in os.listdir(SHM) if n.startswith(prefix)) if os.path.isdir(SHM) else []


def _error_of(call):
    """``'TypeName: message'`` of what ``call()`` raises, or ``'no error'``."""
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


# -- lifecycle -------------------------------------------------------------------------------------


def _closed_body(ctx):
    pid, ws = os.getpid(), ctx.world_size
    c2 = trident.init(heap_size=1 << 20)
    files_while_open = _heap_files(pid)
    x = c2.full((4,), 2.0)
    assert c2.is_symmetric(x) and not ctx.is_symmetric(x)  # a second, separate heap
    assert "heap_size=" in repr(c2)
    c2.barrier()
    c2.close()
    c2.close()  # idempotent
    calls = {
        "zeros": lambda: c2.zeros(4), "ones": lambda: c2.ones(2), "empty": lambda: c2.empty(3),
        "full": lambda: c2.full((2,), 1), "arange": lambda: c2.arange(3), "rand": lambda: c2.rand(2),
        "zeros_like": lambda: c2.zeros_like(x), "as_symmetric": lambda: c2.as_symmetric(torch.ones(2)),
        "barrier": c2.barrier, "device_barrier": c2.device_barrier, "check": c2.check,
        "free": lambda: c2.free(x), "memory_stats": c2.memory_stats, "is_symmetric": lambda: c2.is_symmetric(x),
        "peer_view": lambda: c2.peer_view(x, 0), "broadcast": lambda: c2.broadcast("hi"),
        "broadcast tensor": lambda: c2.broadcast(torch.zeros(2)), "abort": c2.abort,
        "wait_timeout": lambda: c2.wait_timeout, "set wait_timeout": lambda: setattr(c2, "wait_timeout", 5.0),
    }
    after_close = {name: _error_of(call) for name, call in calls.items()}
    closed_repr = repr(c2)
    # a heap tensor outlives its context (its memory stays mapped while the tensor lives)
    x.add_(1.0)
    x_after_close = x.tolist()

    with trident.init(heap_size=1 << 20) as c3:
        y = c3.full((3,), float(ctx.rank))
        c3.barrier()
        neighbour = c3.peer_view(y, (ctx.rank + 1) % ws).tolist()
        c3.barrier()
    after_with = _error_of(lambda: c3.zeros(1))

    try:  # an exception inside the block: the context is released without a barrier
        with trident.init(heap_size=1 << 20) as c4:
            c4.zeros(2)
            raise KeyError("inside the with block")
    except KeyError:
        pass
    after_with_exception = _error_of(c4.barrier)

    # the pool's own context is untouched
    z = ctx.full((2,), float(ctx.rank))
    ctx.barrier()
    assert ctx.peer_view(z, (ctx.rank + 1) % ws).tolist() == [float((ctx.rank + 1) % ws)] * 2
    return {"files_while_open": files_while_open, "files_after": _heap_files(pid), "after_close": after_close,
            "closed_repr": closed_repr, "x_after_close": x_after_close, "neighbour": neighbour,
            "after_with": after_with, "after_with_exception": after_with_exception}


def test_use_after_close_and_context_manager(pool2):
    for rank, r in enumerate(pool2.run(_closed_body)):
        assert r["files_while_open"] == [] and r["files_after"] == []
        for name, error in r["after_close"].items():
            assert error.startswith(f"ContextClosedError: rank {rank}: this trident context is closed"), (name, error)
        assert "closed" in r["closed_repr"] and f"rank={rank}/2" in r["closed_repr"]
        assert r["x_after_close"] == [3.0] * 4
        assert r["neighbour"] == [float((rank + 1) % 2)] * 3
        assert r["after_with"].startswith("ContextClosedError")
        assert r["after_with_exception"].startswith("ContextClosedError")


def _init_errors_body(ctx):
    minimum = layout.CONTROL_BYTES + layout.ALLOC_ALIGN
    cases = {
        "0": lambda: trident.init(heap_size=0),
        "-1": lambda: trident.init(heap_size=-1),
        "1.5": lambda: trident.init(heap_size=1.5),
        "True": lambda: trident.init(heap_size=True),
        "str": lambda: trident.init(heap_size="1048576"),
        "minimum - 1": lambda: trident.init(heap_size=minimum - 1),
        "backend bogus": lambda: trident.init(heap_size=1 << 20, backend="bogus"),
    }
    if config.BACKEND == "sim":
        stat = os.statvfs(SHM)
        cases["larger than /dev/shm"] = lambda: trident.init(heap_size=stat.f_blocks * stat.f_frsize + (1 << 20))
        cases["backend cuda"] = lambda: trident.init(heap_size=1 << 20, backend="cuda")
    else:
        total = torch.cuda.mem_get_info(ctx.device)[1]
        cases["larger than the GPU"] = lambda: trident.init(heap_size=2 * total)
    out = {}
    for name, call in cases.items():
        try:
            c = call()
        except Exception as exc:
            out[name] = (type(exc), str(exc))
        else:
            c.close()
            out[name] = (None, "accepted")
    # the smallest heap works, and is rounded up to the allocation alignment
    c = trident.init(heap_size=minimum + 1, backend=config.BACKEND.upper())
    smallest = (c.heap_size, c.memory_stats()["free_bytes"], tuple(c.zeros(128).shape),
                _error_of(lambda: c.zeros(1)))
    c.close()
    ctx.barrier()
    return out, smallest, _heap_files(os.getpid())


def _init_timeouts_body(ctx):
    timeouts = {}
    for value in (0, -1.0):
        try:
            c = trident.init(heap_size=1 << 20, wait_timeout=value)
        except ValueError as exc:
            timeouts[value] = str(exc)
        else:
            timeouts[value] = f"accepted (ctx.wait_timeout={c.wait_timeout})"
            c.close()
    ctx.barrier()
    return timeouts


def test_init_argument_errors(pool2):
    minimum = layout.CONTROL_BYTES + layout.ALLOC_ALIGN
    for out, smallest, files in pool2.run(_init_errors_body):
        for name in ("0", "-1", "minimum - 1"):
            kind, message = out[name]
            assert kind is ValueError and "too small" in message and str(minimum) in message, (name, message)
        for name in ("1.5", "True", "str"):
            kind, message = out[name]
            assert kind is TypeError and "heap_size must be an int" in message, (name, message)
        kind, message = out["backend bogus"]
        assert kind is ValueError and "unknown backend 'bogus'" in message
        if config.BACKEND == "sim":
            kind, message = out["larger than /dev/shm"]
            assert kind is ValueError and "larger than /dev/shm" in message, message
            kind, message = out["backend cuda"]
            assert kind is config.ConfigError and "TRIDENT_BACKEND=cuda" in message, message
        else:
            kind, message = out["larger than the GPU"]
            assert kind is ValueError and "does not fit on GPU" in message, message
        # minimum + 1 rounds up to minimum + 256: 512 bytes for tensors, exactly one float32 x 128
        assert smallest[:3] == (minimum + layout.ALLOC_ALIGN, 2 * layout.ALLOC_ALIGN, (128,))
        assert smallest[3].startswith("HeapExhaustedError"), smallest[3]
        assert files == []


def _one_rank_cannot_make_its_heap(ctx):
    import shutil

    too_big = shutil.disk_usage("/dev/shm").total * 2 if ctx.backend == "sim" else \
        torch.cuda.mem_get_info(ctx.device)[1] * 2
    start = time.monotonic()
    try:
        trident.init(heap_size=too_big if ctx.rank == 1 else 1 << 20, timeout=60)
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "no error", "", time.monotonic() - start


def test_a_rank_whose_heap_cannot_be_made_is_named_by_its_peers_at_once(pool2):
    """The failing rank raises its own error; its peers do not wait for it (60 s here) but name it."""
    (kind0, message0, took0), (kind1, message1, took1) = pool2.run(_one_rank_cannot_make_its_heap)
    assert kind1 == "ValueError" and ("larger than /dev/shm" in message1 or "does not fit" in message1), message1
    assert kind0 == "TridentError" and "heaps of other ranks could not be made" in message0, message0
    assert "rank 1: ValueError" in message0 and took0 < 20, (message0, took0)


def test_init_rejects_bad_wait_timeouts(pool2):
    """trident.init(wait_timeout=0 or < 0) is refused, as TRIDENT_WAIT_TIMEOUT and ctx.wait_timeout = ... are."""
    for timeouts in pool2.run(_init_timeouts_body):
        for value, result in timeouts.items():
            assert "positive" in result, f"trident.init(wait_timeout={value}): {result}"


# -- broadcast ---------------------------------------------------------------------------------------


def _broadcast_body(ctx):
    ws, r = ctx.world_size, ctx.rank
    allocations = ctx.memory_stats()["num_allocations"]
    out = {}
    for src in sorted({0, ws - 1}):
        obj = ctx.broadcast({"src": src, "list": [src, "x"], "t": torch.arange(3) + src} if r == src else None,
                            src=src)
        sym = ctx.full((5,), float(r))
        plain = torch.full((2, 3), r, dtype=torch.int32)
        transposed = ctx.full((3, 4), float(r)).t()  # symmetric, not contiguous
        heap_or_not = ctx.full((4,), float(r))  # symmetric on even ranks, a plain tensor on odd ones
        mixed = heap_or_not if r % 2 == 0 else torch.full((4,), float(r))
        returned = [ctx.broadcast(t, src) for t in (sym, plain, transposed, mixed)]
        assert all(a is b for a, b in zip(returned, (sym, plain, transposed, mixed), strict=True))
        out[src] = {"obj": (obj["src"], obj["list"], obj["t"].tolist()), "sym": sym.tolist(), "plain": plain.tolist(),
                    "transposed": (transposed.stride(), transposed.tolist()), "mixed": mixed.tolist()}
    # every staging buffer was freed again
    staged_ok = ctx.memory_stats()["num_allocations"] == allocations + 3 * len(out)
    bad = {}
    for src in (-1, ws, 1.5, "0", None):
        bad[repr(src)] = (_error_of(lambda s=src: ctx.broadcast(torch.zeros(1), src=s)),
                          _error_of(lambda s=src: ctx.broadcast("obj", src=s)))
    ctx.barrier()  # still in step
    return out, staged_ok, bad


def test_broadcast(pool):
    ws = pool.world_size
    for out, staged_ok, bad in pool.run(_broadcast_body):
        assert sorted(out) == sorted({0, ws - 1})
        for src, got in out.items():
            assert got["obj"] == (src, [src, "x"], [src, src + 1, src + 2])
            assert got["sym"] == [float(src)] * 5
            assert got["plain"] == [[src] * 3] * 2
            assert got["transposed"] == ((1, 4), [[float(src)] * 3] * 4)
            assert got["mixed"] == [float(src)] * 4
        assert staged_ok
        for src, (tensor_error, object_error) in bad.items():
            for error in (tensor_error, object_error):
                assert error.startswith(f"ValueError: src={src} is not a rank of this job (world size {ws})"), error


def _gather_heap_tensor_body(ctx):
    one = ctx.full((1,), float(ctx.rank))
    sent = []
    gather = ctx._rendezvous.all_gather
    ctx._rendezvous.all_gather = lambda what, value: (sent.append(len(value)), gather(what, value))[1]
    try:
        got = ctx.all_gather_object("heap tensor", {"t": one, "view": one[:1]})
    finally:
        del ctx._rendezvous.all_gather
    ctx.free(one)
    return sent, [(g["t"].tolist(), g["view"].tolist(), ctx.is_symmetric(g["t"])) for g in got]


def test_all_gather_object_sends_a_heap_tensor_s_own_bytes_not_the_heap(pool2):
    """It used to pickle the whole heap (67 MB for a 64 MiB heap) for a one-element heap tensor."""
    for sent, got in pool2.run(_gather_heap_tensor_body):
        assert sent[0] < 2000, sent
        assert got == [([0.0], [0.0], False), ([1.0], [1.0], False)]


def _broadcast_mismatch(rank):
    ctx = trident.init(heap_size=1 << 22, timeout=3.0)
    out = {"rank": rank, "ctx": (ctx.rank, ctx.world_size)}
    sym = ctx.zeros(4)
    for label, t in [("shape", torch.zeros(rank + 1)),
                     ("dtype", torch.zeros(2, dtype=torch.float32 if rank == 0 else torch.float64)),
                     ("symmetric shape", sym if rank == 0 else sym.view(2, 2))]:
        out[label] = _error_of(lambda t=t: ctx.broadcast(t, src=0))
    ok = torch.full((3,), float(rank))
    ctx.broadcast(ok, src=1)  # still usable after the errors
    out["after"] = ok.tolist()
    # a zero-element tensor (last: it may leave the ranks out of step)
    out["zero elements"] = _error_of(lambda: ctx.broadcast(torch.zeros(0, 3), src=0))
    if out["zero elements"] == "no error":
        ctx.close()
    return out


@pytest.fixture(scope="module")
def mismatch_results():
    return trident.spawn(_broadcast_mismatch, 2, timeout=120)


def test_spawn_returns_per_rank_results(mismatch_results):
    assert [(r["rank"], r["ctx"]) for r in mismatch_results] == [(0, (0, 2)), (1, (1, 2))]


def test_broadcast_with_different_shapes_raises_on_every_rank(mismatch_results):
    for rank, r in enumerate(mismatch_results):
        for label, theirs in [("shape", "rank 0: shape (1,) torch.float32, rank 1: shape (2,) torch.float32"),
                              ("dtype", "rank 0: shape (2,) torch.float32, rank 1: shape (2,) torch.float64"),
                              ("symmetric shape", "rank 0: shape (4,) torch.float32, rank 1: shape (2, 2)")]:
            assert r[label].startswith(f"DivergenceError: rank {rank}: ctx.broadcast needs the same shape"), r[label]
            assert theirs in r[label], (label, r[label])
        assert r["after"] == [1.0] * 3


def test_broadcast_of_a_zero_element_tensor(mismatch_results):
    assert {rank: r["zero elements"] for rank, r in enumerate(mismatch_results)} == {0: "no error", 1: "no error"}


# -- barriers and peer views ---------------------------------------------------------------------------


def _barrier_body(ctx, kind, rounds):
    ws, r = ctx.world_size, ctx.rank
    sync = ctx.barrier if kind == "host" else ctx.device_barrier
    x = ctx.zeros(2, dtype=torch.int64)
    seen = []
    for i in range(rounds):
        if r == i % ws:
            time.sleep(0.05)  # this round's late writer: without a barrier, peers would read stale data
        x[0] = 100 * i + r
        sync()
        seen.append([ctx.peer_view(x, p)[0].item() for p in range(ws)])
        sync()  # everyone has read before anyone writes the next round
    ctx.check()  # no device fault was recorded
    return seen


@pytest.mark.parametrize("kind", ["host", "device"])
def test_repeated_barriers(pool, kind):
    rounds = 4
    ws = pool.world_size
    expected = [[100 * i + p for p in range(ws)] for i in range(rounds)]
    assert pool.run(_barrier_body, kind, rounds) == [expected] * ws


def _peer_view_body(ctx):
    ws, r = ctx.world_size, ctx.rank
    x = ctx.arange(100 * r, 100 * r + 8, dtype=torch.float32)
    m = ctx.zeros(ws, 3, dtype=torch.int32)
    ctx.barrier()
    reads = [ctx.peer_view(x, p).tolist() for p in range(ws)]
    slices = [ctx.peer_view(x[2:5], p).tolist() for p in range(ws)]
    own_is_self = ctx.peer_view(x, r).data_ptr() == x.data_ptr()
    for p in range(ws):  # write my row into every peer's m
        ctx.peer_view(m, p)[r] = r + 1
    ctx.barrier()
    rows = m.tolist()
    mt = ctx.peer_view(m.t(), (r + 1) % ws)
    transposed = (tuple(mt.shape), mt.stride(), mt.tolist())
    errors = [_error_of(lambda: ctx.peer_view(x, ws)), _error_of(lambda: ctx.peer_view(x, -1)),
              _error_of(lambda: ctx.peer_view(torch.zeros(2), 0)), _error_of(lambda: ctx.peer_view(x + 1, 0))]
    ctx.barrier()
    return reads, slices, own_is_self, rows, transposed, errors


def test_peer_view(pool):
    ws = pool.world_size
    rows = [[p + 1] * 3 for p in range(ws)]
    for reads, slices, own_is_self, got_rows, transposed, errors in pool.run(_peer_view_body):
        assert reads == [[float(100 * p + i) for i in range(8)] for p in range(ws)]
        assert slices == [[float(100 * p + i) for i in range(2, 5)] for p in range(ws)]
        assert own_is_self
        assert got_rows == rows
        assert transposed == ((3, ws), (1, 3), [list(col) for col in zip(*rows, strict=True)])
        assert errors[0].startswith(f"ValueError: peer={ws} is not a rank") and "-1 is not a rank" in errors[1]
        assert errors[2].startswith("NotSymmetricError") and errors[3].startswith("NotSymmetricError")


# -- processes -------------------------------------------------------------------------------------------

_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "TRIDENT_TIMEOUT", "TRIDENT_WAIT_TIMEOUT")


def _env(**extra):
    env = {k: v for k, v in script_env().items() if k not in _RANK_VARS and not k.startswith("TORCHELASTIC")}
    return {**env, **extra}


def _run(args, timeout=180, **env):
    return subprocess.run(args, cwd=REPO, env=_env(**env), capture_output=True, text=True, timeout=timeout)


def _last_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _spawn_fail(rank):
    if rank == 1:
        raise ValueError("deliberate failure")
    time.sleep(120)  # spawn must stop this rank, not wait for it
    return rank


def test_spawn_error_names_the_failing_rank():
    start = time.monotonic()
    with pytest.raises(trident.SpawnError) as info:
        trident.spawn(_spawn_fail, 2, timeout=100)
    assert time.monotonic() - start < 60
    message = str(info.value)
    assert message.startswith("rank 1 raised") and "ValueError: deliberate failure" in message
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="world_size must be a positive int"):
            trident.spawn(_spawn_fail, bad)


# `trident run -n 2 examples/01_load_store.py` and its exact lines: tests/test_examples.py
# (test_example_runs_on_two_ranks[01_load_store.py] with EXACT), the same command.


def test_trident_run_never_splits_a_rank_s_line(tmp_path):
    """Unbuffered ranks write a line's text and its newline separately; the launcher forwards
    whole lines, so two ranks printing at once never glue their lines together."""
    script = tmp_path / "chatty.py"
    script.write_text(textwrap.dedent("""\
        import os
        rank = os.environ["RANK"]
        for i in range(2000):
            print(f"rank {rank} line {i} " + "x" * 40)
    """))
    proc = _run([sys.executable, "-m", "trident", "run", "-n", "2", str(script)], PYTHONUNBUFFERED="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 4000
    for rank in (0, 1):
        mine = [line for line in lines if line.startswith(f"rank {rank} ")]
        assert mine == [f"rank {rank} line {i} " + "x" * 40 for i in range(2000)]


def test_trident_run_reports_the_failing_rank(tmp_path):
    script = tmp_path / "fails_on_one.py"
    script.write_text(textwrap.dedent("""\
        import trident

        import os

        import trident

        print("pid", os.getpid(), flush=True)
        ctx = trident.init(heap_size=1 << 20)
        x = ctx.zeros(4)
        if ctx.rank == 1:
            raise RuntimeError("deliberate failure")
        print("survivor", ctx.rank, flush=True)
    """))
    proc = _run([sys.executable, "-m", "trident", "run", "-n", "2", str(script)])
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "RuntimeError: deliberate failure" in proc.stderr
    assert "trident run: rank 1 exited with code 1" in proc.stderr
    assert "survivor 0" in proc.stdout
    # no heap file of either process remains (rank 1 exited with an exception)
    pids = [int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("pid ")]
    assert len(pids) == 2
    assert {pid: _heap_files(pid) for pid in pids} == {pid: [] for pid in pids}


def test_plain_python_with_triton_imported_first():
    """``python script.py`` (a world of one) with ``import triton`` above ``import trident``, as users write it."""
    env = {k: v for k, v in _env().items() if k != "TRITON_INTERPRET"}  # this process set it: trident is imported
    proc = subprocess.run([sys.executable, "examples/demo.py"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0/1" in proc.stdout and "matches torch" in proc.stdout


def test_torchrun_example():
    proc = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                 "examples/01_load_store.py"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0: load/store ok (y = 0.0)" in proc.stdout and "rank 1: load/store ok (y = 2.0)" in proc.stdout


_INIT = "import trident; trident.init(heap_size=1 << 20)"


def test_rank_that_never_arrives():
    start = time.monotonic()
    proc = _run([sys.executable, "-c", _INIT], timeout=60, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), TRIDENT_TIMEOUT="1")  # waited out in full
    assert time.monotonic() - start < 20
    assert proc.returncode != 0
    last = _last_line(proc.stderr)
    assert last.startswith("trident.errors.RankTimeoutError: rank 0:") and "ranks [1]" in last, last


def test_inconsistent_world_size_fails_clearly_in_every_process():
    port = str(free_port())
    procs = []
    start = time.monotonic()
    for rank, world in [(0, 2), (1, 3)]:
        env = _env(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, TRIDENT_TIMEOUT="3")
        procs.append(subprocess.Popen([sys.executable, "-c", _INIT], cwd=REPO, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=60))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert time.monotonic() - start < 30
    for rank, (p, (_, err)) in enumerate(zip(procs, outputs, strict=True)):
        last = _last_line(err)
        assert p.returncode != 0, f"rank {rank} exited 0"
        assert last.startswith("trident.errors.") and f"rank {rank}:" in last and "WORLD_SIZE" in last, \
            f"rank {rank}: {last}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible")
def test_cuda_backend_without_a_gpu():
    env = {k: v for k, v in _env().items() if k != "TRITON_INTERPRET"}
    env["TRIDENT_BACKEND"] = "cuda"
    code = "import trident; print('imported', trident.config.BACKEND, flush=True); trident.init(heap_size=1 << 20)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert "imported cuda" in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode != 0
    last = _last_line(proc.stderr)
    assert last.startswith("trident.errors.BackendUnavailableError:"), last


def test_bogus_backend_variable():
    proc = _run([sys.executable, "-c", "import trident"], timeout=120, TRIDENT_BACKEND="bogus")
    assert proc.returncode != 0
    last = _last_line(proc.stderr)
    assert last.startswith("trident.config.ConfigError:") and "TRIDENT_BACKEND" in last and "bogus" in last, last


# -- heap files in /dev/shm ------------------------------------------------------------------------------


@pytest.mark.skipif(config.BACKEND != "sim", reason="heap files belong to the simulator")
def test_no_heap_files_remain_after_an_exception(tmp_path):
    script = tmp_path / "raises.py"
    script.write_text(textwrap.dedent("""\
        import os

        import trident

        print("pid", os.getpid(), flush=True)
        # different heap sizes: the ranks fail between creating their heap files and unlinking them
        trident.init(heap_size=(1 << 20) * (int(os.environ["RANK"]) + 1))
    """))
    job = _run([sys.executable, "-m", "trident", "run", "-n", "2", str(script)])
    assert job.returncode != 0
    for rank in range(2):
        assert f"DivergenceError: rank {rank}: ranks asked for different heap sizes" in job.stderr, job.stderr[-3000:]
    pids = [int(line.split()[1]) for line in job.stdout.splitlines() if line.startswith("pid ")]
    assert len(pids) == 2
    assert {pid: _heap_files(pid) for pid in pids} == {pid: [] for pid in pids}


@pytest.mark.skipif(config.BACKEND != "sim", reason="heap files belong to the simulator")
def test_sweep_stale_files():
    from trident.backends.sim import sweep_stale_files

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=60)
    uid = os.getuid()
    stale = f"trident-u{uid}-p{gone.pid}-abc123-r0"
    keep = [f"trident-u{uid}-p{os.getpid()}-def456-r1",  # a live process
            f"trident-u{uid + 1}-p{gone.pid}-abc123-r0",  # another user
            f"trident-u{uid}-p{gone.pid}-XYZ-r0",  # not a heap file name
            f"other-u{uid}-p{gone.pid}-abc123-r0"]
    paths = [os.path.join(SHM, n) for n in [stale, *keep]]
    try:
        for path in paths:
            with open(path, "wb") as f:
                f.write(b"x")
        removed = sweep_stale_files()
        assert stale in removed
        assert not os.path.exists(os.path.join(SHM, stale))
        assert all(os.path.exists(os.path.join(SHM, n)) for n in keep)
        assert not set(keep) & set(removed)
    finally:
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)
