"""The benchmark and tracing kernels compile for sm_90 (CI has no GPU, so nothing else compiles them).

Each kernel is also built with the integer arguments Triton turns into constants when they are 1
(``rank``, ``peer``, ``world_size``, ``peers``), since a GPU run with 2 ranks passes exactly
those. The PTX must keep 16-byte vector accesses in the bandwidth kernels (fp16, aligned
buffers, as Triton's launcher specializes heap tensors), carry the atomics the p2p benchmark
measures at sys scope, and read ``%globaltimer`` plus make one slot-reserving atomic per traced
event only when tracing is on.
"""

import pytest

from tests.sm90_harness import run_child

CHILD = r'''
import importlib.util, json, os, re
from tests.sm90_harness import ROOT, compile_ptx, with_ones
from trident.bench import p2p, all_access, device_api

def from_file(*path):  # tests/ and benchmarks/ are folders of scripts, not packages
    spec = importlib.util.spec_from_file_location(path[-1].removesuffix(".py"), os.path.join(ROOT, *path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

traced_kernel = from_file("tests", "test_trace.py").traced_kernel
matmul_scatter_kernel = from_file("benchmarks", "trace_demo.py").matmul_scatter_kernel

MEM = {"x_ptr": "*fp16", "y_ptr": "*fp16", "n": "i32", "rank": "i32", "peer": "i32", "heap_bases": "*i64",
       "OP": "constexpr", "BLOCK": "constexpr"}
ATOM = {"c_ptr": "*i32", "value": "i32", "rank": "i32", "peer": "i32", "heap_bases": "*i64", "OP": "constexpr",
        "SEM": "constexpr", "BLOCK": "constexpr"}
ALL = {"x_ptr": "*fp16", "y_ptr": "*fp16", "n": "i32", "peers": "i32", "rank": "i32", "world_size": "i32",
       "heap_bases": "*i64", "BLOCK": "constexpr"}
API = {"x_ptr": "*fp16", "y_ptr": "*fp16", "n": "i32", "rank": "i32", "heap_bases": "*i64", "BLOCK": "constexpr"}
TRACE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "trace_ptr": "*i64", "n": "i32", "rank": "i32", "world_size": "i32",
         "heap_bases": "*i64", "BLOCK": "constexpr", "TRACE": "constexpr"}
ALIGNED = ("x_ptr", "y_ptr", "n", "heap_bases", "c_ptr", "trace_ptr", "a_ptr", "b_ptr", "M", "N_SHARD", "K")

cases = {}
for op in p2p.MEMORY_OPS:
    cases[f"p2p-{op}"] = (p2p.p2p_memory_kernel, MEM, {"OP": op, "BLOCK": 4096}, 8)
for op in p2p.ATOMIC_OPS:
    for sem in ("relaxed", "acq_rel"):
        cases[f"p2p-{op}-{sem}"] = (p2p.p2p_atomic_kernel, ATOM, {"OP": op, "SEM": sem, "BLOCK": 4096}, 8)
cases["all-load"] = (all_access.all_load_kernel, ALL, {"BLOCK": 4096}, 8)
cases["all-store"] = (all_access.all_store_kernel, ALL, {"BLOCK": 4096}, 8)
for name, fn in device_api.VARIANTS.items():
    cases[f"api-{name}"] = (fn, API, {"BLOCK": 4096}, 8)
cases["trace-on"] = (traced_kernel, TRACE, {"BLOCK": 1024, "TRACE": True}, 4)
cases["trace-off"] = (traced_kernel, TRACE, {"BLOCK": 1024, "TRACE": False}, 4)
DEMO = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "trace_ptr": "*i64", "M": "i32", "N_SHARD": "i32",
        "K": "i32", "rank": "i32", "world_size": "i32", "heap_bases": "*i64", "BLOCK_M": "constexpr",
        "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "TRACE": "constexpr"}
cases["demo-traced"] = (matmul_scatter_kernel, DEMO, {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "TRACE": True}, 8)

results = {}
for name, (fn, sig, cst, warps) in cases.items():
    for ones in (False, True):
        signature, constexprs = dict(sig), dict(cst)
        if ones:
            signature, constexprs = with_ones(signature, constexprs, ("rank", "peer", "world_size", "peers", "value"))
        key = name + ("-ones" if ones else "")
        try:
            ptx = compile_ptx(fn, signature, constexprs, aligned=ALIGNED, num_warps=warps)
            results[key] = {"ok": True, "v4_load": "ld.global.v4" in ptx, "v4_store": "st.global.v4" in ptx,
                            "timer": "%globaltimer" in ptx,
                            "atomics": re.findall(r"\b(?:atom|red)\.global[.a-z0-9_]*", ptx)}
        except Exception as exc:
            results[key] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[-1500:]}
print(json.dumps(results))
'''


@pytest.mark.sm90_child(CHILD)
def test_bench_and_trace_kernels_compile_for_sm90(tmp_path):
    res = run_child(CHILD, tmp_path)
    assert len(res) == 2 * (4 + 6 + 2 + 6 + 2 + 1)
    failed = {k: v["error"] for k, v in res.items() if not v["ok"]}
    assert not failed, failed
    for key, r in res.items():
        base = key.removesuffix("-ones")
        if base.startswith(("p2p-load", "p2p-store", "p2p-get", "p2p-put", "all-", "api-")):
            assert r["v4_load"] and r["v4_store"], (key, "lost the 16-byte vector accesses")
        if base.startswith("p2p-atomic"):
            op = {"atomic_add": "add", "atomic_xchg": "exch", "atomic_cas": "cas"}[base.split("-")[1]]
            sem = base.split("-")[2]
            assert r["atomics"] and all(".sys" in a and op in a for a in r["atomics"]), (key, r["atomics"])
            assert all((sem == "relaxed") == (".acq_rel" not in a) for a in r["atomics"]), (key, r["atomics"])
    # Tracing: one atomic slot reservation per recorded event (compute and comm), none when off.
    for suffix in ("", "-ones"):
        on, off = res["trace-on" + suffix], res["trace-off" + suffix]
        assert on["timer"] and len(on["atomics"]) == 2 and all(".gpu" in a for a in on["atomics"]), on
        assert off["atomics"] == [], off
        demo = res["demo-traced" + suffix]  # one compute record, and one comm record in the peer loop
        assert demo["timer"] and len(demo["atomics"]) == 2, demo
