"""Tracing: kernels record events into a heap buffer on 2 ranks; the exports have the right structure."""

import json
import sys

import pytest
import torch
import triton
import triton.language as tl

import trident
import trident.trace as tt


@triton.jit
def traced_kernel(x_ptr, y_ptr, trace_ptr, n, rank, world_size, heap_bases, BLOCK: tl.constexpr,
                  TRACE: tl.constexpr):
    """Each program doubles one tile (compute), then puts it into the right neighbour's y (comm)."""
    tile = tl.program_id(0)
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    t0 = tt.now()
    x = tl.load(x_ptr + offs, mask=mask) * 2
    tt.record(trace_ptr, tt.COMPUTE, tile, rank, t0, rank, TRACE)
    right = (rank + 1) % world_size
    t1 = tt.now()
    trident.store(y_ptr + offs, x, rank, right, heap_bases, mask=mask)
    tt.record(trace_ptr, tt.COMM, tile, right, t1, rank, TRACE)


def _run(ctx, tiles, capacity, trace_on):
    block = 16
    n = tiles * block
    trace = tt.Trace(ctx, capacity=capacity)
    canary = ctx.full((64,), -7, dtype=torch.int64)  # right after the buffer on the heap
    x = ctx.arange(n, dtype=torch.float32)
    y = ctx.zeros(n, dtype=torch.float32)
    ctx.barrier()
    traced_kernel[(tiles,)](x, y, trace.ptr, n, ctx.rank, ctx.world_size, ctx.heap_bases, BLOCK=block,
                            TRACE=trace_on)
    ctx.barrier()
    assert torch.equal(y.cpu(), torch.arange(n, dtype=torch.float32) * 2)
    mine = trace.events()
    merged = trace.gather()
    return {"mine": [tuple(e) for e in mine], "mine_dropped": mine.dropped, "all": [tuple(e) for e in merged],
            "dropped_by_rank": merged.dropped_by_rank, "canary_ok": bool((canary == -7).all()),
            "chrome": trace.to_chrome(f"/tmp/trident-test-trace-{ctx.rank}.json") if ctx.rank == 0 else None}


def test_events_recorded_on_every_rank_and_gathered(pool2):
    results = pool2.run(_run, 4, 64, True)
    for rank, res in enumerate(results):
        mine = [tt.Event(*e) for e in res["mine"]]
        assert len(mine) == 8 and res["mine_dropped"] == 0
        assert {e.rank for e in mine} == {rank}
        assert sorted(e.tile for e in mine if e.kind == tt.COMPUTE) == [0, 1, 2, 3]
        assert sorted(e.tile for e in mine if e.kind == tt.COMM) == [0, 1, 2, 3]
        assert all(e.peer == (rank + 1) % 2 for e in mine if e.kind == tt.COMM)
        assert all(e.peer == rank for e in mine if e.kind == tt.COMPUTE)
        assert all(e.program == e.tile for e in mine)  # one tile per program here
        assert all(0 < e.t_start <= e.t_end for e in mine)
        for tile in range(4):  # a program's comm starts after its compute ended
            comp = next(e for e in mine if e.kind == tt.COMPUTE and e.tile == tile)
            comm = next(e for e in mine if e.kind == tt.COMM and e.tile == tile)
            assert comp.t_end <= comm.t_start
        assert len(res["all"]) == 16 and {e[6] for e in res["all"]} == {0, 1}
        assert res["all"] == results[0]["all"]
        assert res["canary_ok"]


def test_chrome_export_structure(pool2):
    doc = pool2.run(_run, 3, 64, True)[0]["chrome"]
    json.loads(json.dumps(doc))  # serializable
    with open("/tmp/trident-test-trace-0.json") as f:
        assert json.load(f) == doc
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    assert len(spans) == 2 * 3 * 2
    assert {e["pid"] for e in spans} == {0, 1}
    assert {e["cat"] for e in spans} == {"compute", "comm"}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)  # every started event ends
    assert min(e["ts"] for e in spans) == 0
    assert {(e["pid"], e["args"]["tile"]) for e in spans} == {(r, t) for r in (0, 1) for t in range(3)}
    names = {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    threads = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    assert threads == {(e["pid"], e["tid"]) for e in spans}
    assert doc["otherData"]["dropped_events"] == 0


def _span_body(ctx):
    trace = tt.Trace(ctx, capacity=16)
    x = ctx.arange(64, dtype=torch.float32)
    y = ctx.zeros(64, dtype=torch.float32)
    ctx.barrier()
    peer = (ctx.rank + 1) % ctx.world_size
    with trace.span(tile=7, peer=peer):  # a kernel's own events fall inside the span around it
        traced_kernel[(4,)](x, y, trace.ptr, 64, ctx.rank, ctx.world_size, ctx.heap_bases, BLOCK=16, TRACE=True)
    with trace.span(tt.COMPUTE, tile=99):
        y.mul_(2)
    ctx.barrier()
    return [tuple(e) for e in trace.events()]


def test_span_records_the_work_inside_it_as_one_event(pool2):
    for rank, events in enumerate(pool2.run(_span_body)):
        events = [tt.Event(*e) for e in events]
        (outer,), (after,) = ([e for e in events if e.tile == t] for t in (7, 99))  # the kernel's tiles: 0..3
        inner = [e for e in events if e.tile < 4]
        assert (outer.kind, outer.program, outer.peer, outer.rank) == (tt.COMM, 0, (rank + 1) % 2, rank)
        assert (after.kind, after.program, after.peer, after.rank) == (tt.COMPUTE, 0, rank, rank)
        assert len(inner) == 8  # the kernel's compute and comm of 4 tiles
        assert all(outer.t_start <= e.t_start and e.t_end <= outer.t_end for e in inner)
        assert outer.t_end <= after.t_start <= after.t_end


def _nested_span_body(ctx):
    trace = tt.Trace(ctx, capacity=32)
    x = ctx.arange(64, dtype=torch.float32)
    y = ctx.zeros(64, dtype=torch.float32)
    ctx.barrier()
    args = (x, y, trace.ptr, 64, ctx.rank, ctx.world_size, ctx.heap_bases)
    with trace.span(tt.COMM, tile=100):
        traced_kernel[(4,)](*args, BLOCK=16, TRACE=True)  # tiles 0..3: inside the outer span only
        with trace.span(tt.COMPUTE, tile=101):
            y.mul_(2)
        with trace.span(tt.WAIT, tile=102):  # a second inner span reuses the inner level
            y.add_(1)
    refused = None
    try:
        with trace.span(tile=200):  # the block raises: no event, and the level is free again
            raise RuntimeError("inside a span")
    except RuntimeError:
        pass
    spans = [trace.span(tile=300 + level) for level in range(tt.MAX_SPAN_DEPTH + 1)]
    for level, span in enumerate(spans):
        try:
            span.__enter__()
        except ValueError as exc:
            refused = (level, str(exc))
            break
    for span in reversed(spans[:refused[0]]):
        span.__exit__(None, None, None)
    ctx.barrier()
    return [tuple(e) for e in trace.events()], refused


def test_spans_nest(pool2):
    for rank, (events, refused) in enumerate(pool2.run(_nested_span_body)):
        events = [tt.Event(*e) for e in events]
        by_tile = {e.tile: e for e in events if e.tile >= 100}
        outer, first, second = by_tile[100], by_tile[101], by_tile[102]
        kernel = [e for e in events if e.tile < 4]
        assert len(kernel) == 8 and 200 not in by_tile
        assert (outer.kind, first.kind, second.kind) == (tt.COMM, tt.COMPUTE, tt.WAIT)
        # The outer span starts before the work queued first inside it, not when an inner span starts.
        assert all(outer.t_start <= e.t_start for e in kernel)
        assert max(e.t_end for e in kernel) <= first.t_start <= first.t_end <= second.t_start <= second.t_end
        assert second.t_end <= outer.t_end
        depth = tt.MAX_SPAN_DEPTH
        assert refused[0] == depth and f"at most {depth} deep" in refused[1]
        assert sorted(t for t in by_tile if t >= 300) == list(range(300, 300 + depth))


def test_full_buffer_drops_and_counts_without_writing_past_it(pool2):
    results = pool2.run(_run, 4, 3, True)  # 8 events per rank, room for 3
    for res in results:
        assert len(res["mine"]) == 3 and res["mine_dropped"] == 5
        assert res["dropped_by_rank"] == {0: 5, 1: 5}
        assert res["canary_ok"]
    assert results[0]["chrome"]["otherData"]["dropped_events"] == 10


def test_disabled_records_nothing(pool2):
    res = pool2.run(_run, 2, 16, False)[0]
    assert res["mine"] == [] and res["all"] == [] and res["mine_dropped"] == 0


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    events = tt.Events([tt.Event(tt.COMPUTE.value, p, p, r, 1000 + 50 * p, 1400 + 50 * p, r) for r in range(2)
                        for p in range(3)]
                       + [tt.Event(tt.COMM.value, p, p, 1 - r, 1500, 1900, r) for r in range(2) for p in range(3)],
                       {0: 0, 1: 2})
    path = tt.plot_timeline(events, str(tmp_path / "t.png"), title="test")
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000


def test_plot_without_matplotlib_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(ImportError, match="pip install matplotlib"):
        tt.plot_timeline(tt.Events(), str(tmp_path / "t.png"))
    assert not (tmp_path / "t.png").exists()


def test_decode_ignores_unwritten_slots():
    buf = torch.zeros(8 + 2 * 8, dtype=torch.int64)
    buf[0], buf[1] = 2, 2
    buf[8:16] = torch.tensor([1, 4, 9, 0, 10, 20, 1, 1])  # slot 0 written; slot 1 reserved, not yet written
    events = tt.decode(buf, rank=1)
    assert events == [tt.Event(1, 4, 9, 0, 10, 20, 1)] and events.dropped == 0
    assert events[0].kind_name == "comm"


def _demo(ctx, out):
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(trident.__file__))), "benchmarks",
                        "trace_demo.py")
    spec = importlib.util.spec_from_file_location("trace_demo", path)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    return [tuple(e) for e in demo.run(ctx, 32, 32, 32, (16, 16, 16), out)]


def test_trace_demo_matmul_all_scatter(pool2, tmp_path):
    """benchmarks/trace_demo.py: 4 tiles per rank, each computed then sent to both ranks."""
    events = [tt.Event(*e) for e in pool2.run(_demo, str(tmp_path))[0]]
    assert len(events) == 2 * 4 * (1 + 2)
    for rank in (0, 1):
        for tile in range(4):
            comp = [e for e in events if e.rank == rank and e.tile == tile and e.kind == tt.COMPUTE.value]
            comm = [e for e in events if e.rank == rank and e.tile == tile and e.kind == tt.COMM.value]
            assert len(comp) == 1 and sorted(e.peer for e in comm) == [0, 1]
            assert all(comp[0].t_end <= e.t_start for e in comm)
    doc = json.loads((tmp_path / "trace.json").read_text())
    assert len([e for e in doc["traceEvents"] if e["ph"] == "X"]) == len(events)
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
