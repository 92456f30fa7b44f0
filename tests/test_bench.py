"""The benchmark harness and the benchmarks at tiny sizes on 2 ranks: simulated in CI, and on the
GPU with ``--backend cuda`` (the assertions hold on either backend).

Each benchmark's ``run`` executes inside a rank pool (no process start-up per test); ``report``
then writes the JSON and PNG files that ``trident bench`` writes. Some tests go through the CLI
(in the simulator), and one runs a small suite (``trident.bench.suite``).
"""

import glob
import json
import os
import subprocess
import sys
import types

import pytest
import torch

from tests.conftest import script_env
from trident.bench import arguments, harness, summary
from trident.platform import PROCESS_BACKEND, SIMULATOR

PNG = b"\x89PNG\r\n\x1a\n"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _png_ok(path):
    with open(path, "rb") as f:
        data = f.read()
    return data[:8] == PNG and len(data) > 5000


# ---- harness, no ranks -----------------------------------------------------------------------

def test_sizes_and_units():
    assert arguments.parse_bytes("4K") == 4096 and arguments.parse_bytes("2GiB") == 2 << 30
    assert arguments.parse_bytes("64M") == 64 << 20 and arguments.parse_bytes("1000") == 1000
    assert arguments.size_sweep(4096, 32768) == [4096, 8192, 16384, 32768]
    assert arguments.size_sweep(1024, 16384, 4) == [1024, 4096, 16384]
    assert arguments.human_bytes(4096) == "4 KiB" and arguments.human_bytes(2 << 30) == "2 GiB"
    with pytest.raises(ValueError):
        arguments.size_sweep(8, 4)


def test_time_ms_calls_warmup_plus_repeats_and_takes_the_median():
    calls, delays = [], iter([0, 0, 0.001, 0.030, 0.002])

    def fn():
        calls.append(1)
        import time
        time.sleep(next(delays))

    host_timed = types.SimpleNamespace(platform=types.SimpleNamespace(timing_device=torch.device("cpu")))
    ms = harness.time_ms(host_timed, fn, warmup=2, repeats=3)
    assert len(calls) == 5
    assert 1.5 < ms < 15  # the median of ~1, ~30, ~2 ms is ~2 ms, not the 30 ms outlier


@pytest.mark.skipif(SIMULATOR, reason="CUDA events and host batches need a GPU")
def test_device_time_alone_calls_exactly_warmup_plus_repeats_on_a_gpu():
    """time_ms/time_on time the device only: no host batches, so a benchmark that checks what its
    calls did (an atomic's total) sees exactly warmup + repeats calls; measure adds the host batches."""
    calls = []
    x = torch.zeros(1, device="cuda")

    def fn():
        calls.append(1)
        x.add_(1)

    harness.time_on(torch.device("cuda"), fn, warmup=2, repeats=3)
    assert len(calls) == 5
    t = harness.measure(torch.device("cuda"), fn, warmup=0, repeats=1)
    assert len(calls) == 5 + 1 + harness.HOST_BATCH * harness.HOST_SAMPLES and t.host_ms > 0


def test_table_aligns_and_marks_missing():
    text = harness.table([{"op": "load", "gbps": 1.5}, {"op": "atomic_add", "gbps": None}],
                         [("op", "op", ""), ("gbps", "GB/s", ".2f")])
    lines = text.splitlines()
    assert lines[0].split() == ["op", "GB/s"] and lines[1].split() == ["load", "1.50"]
    assert lines[2].split() == ["atomic_add", "-"] and len({len(x) for x in lines}) == 1


def test_validate_rejects_broken_records():
    good = {"schema": harness.SCHEMA, "benchmark": "x", "params": {}, "performance_figure": False,
            "note": harness.SHARED_NOTE, "rows": [],
            "meta": {"date": "d", "command": "c", "host": "h", "backend": "sim", "world_size": 2, "gpus": 0,
                     "ranks_share_gpus": False, "gpu": "cpu", "torch": "t", "triton": "t", "trident": "t",
                     "heap_size": 1}}
    harness.validate(good)
    for broken in ({**good, "schema": "other/1"}, {**good, "rows": {}}, {**good, "note": ""},
                   {**good, "meta": {**good["meta"], "world_size": "2"}}, {**good, "rows": [3]}):
        with pytest.raises(ValueError):
            harness.validate(broken)


# ---- the benchmarks on 2 simulated ranks --------------------------------------------------------

def _bench(ctx, module, argv, out):
    import importlib

    mod = importlib.import_module(f"trident.bench.{module}")
    args = mod.parse_args(argv)
    mod.sim_sizes(args)
    record = mod.run(ctx, args)
    files = mod.report(record, out) if ctx.rank == 0 else []
    return record, files


def _check_common(record, files, world):
    harness.validate(record)
    assert record["meta"]["world_size"] == world and record["meta"]["backend"] == PROCESS_BACKEND
    # A performance figure only with a GPU per rank (never in the simulator); otherwise the note says why.
    assert record["performance_figure"] is (not SIMULATOR and not record["meta"]["ranks_share_gpus"])
    assert record["performance_figure"] or "not link bandwidth" in record["note"]
    json_file = next(f for f in files if f.endswith(".json"))
    with open(json_file) as f:
        assert json.load(f) == json.loads(json.dumps(record))
    pngs = [f for f in files if f.endswith(".png")]
    assert pngs and all(_png_ok(p) for p in pngs)


def _max_task(ctx):
    return harness.max_over_ranks(ctx, 10.0 + 3 * ctx.rank), harness.all_values(ctx, ctx.rank * 2)


def test_max_and_all_values_over_ranks(pool2):
    assert pool2.run(_max_task) == [(13.0, [0, 2]), (13.0, [0, 2])]


def test_p2p_every_op_every_pair(pool2, tmp_path):
    argv = ["--bytes", "4K", "--atomic-elems", "256", "--warmup", "0", "--repeats", "1", "--no-progress"]
    (record, files), (other, _) = pool2.run(_bench, "p2p", argv, str(tmp_path))
    assert record == other  # every rank returns the whole record
    _check_common(record, files, 2)
    rows = record["rows"]
    assert len(rows) == 7 * 2 * 2 and record["all_correct"]
    assert {(r["op"], r["rank"], r["peer"]) for r in rows} == {(op, s, p) for op in
                                                              ("load", "store", "get", "put", "atomic_add",
                                                               "atomic_xchg", "atomic_cas") for s in (0, 1)
                                                              for p in (0, 1)}
    assert all(r["value"] > 0 and r["ms"] > 0 for r in rows)
    assert all(r["grid"] == 4096 // 2 // record["params"]["block"] for r in rows if "bytes" in r)
    assert record["params"]["block"] == 256 and record["params"]["atomic_elements"] == 256


@pytest.mark.parametrize("mode", ["load", "store"])
def test_all_load_and_all_store_sweep(pool2, tmp_path, mode):
    argv = ["--mode", mode, "--min-bytes", "4K", "--max-bytes", "8K", "--repeats", "1", "--warmup", "0",
            "--no-progress"]
    record, files = pool2.run(_bench, "all_access", argv, str(tmp_path))[0]
    _check_common(record, files, 2)
    nccl = record["performance_figure"]  # NCCL's line needs a GPU per rank, as a performance figure does
    assert record["benchmark"] == f"all-{mode}" and record["all_correct"]
    assert [r["bytes"] for r in record["rows"]] == [4096, 8192]
    for r in record["rows"]:
        assert r["trident_gbps"] > 0 and r["copy_engine_gbps"] > 0 and ("nccl_gbps" in r) is nccl
        assert r["per_rank_gbps"] * 2 == pytest.approx(r["trident_gbps"])
        assert r["grid"] == r["bytes"] // 2 // 256  # one peer each, 256 elements per program
    assert record["references"] == {"copy_engine": True, "nccl_all_gather": nccl}
    table = summary.summarize(record).splitlines()
    assert "| B per rank | trident GB/s | copy engine GB/s | NCCL GB/s | of copy engine | ok |" in table
    assert [line.split(" | ")[0] for line in table if line.startswith("| 4 KiB") or line.startswith("| 8 KiB")] == \
        ["| 4 KiB", "| 8 KiB"]


def test_device_api_and_ccl_on_the_harness(pool2, tmp_path):
    rec, files = pool2.run(_bench, "device_api", ["--repeats", "1", "--warmup", "0", "--no-progress"],
                           str(tmp_path / "api"))[0]
    _check_common(rec, files, 2)
    assert [r["variant"] for r in rec["rows"]] == ["plain copy", "trident.load", "trident.store", "trident.get",
                                                   "trident.put", "trident.copy"]
    assert rec["all_correct"] and all(r["fraction_of_plain"] > 0 for r in rec["rows"])
    assert os.path.exists(tmp_path / "api" / "device_api_bandwidth.json")
    rec, files = pool2.run(_bench, "ccl", ["--max-bytes", "1K", "--no-progress"], str(tmp_path / "ccl"))[0]
    _check_common(rec, files, 2)
    assert {r["collective"] for r in rec["rows"]} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                                      "broadcast"}
    assert rec["nccl_compared"] is rec["performance_figure"] and all(r["busbw_gbps"] > 0 for r in rec["rows"])


def _fused_bench(ctx, module, argv, out):
    import importlib

    from trident.bench.fused_ops import SIM_SHAPES

    mod = importlib.import_module(f"trident.bench.{module}")
    shapes = ",".join("x".join(map(str, shape)) for shape in SIM_SHAPES)  # small on either backend
    args = mod.parse_args(argv + ["--shapes", shapes, "--warmup", "0", "--repeats", "1", "--no-progress", "--trace",
                                  "--out", out])
    record = mod.run(ctx, args)
    files = (mod.report(record, out) if module == "gemm_all_scatter" else
             mod.report(record, out, args.op, args.op)) if ctx.rank == 0 else []
    return record, files


def test_fused_op_benchmarks_size_their_heap_from_their_shapes():
    """Four of the largest operand or product per rank, not a fixed 8 GiB: eight ranks sharing one
    GPU ran out of memory with that (2026-12-07, gemm-reduce-scatter -n 8 --mps)."""
    import argparse

    from trident.bench import harness
    from trident.bench.fused_ops import heap_bytes, shapes_of

    args = argparse.Namespace(shapes="64x32x128,16x64x8")
    assert shapes_of(args, True, [(1, 2, 3)]) == [(64, 32, 128), (16, 64, 8)]
    assert shapes_of(argparse.Namespace(shapes=None), False, [(1, 2, 3)]) == [(1, 2, 3)]
    assert heap_bytes(shapes_of(args, True, []), "float32") == harness.heap_for(4 * 64 * 128 * 4)


@pytest.mark.parametrize("module,argv,patterns", [
    ("gemm_all_scatter", [], {"bulk_synchronous", "producer_consumer", "fused_sequential", "workgroup_specialized"}),
    ("tensor_parallel", ["--op", "all_gather_gemm"], {"bulk_synchronous", "fused_sequential",
                                                      "workgroup_specialized"}),
    ("tensor_parallel", ["--op", "gemm_reduce_scatter"], {"bulk_synchronous", "fused_sequential",
                                                          "workgroup_specialized"}),
])
def test_fused_op_benchmarks_check_time_plot_and_trace(pool2, tmp_path, module, argv, patterns):
    (record, files), (other, _) = pool2.run(_fused_bench, module, argv, str(tmp_path))
    assert record["rows"] == other["rows"]  # times are the max over ranks: every rank has the same
    _check_common(record, files, 2)
    rows = {r["pattern"]: r for r in record["rows"]}
    # The baseline (and auto, which may pick it) needs NCCL: not with ranks sharing a GPU.
    references = set() if record["meta"]["ranks_share_gpus"] else {"baseline", "auto"}
    assert set(rows) == patterns | {"gemm"} | references
    if "auto" in rows:
        assert rows["auto"]["chosen"] in patterns | {"baseline"}
        if SIMULATOR:
            assert rows["auto"]["chosen"] == "baseline"  # nothing measured for the simulator
    for r in rows.values():
        assert r["time_ms"] > 0 and r["vs_gemm"] == pytest.approx(r["time_ms"] / rows["gemm"]["time_ms"])
        assert r["host_ms"] > 0
        # Every trident pattern against its machinery budget: the GEMM plus its declared extra bytes
        # at the run's copy bandwidth (torch's baseline has none).
        assert ("vs_budget" in r) == (r["pattern"] in patterns)
        if r["pattern"] in patterns:
            budget = r["gemm_ms"] + r["extra_bytes"] / record["copy_bytes_per_s"] * 1e3
            assert r["budget_ms"] == pytest.approx(budget) and r["vs_budget"] == pytest.approx(r["time_ms"] / budget)
        if "baseline" in rows:
            assert r["speedup"] == pytest.approx(rows["baseline"]["time_ms"] / r["time_ms"])
    names = {os.path.basename(f) for f in files}
    assert {n for n in names if n.endswith("_speedup.png") or n.endswith("_breakdown.png")}
    assert len(names) >= (3 if "baseline" in rows else 2)  # JSON, breakdown, and speedups over a baseline
    shape = record["rows"][0]["shape"]
    for pattern in patterns:  # one timeline per pattern, written by rank 0
        base = tmp_path / f"timeline_{pattern}_{shape}"
        assert _png_ok(f"{base}.png")
        events = json.loads(open(f"{base}.json").read())["traceEvents"]
        assert {e["pid"] for e in events if e.get("ph") == "X"} >= {0, 1}


def test_cli_bench_p2p_end_to_end(tmp_path):
    out = tmp_path / "p2p"
    proc = subprocess.run([sys.executable, "-m", "trident", "bench", "p2p", "-n", "2", "--ops", "load", "atomic_cas",
                           "--bytes", "4K", "--atomic-elems", "256", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env=script_env(TRIDENT_BACKEND="sim"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "correctness and harness run" in proc.stdout
    record = harness.validate(json.loads((out / "p2p.json").read_text()))
    assert len(record["rows"]) == 2 * 4 and record["all_correct"]
    assert record["meta"]["command"].startswith("trident bench p2p -n 2 --ops load atomic_cas --bytes 4K")
    text = summary.summarize(record)  # the Markdown for docs: one W x W matrix per op
    assert "| load (GB/s) | peer 0 | peer 1 |" in text and "| atomic_cas (Mops/s) | peer 0 | peer 1 |" in text
    assert text.count("| rank 0 |") == 2 and "wrong data" not in text and "correctness and harness run" in text
    assert _png_ok(out / "p2p.png")


def test_cli_bench_gemm_checks_and_plots(tmp_path):
    out = tmp_path / "gemm"
    proc = subprocess.run([sys.executable, "-m", "trident", "bench", "gemm", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env=script_env(TRIDENT_BACKEND="sim"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = harness.validate(json.loads((out / "gemm.json").read_text()))
    assert record["meta"]["world_size"] == 1 and record["meta"]["command"].startswith("trident bench gemm -n 1")
    shapes = {tuple(r["shape"]) for r in record["rows"]}
    assert len(shapes) == 2
    for shape in shapes:
        rows = [r for r in record["rows"] if tuple(r["shape"]) == shape]
        assert [r["impl"] for r in rows] == ["torch.matmul", "trident"] and rows[1]["table_config"]
        assert rows[1]["rel_err_vs_torch"] < 2e-2 and rows[1]["ms"] > 0 and "error" not in rows[1]
    assert _png_ok(out / "gemm.png")


def test_gemm_sweep_filter_picks_candidates_by_field():
    from trident.bench import gemm

    picked = gemm.candidates("split_tail=True")
    assert picked and all(c.split_tail for c in picked) and len(picked) < len(gemm.SWEEP)
    assert gemm.candidates("split_tail=True,BLOCK_M=256") == [c for c in picked if c.BLOCK_M == 256]
    assert gemm.candidates(None) == gemm.SWEEP
    with pytest.raises(SystemExit, match="unknown config field"):
        gemm.candidates("blocks=3")


def test_nccl_reference_lines_never_use_nvlink_multicast():
    import trident.bench.all_access  # noqa: F401  (imports the harness, as every benchmark does)

    assert os.environ["NCCL_NVLS_ENABLE"] == "0"


def test_cli_lists_benchmarks_and_rejects_unknown():
    from trident.cli import BENCHMARKS, main

    assert {"ccl", "p2p", "all-load", "all-store", "device-api", "gemm", "gemm-all-scatter", "all-gather-gemm",
            "gemm-reduce-scatter"} <= set(BENCHMARKS)
    with pytest.raises(SystemExit):
        main(["bench", "no-such-bench"])


def test_suite_runs_steps_in_order_and_reports_failures(tmp_path, capsys):
    from trident.bench import suite

    py = ("{py}", "-c")
    steps = suite.SUITES["sim-smoke"] + [suite.Step("fails", (*py, "import sys; sys.exit(3)"), 60),
                                          suite.Step("hangs", (*py, "import time; time.sleep(60)"), 1)]
    out = tmp_path / "suite"
    assert suite.main(["tiny", "--out", str(out)], suites={"tiny": steps}) == 1
    result = json.loads((out / "summary.json").read_text())
    assert result["schema"] == "trident-suite/1" and result["suite"] == "tiny" and result["ok"] is False
    assert [(s["name"], s["status"], s["returncode"]) for s in result["steps"]] == [
        ("p2p_sim", "ok", 0), ("fails", "failed", 3), ("hangs", "timeout", -15)]
    assert harness.validate(json.loads((out / "p2p_sim" / "p2p.json").read_text()))["meta"]["backend"] == "sim"
    assert "load" in (out / "p2p_sim.log").read_text() and result["steps"][2]["seconds"] < 30
    # Once the budget is spent no step starts, and the suite is not ok.
    assert suite.main(["tiny", "--out", str(tmp_path / "none"), "--budget", "0"], suites={"tiny": steps[1:2]}) == 1
    assert json.loads((tmp_path / "none" / "summary.json").read_text())["steps"][0]["status"] == "skipped"
    assert suite.main(["--list"]) == 0 and "gpu-tests" in capsys.readouterr().out
    assert {"gpu-tests", "gpu-gemm", "fused-ops", "p2p", "examples", "sim-smoke"} <= set(suite.SUITES)
    named = {a for steps in suite.SUITES.values() for step in steps for a in step.argv if a.endswith(".py")}
    assert named and all((suite.ROOT / path).is_file() for path in named), named  # no step names a moved file


def test_latency_host_time_round_trip_and_small_collectives(pool2, tmp_path):
    rec, files = pool2.run(_bench, "latency", ["--rounds", "5", "--max-bytes", "4K", "--small-only", "--no-progress"],
                           str(tmp_path / "latency"))[0]
    _check_common(rec, files, 2)
    assert {r["part"] for r in rec["rows"]} == {"host", "round_trip", "collective"}
    host = {r["name"]: r for r in rec["rows"] if r["part"] == "host"}
    assert {"empty triton launch", "torch x.add_(1)", "torch.matmul small", "all_reduce 1 KiB (heap)",
            "all_reduce 1 KiB (plain)", "all_to_all 1 KiB per peer", "all_to_all_v 1 KiB per peer",
            "all_to_all_v 1 KiB per peer, new splits", "device_barrier", "gemm_all_scatter small",
            "all_gather_gemm small", "gemm_reduce_scatter small"} <= set(host)
    assert {" ".join(name.split(" ")[:-2]) for name, r in host.items() if r["group"] == "moe"} == {
        "moe_dispatch", "moe_combine", "moe_dispatch masked", "moe_combine masked"}
    assert ("nccl all_reduce 1 KiB" in host) is rec["performance_figure"]
    assert all(r["host_us"] > 0 and r["time_us"] > 0 for r in host.values())
    trips = {r["name"]: r["time_us"] for r in rec["rows"] if r["part"] == "round_trip"}
    assert set(trips) == {"bare spin", "trident signal/wait"} and min(trips.values()) > 0
    sizes = {(r["name"], r["bytes"]) for r in rec["rows"] if r["part"] == "collective"}
    assert {("all_reduce one_shot eager", 1024), ("all_reduce one_shot eager", 4096)} <= sizes
    assert any("CUDA graph" in name for name, _ in sizes) is (not SIMULATOR)
    assert "mps" in rec and os.path.exists(tmp_path / "latency" / "latency_host.png")
    goals = {g["goal"]: g for g in rec["goals"]}
    trip = goals["signal/wait round trip / bare spin"]
    assert trip["value"] == pytest.approx(trips["trident signal/wait"] / trips["bare spin"], rel=1e-2)
    assert trip["met"] is (trip["value"] <= 1.5)
    reference = "nccl all_reduce 1 KiB" if rec["performance_figure"] else "empty triton launch"
    heap = goals[f"host time of all_reduce 1 KiB (heap) / {reference}"]
    assert heap["value"] == pytest.approx(host["all_reduce 1 KiB (heap)"]["host_us"] / host[reference]["host_us"],
                                          rel=1e-2)
    assert "host time of gemm_all_scatter small / torch.matmul" in goals
    floor = goals["host time of torch.ops all_reduce less the custom-op floor / ccl all_reduce (plain)"]
    custom_op, custom_floor = (host[n]["host_us"] for n in ("torch.ops all_reduce 1 KiB (plain, fresh out)",
                                                            "custom op floor (dispatch + fresh out)"))
    assert floor["value"] == pytest.approx((custom_op - custom_floor) / host["all_reduce 1 KiB (plain)"]["host_us"],
                                           rel=1e-2, abs=1e-3)
    # every dist row ran on trident (the benchmark's times are trident's, not the fallback's)
    assert rec["dist_backend_counts"]["trident"] > 0 and rec["dist_backend_counts"]["fallback"] == 0


def _moe_rows_round_robin(ctx):
    from trident.bench import latency

    cases = latency._moe_cases(ctx)
    for _ in range(2):  # as the GPU's --host-rounds time them: each row once per round, in turn
        for _, _, call in cases:
            call()
    return [name for name, _, _ in cases]


def test_latency_moe_rows_run_round_robin(pool2):
    """A combine row timed after the next round's dispatch still combines its layout's latest dispatch
    (the simulator times one round, so the whole bench never shows it; the H100 run of 2026-12-06 did)."""
    names = pool2.run(_moe_rows_round_robin)[0]
    assert len(names) == 4 and sum(name.startswith("moe_combine") for name in names) == 2


def test_tp_layer_times_the_decoder_layer(pool2, tmp_path):
    rec, files = pool2.run(_bench, "tp_layer", ["--tokens", "1", "8", "--no-progress"], str(tmp_path / "tp"))[0]
    _check_common(rec, files, 2)
    impls = {r["impl"] for r in rec["rows"]}
    assert impls == ({"trident", "trident_zero_copy", "local", "torch"} if rec["performance_figure"]
                     else {"trident", "trident_zero_copy", "local"})
    assert rec["zero_copy_matches"] is True  # the heap-buffer layer gives the staged layer's result
    for row in rec["rows"]:  # each against the layer with no communication, same mode and size
        local = next(r for r in rec["rows"] if r["impl"] == "local" and r["tokens"] == row["tokens"]
                     and r["mode"] == row["mode"])
        assert row["vs_local"] == pytest.approx(row["time_us"] / local["time_us"])
    if not SIMULATOR:  # profiled once per layer: the zero-copy layer copies no more than the staged one
        eager = {(r["impl"], r["tokens"]): r for r in rec["rows"] if r["mode"] == "eager"}
        for tokens in (1, 8):
            assert eager[("trident_zero_copy", tokens)]["copies"] <= eager[("trident", tokens)]["copies"]
            assert eager[("local", tokens)]["kernels"] > 0
    assert {r["tokens"] for r in rec["rows"]} == {1, 8} and all(r["time_us"] > 0 for r in rec["rows"])


def test_moe_times_dispatch_and_combine(pool2, tmp_path):
    """Both layouts up to --masked-tokens (here 4: the masked layout at 4 tokens only), the torch path
    where NCCL runs, every row against its memory-bound floor."""
    rec, files = pool2.run(_bench, "moe", ["--tokens", "4", "8", "--masked-tokens", "4", "--no-progress"],
                           str(tmp_path / "moe"))[0]
    _check_common(rec, files, 2)
    assert rec["all_correct"] is True
    impls = {(r["impl"], r["tokens"]) for r in rec["rows"]}
    want = {("trident", 4), ("trident", 8), ("trident masked", 4)}
    assert impls == (want | {("torch", 4), ("torch", 8)} if rec["performance_figure"] else want)
    cases = {(r["op"], r["dtype"], r["tokens"]) for r in rec["rows"]}
    ops = (("dispatch", "fp8"), ("dispatch", "bf16->fp8"), ("dispatch", "bf16"), ("combine", "bf16"))
    assert cases == {(op, dtype, t) for op, dtype in ops for t in (4, 8)}
    assert {r["mode"] for r in rec["rows"]} == ({"eager"} if SIMULATOR else {"eager", "cuda graph"})
    assert all(r["time_us"] > 0 and r["gbps"] is not None for r in rec["rows"])
    assert all(r["floor_us"] > 0 and r["vs_floor"] == r["time_us"] / r["floor_us"] for r in rec["rows"])
    assert {os.path.basename(f) for f in files if f.endswith(".png")} == {"moe_4.png", "moe_8.png", "moe_floor.png"}


def test_moe_heap_bytes_follows_the_documented_formula_and_sizes_the_bench():
    """docs/moe.md's formula at DeepSeek-V3 prefill (4096 tokens, 7168 hidden, top-8 of 256, bf16 and
    fp8 scales) and decode in the masked layout (128 tokens), and ``trident bench moe``'s default heap
    at 1, 2, 4 and 8 ranks holds both."""
    import trident.ops
    from trident import layout
    from trident.bench import moe

    def pow2(n):
        return 1 << (n - 1).bit_length()

    rows = 8 * 4096 * 8  # W * M * k, the default capacity
    want = (pow2(rows * 7168 * 2) + pow2(rows * 56 * 4) + pow2(rows * 8) + pow2(rows * 4)
            + pow2(4096 * 8 * 7168 * 2))  # recv_x, scales, origins, j, combine staging
    got = trident.ops.moe_heap_bytes(4096, 7168, 8, 256, 8, torch.bfloat16, fp8_scales=True)
    assert want + layout.CONTROL_BYTES < got < want + (4 << 20)  # + the small buffers and the sync block
    assert trident.ops.moe_heap_bytes(4096, 7168, 8, 256, 8, capacity=rows // 2) < got - (2 << 30)
    # A second buffer set: its own receive buffers, offsets and map, status words; nothing shared twice.
    two = trident.ops.moe_heap_bytes(4096, 7168, 8, 256, 8, torch.bfloat16, fp8_scales=True, buffer_sets=2)
    assert two - got == (pow2(rows * 7168 * 2) + pow2(rows * 56 * 4) + pow2(rows * 8) + pow2(rows * 4)
                         + pow2((2 * 256 + 2 * 32 + 4096 * 8) * 4) + layout.ALLOC_ALIGN)
    args = moe.parse_args([])
    # The masked layout at decode (128 tokens): a region of W * M rows for each of the E/W local experts.
    masked_rows = 32 * 8 * 128
    want = pow2(masked_rows * 7168 * 2) + pow2(masked_rows * 56 * 4) + pow2(masked_rows * 8) + pow2(masked_rows * 4)
    masked = trident.ops.moe_heap_bytes(128, 7168, 8, 256, 8, torch.bfloat16, fp8_scales=True, layout="masked")
    assert want + pow2(128 * 8 * 7168 * 2) + layout.CONTROL_BYTES < masked < want + pow2(128 * 8 * 7168 * 2) + (4 << 20)
    for world in (1, 2, 4, 8):  # the bench: the largest case of each layout (masked up to --masked-tokens 256)
        need = (trident.ops.moe_heap_bytes(4096, 7168, 8, 256, world, torch.bfloat16, fp8_scales=True)
                + trident.ops.moe_heap_bytes(128, 7168, 8, 256, world, torch.bfloat16, fp8_scales=True,
                                             layout="masked"))
        assert need <= moe.heap_bytes(args, world) <= need + (256 << 20)


def _moe_bench_in_exact_heap(rank, out, world):
    import trident
    import trident.ops
    from trident.bench import moe

    args = moe.parse_args(["--tokens", "4", "8", "--masked-tokens", "0", "--no-progress"])  # contiguous only
    moe.sim_sizes(args)
    hidden, k, experts = moe.MODELS[args.models[0]]
    heap = trident.ops.moe_heap_bytes(8, hidden, k, experts, world, torch.bfloat16, fp8_scales=True)
    with trident.init(heap_size=heap) as ctx:
        record = moe.run(ctx, args)
        return record["all_correct"], ctx.memory_stats()["free_bytes"], heap


def _masked_in_exact_heap(rank, out, world):
    """The masked layout's largest call (bf16, the combine, fp8) in a heap of exactly its ``moe_heap_bytes``."""
    import trident
    import trident.ops
    from trident.bench import moe

    hidden, k, experts = moe.MODELS["tiny"]
    heap = trident.ops.moe_heap_bytes(8, hidden, k, experts, world, torch.bfloat16, fp8_scales=True,
                                      layout="masked")
    with trident.init(heap_size=heap) as ctx:
        x, x8, scales, idx, weights = moe.inputs(ctx, 8, hidden, k, experts, seed=0)
        d = trident.ops.moe_dispatch(ctx, x, idx, experts, max_tokens_per_rank=8, layout="masked")
        got = trident.ops.moe_combine(ctx, d.recv_x, weights, d).float()
        trident.ops.moe_dispatch(ctx, x8, idx, experts, x_scales=scales, max_tokens_per_rank=8, layout="masked")
        correct = bool(torch.allclose(got, x.float() * weights.sum(1, keepdim=True), rtol=3e-2, atol=3e-2))
        return correct, ctx.memory_stats()["free_bytes"], heap


def _both_layouts_in_exact_heaps(rank, out, world):
    """The contiguous bench, then the masked layout's largest call, each in a context of its own whose
    heap is exactly its ``moe_heap_bytes`` (one process start-up for both)."""
    return [body(rank, out, world) for body in (_moe_bench_in_exact_heap, _masked_in_exact_heap)]


@pytest.mark.parametrize("world", [1, 2])
def test_moe_bench_runs_in_exactly_the_heap_moe_heap_bytes_gives(tmp_path, world):
    """The bench makes its largest call first (the workspace never grows through smaller sizes, which
    would leave holes), so a heap of exactly ``moe_heap_bytes`` holds it, with little to spare (at one
    rank without the combine's staging, which nothing uses there). Both layouts, in turn."""
    import trident

    for layouts in trident.spawn(_both_layouts_in_exact_heaps, world, (str(tmp_path), world), timeout=240):
        assert len(layouts) == 2
        for layout, (correct, free, heap) in zip(("contiguous", "masked"), layouts):
            assert correct is True, layout
            assert free < 4096, (layout, free, heap)


def test_plots_draw_one_readable_panel_per_family_from_saved_h200_json(tmp_path):
    """The latency host-time plot of a saved H200 run (docs/results): one panel per family, each
    with its reference (NCCL's all-reduce, torch.matmul of the shape), at most a page wide (the old
    plot was 3432 px wide, its bars slivers)."""
    import struct

    from trident.bench import latency, plots

    pytest.importorskip("matplotlib")
    with open(os.path.join(ROOT, "docs/results/h200-2026-12-04b/latency_1_matmul_prepared.json")) as f:
        record = json.load(f)
    rows = latency._host_panels([r for r in record["rows"] if r["part"] == "host"])
    refs = {r["family"]: r["name"] for r in rows if r["is_reference"]}
    assert refs == {"collectives, 1 KiB": "nccl all_reduce 1 KiB", "fused ops, small shape": "torch.matmul small",
                    "fused ops, 4096 shape": "torch.matmul 4096"}
    assert all(r["family"] in refs for r in rows if r["group"] in ("collective", "fused op"))
    path = plots.bars({**record, "rows": rows}, str(tmp_path / "host.png"), "family", "name", "host_us", "us", "host",
                      reference=lambda r: r["is_reference"], ratio="of")
    with open(path, "rb") as f:
        width, height = struct.unpack(">II", f.read(24)[16:24])
    assert width <= 1700 and 400 <= height <= 1200, (width, height)


@pytest.mark.skipif(not SIMULATOR, reason="on a GPU the script runs in full (benchmarks/host_anatomy.py)")
def test_host_anatomy_script_says_it_needs_a_gpu():
    """benchmarks/host_anatomy.py imports and starts in the simulator, then says it times GPU launches."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "host_anatomy.py")], capture_output=True,
                          text=True, timeout=120, env=script_env(), cwd=root)
    assert proc.returncode != 0 and "run it on a GPU" in proc.stderr, proc.stderr[-2000:]


def test_moe_decode_anatomy_variants_still_apply_to_the_kernel(tmp_path):
    """benchmarks/moe_decode_anatomy.py times the MoE dispatch with parts taken out, each a text edit of
    trident/ops/moe/kernels.py or sync.py: every edit must still apply to the current sources (a kernel
    change that breaks one fails here, not on a GPU) and take out what it names; in the simulator the
    script says it needs a GPU."""
    import importlib.util
    import inspect

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("moe_decode_anatomy", os.path.join(root, "benchmarks",
                                                                                     "moe_decode_anatomy.py"))
    anatomy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(anatomy)
    kernels = anatomy.build_variants(str(tmp_path))
    assert list(kernels) == [*anatomy.VARIANTS, "empty kernel"]
    source = {name: inspect.getsource(kernel.fn) for name, kernel in kernels.items()}
    masked = {name: text[text.index("if MASKED:"):text.index("else:", text.index("if MASKED:"))]
              for name, text in source.items() if name != "empty kernel"}
    assert "wait_peers_ready" in masked["current"] and "_send_rows" in masked["current"]
    assert "wait_peers_ready" not in masked["no READY wait"] and "_send_rows" in masked["no READY wait"]
    assert "wait_peers_ready" in masked["no rows"] and "_send_rows" not in masked["no rows"]
    assert "wait_peers_ready" not in masked["no READY, no rows"] and "_send_rows" not in masked["no READY, no rows"]
    finish = inspect.getsource(kernels["system-scope ticket"].fn.__globals__["finish_call"].fn)
    assert anatomy.TICKET.replace('"gpu"', '"sys"') in finish
    itself = kernels["READY and ARRIVED to itself too"].fn.__globals__
    handshake = itself["finish_call"].fn.__globals__  # the edited ops/fused/sync.py
    for helper in ("signal_peers", "sync_ranks"):  # from the edited device/sync.py
        assert "peers != rank" not in inspect.getsource(handshake[helper].fn), helper
    assert "peer != team.rank" not in inspect.getsource(itself["wait_peers_ready"].fn)
    current = kernels["current"].fn.__globals__
    assert "peer != team.rank" in inspect.getsource(current["wait_peers_ready"].fn)
    assert "peers != rank" in inspect.getsource(current["finish_call"].fn.__globals__["signal_peers"].fn)
    if SIMULATOR:
        proc = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "moe_decode_anatomy.py")],
                              capture_output=True, text=True, timeout=120, env=script_env(), cwd=root)
        assert proc.returncode != 0 and "run it on a GPU" in proc.stderr, proc.stderr[-2000:]


def test_variant_copies_import_what_the_module_imports_and_refuse_a_stale_edit(tmp_path):
    """trident.bench.variants: relative imports resolved against the module's package, at any depth;
    an edit that no longer applies is an error naming it."""
    import pytest

    from trident.bench.variants import absolute_imports, edited_module

    source = "from ..fused.sync import x\nfrom ... import trace\nfrom .combine import y\n    from ...device import z\n"
    assert absolute_imports(source, "trident.ops.moe.kernels") == (
        "from trident.ops.fused.sync import x\nfrom trident import trace\nfrom trident.ops.moe.combine import y\n"
        "    from trident.device import z\n")
    copy = edited_module("ops/gemm/tiles.py", [("GROUP_M * num_pid_n", "GROUP_M * num_pid_n")], "tiles_copy",
                         str(tmp_path))
    assert copy.tile_coords.fn.__name__ == "tile_coords" and copy.Gemm is not None
    with pytest.raises(ValueError, match="no longer holds 'not in the source'"):
        edited_module("ops/gemm/tiles.py", [("not in the source", "")], "tiles_stale", str(tmp_path))


def test_fused_anatomy_variants_still_apply_to_the_kernels(tmp_path):
    """benchmarks/fused_anatomy.py times the fused ops' workgroup_specialized kernels with one part
    changed, each a text edit of a trident/ops/tensor_parallel kernel module: every edit must still
    apply (a kernel change that breaks one fails here, not on a GPU) and change what it names; in the
    simulator the script says it needs a GPU."""
    import importlib.util
    import inspect

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("fused_anatomy", os.path.join(root, "benchmarks", "fused_anatomy.py"))
    anatomy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(anatomy)
    modules = anatomy.build_variants(str(tmp_path))
    assert list(modules) == list(anatomy.VARIANTS)

    def source(name, kernel):
        return inspect.getsource(getattr(modules[name], kernel).fn)

    gather = {name: source(name, "gather_gemm_kernel") for name in modules if name.startswith("all_gather_gemm")}
    assert "tl.maximum(tiles // multipliers - 1, 0) * multipliers" in gather["all_gather_gemm: current"]
    assert "static_tiles = tiles * 0" in gather["all_gather_gemm: every tile claimed"]
    assert "static_tiles = tiles\n" in gather["all_gather_gemm: static tile loop"]
    assert "tl.cdiv(tiles - (arrival - gather_programs), multipliers)" in gather["all_gather_gemm: static tile loop"]
    assert "if not own:" in gather["all_gather_gemm: current"]
    assert "if not own:" not in gather["all_gather_gemm: no wait branch"]
    assert 'scope="gpu"' in source("gemm_reduce: current", "release_tile_flag")
    assert 'scope="gpu"' not in source("gemm_reduce: own tile flags at sys scope", "release_tile_flag")
    assert "signal(" in source("gemm_all_scatter: current", "produce_tiles")
    assert "signal(" not in source("gemm_all_scatter: no tile flags", "produce_tiles")
    if SIMULATOR:
        proc = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "fused_anatomy.py")],
                              capture_output=True, text=True, timeout=120, env=script_env(), cwd=root)
        assert proc.returncode != 0 and "run it on one" in proc.stderr, proc.stderr[-2000:]


def test_moe_prefill_heap_reports_each_ranks_rows_capacity_and_peak(tmp_path):
    """benchmarks/moe_prefill_heap.py (issue 31's memory figure) at two ranks in the simulator: a correct
    combine, and per rank the capacity the prefill path took (the most rows any rank received, rounded
    up as ``prefill_capacity`` rounds), a peak that fits the heap, and ``moe_heap_bytes`` for it."""
    from trident.ops.moe.sizing import prefill_capacity

    out = tmp_path / "heap"
    proc = subprocess.run([sys.executable, "-m", "trident", "run", "-n", "2", "benchmarks/moe_prefill_heap.py",
                           "--out", str(out)], capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env=script_env(TRIDENT_BACKEND="sim"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = harness.validate(json.loads((out / "moe_prefill_heap.json").read_text()))
    rows = record["rows"]
    assert record["all_correct"] and [r["rank"] for r in rows] == [0, 1]
    most = max(r["received_rows"] for r in rows)
    assert 0 < most and all(r["capacity"] == prefill_capacity(most) for r in rows), rows
    assert all(0 < r["peak_mib"] <= r["heap_mib"] and r["predicted_mib"] > 0 for r in rows), rows


def test_auto_table_rules_keep_a_choice_within_the_tolerance_and_start_at_zero():
    from trident.bench import auto_table

    assert auto_table.gpu_model("NVIDIA H200") == "H200" and auto_table.gpu_model("NVIDIA H100 80GB HBM3") == "H100"
    times = {100: {"a": 1.0, "b": 1.3}, 50: {"a": 1.01, "b": 1.0}, 10: {"a": 2.0, "b": 1.0}}
    assert auto_table.rules(times) == [(50, "a"), (0, "b")]  # at 50, 'a' is within 2% of 'b'
    assert auto_table.rules(times, tolerance=0.0) == [(100, "a"), (0, "b")]
    assert auto_table.rules({7: {"baseline": 1.0}}) == [(0, "baseline")] and auto_table.rules({}) == []


def test_auto_never_runs_a_pattern_slower_than_the_fastest_measured_on_this_machine_kind():
    """Issue 33: until several-GPU tables exist, ``auto`` runs, at every op, GPU model and world size
    with saved results (docs/results: one H200, one H100, each at one rank), the fastest pattern or one
    within 2%.
    Before the all_gather_gemm table was filled from them it ran ``baseline``, 4% slower."""
    from trident.bench import auto_table
    from trident.platform import Platform

    results = sorted(glob.glob(os.path.join(ROOT, "docs/results/h[12]00-*")))
    found, compared = auto_table.tables(auto_table.load(results))
    assert {op for op, _, _ in found} == {"gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter"}
    slow = [r for r in compared if r["auto_over_fastest"] is None or r["auto_over_fastest"] > 1.02]
    assert not slow, slow
    assert auto_table.main([*results, "--check"]) == 0
    import trident.ops

    one_h200 = Platform("cuda", torch.device("cuda", 0), 132, "NVIDIA H200", 1, 1)
    assert trident.ops.OPS["all_gather_gemm"].choose(one_h200, 4096 ** 3) == "fused_sequential"
