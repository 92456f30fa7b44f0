"""The trident.ops kernels compile for sm_90 (CI has no GPU; the simulator never compiles them).

Built in a child process with ``TRIDENT_BACKEND=cuda``: the matmul with descriptors (TMA) and with
pointers, with and without split-K, and every pattern kernel of the three collective ops, some with
tracing on (a trace buffer) and the others with it off (``trace_ptr`` None, a constexpr). The
descriptor builds must use Hopper's bulk tensor copies and wgmma.
"""

import pytest

from tests.sm90_harness import HOPPER_SHARED_BYTES, run_child

CHILD = r'''
import json
from tests.sm90_harness import compile_kernel
from trident.ops.tensor_parallel import all_gather_gemm_kernels as AG
from trident.ops.tensor_parallel import gemm_all_scatter_kernels as G
from trident.ops.tensor_parallel import gemm_reduce_kernels as R
from trident.ops.gemm.matmul import matmul_kernel

BM, BN, BK = 128, 128, 64
TILE = {"BLOCK_M": BM, "BLOCK_N": BN, "GROUP_M": 8}
I32 = "i32"
# Sizes and strides travel as tuples: (M, N, K) and the element strides (A's, B's, then C's).
SHAPE = {"shape": (I32, I32, I32)}
def strides(n):
    return {"strides": (I32,) * n}
SIZES = {**SHAPE, **strides(5)}  # A's, B's and C's row stride
WORLD = {"rank": "i32", "world_size": "i32", "heap_bases": "*i64"}

def sync(trace):
    # One sync block; the trace buffer, or None (a constexpr: tracing compiled out).
    return {"sync_ptr": "*i64", "trace_ptr": "*i64" if trace else "constexpr"}

def nones(sig):
    return {k: None for k, v in sig.items() if v == "constexpr"}

def ab(tma):
    if tma:
        return {"a": f"tensordesc<bf16[{BM}, {BK}]>", "b": f"tensordesc<bf16[{BK}, {BN}]>", "c": "*bf16"}
    return {"a": "*bf16", "b": "*bf16", "c": "*bf16"}

def build(fn, sig, cst, warps=8, stages=3, aligned=()):
    cst = {**nones(sig), **cst}
    sig = dict(sig, **{k: "constexpr" for k in cst if isinstance(k, str)})
    sig = {arg: sig[arg] for arg in fn.arg_names}  # in the kernel's order
    return compile_kernel(fn, sig, cst, aligned, num_warps=warps, num_stages=stages)

results = {}
def case(name, fn, sig, cst, **how):
    try:
        kernel = build(fn, sig, cst, **how)
        ptx = kernel.asm["ptx"]
        results[name] = {"ok": True, "wgmma": "wgmma" in ptx, "tma": "cp.async.bulk.tensor" in ptx,
                         "shared": kernel.metadata.shared, "gpu_release": "atom.global.gpu.release" in ptx}
    except Exception as exc:
        results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[-1500:]}

def matmul_sig(cut, trace, tail=None):
    return {**SHAPE, **strides(6), "b_tail": tail or "constexpr", "part_ptr": "*fp32" if cut else "constexpr",
            "count_ptr": "*i32" if cut else "constexpr", "cut": (I32, I32),
            "trace_ptr": "*i64" if trace else "constexpr", "rank": "i32"}

MATMUL_TILE = {"TILE": (BM, BN, BK, 8, 0)}  # (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, TAIL_N)
for tma in (True, False):
    for cut in (False, True):
        case(f"matmul tma={tma} cut={cut}", matmul_kernel, {**ab(tma), **matmul_sig(cut, trace=cut)},
             dict(MATMUL_TILE, USE_TMA=tma, C_TMA=False, SUBTILE=False, FLATTEN=tma and not cut))
# Tiles with a tail of columns, as the table's "shard" config: 128 x (256 + 32), four stages.
for tma in (True, False):
    tail_ab = {"a": "tensordesc<bf16[128, 64]>", "b": "tensordesc<bf16[64, 256]>", "c": "*bf16"} if tma else ab(False)
    case(f"matmul tail tma={tma}", matmul_kernel,
         {**tail_ab, **matmul_sig(False, False, tail="tensordesc<bf16[64, 32]>" if tma else "*bf16")},
         dict(TILE=(128, 256, 64, 8, 32), USE_TMA=tma, C_TMA=False, SUBTILE=False, FLATTEN=False), stages=4)
    gemm = {**ab(tma), **SIZES}
    case(f"fused_sequential tma={tma}", G.fused_sequential_kernel, {**gemm, **sync(not tma), **WORLD},
         dict(TILE, BLOCK_K=BK, USE_TMA=tma, WORLD_BLOCK=8))
    if not tma:
        continue  # the pointer path of the pattern kernels is the same tile_dot as fused_sequential's
    case(f"workgroup_specialized tma={tma}", G.workgroup_specialized_kernel,
         {**gemm, "gemm_programs": "i32", **sync(tma), **WORLD},
         dict(TILE, BLOCK_K=BK, USE_TMA=tma, WORLD_BLOCK=8))
    case(f"producer tma={tma}", G.producer_kernel, {**gemm, **sync(False), **WORLD},
         dict(TILE, BLOCK_K=BK, USE_TMA=tma))
case("matmul cut c_tma", matmul_kernel,
     {**ab(True), "c": f"tensordesc<bf16[{BM}, {BN // 2}]>", **matmul_sig(cut=True, trace=False)},
     dict(MATMUL_TILE, USE_TMA=True, C_TMA=True, SUBTILE=True, FLATTEN=True))
for wait in (True, False):
    case(f"scatter wait={wait}", G.scatter_kernel,
         {"c": "*bf16", "M": "i32", "N": "i32", "stride_cm": "i32", **sync(wait), **WORLD},
         dict(TILE, WORLD_BLOCK=8, WAIT_FLAGS=wait))
# all_gather_gemm reads A through pointers (from peers, or from what the kernel gathered), and B through
# its descriptor where B's layout allows (tma=True: B_TMA), else through pointers too.
# A plain A_local is staged by the kernel (source given), a heap one is read in place (source None).
for tma in (True, False):
    agg = {"a_local": "*bf16", "source": "*bf16", "b": ab(tma)["b"], "c": "*bf16", **SIZES}
    case(f"all_gather_gemm pull tma={tma}", AG.pull_kernel, {**agg, **sync(False), **WORLD},
         dict(TILE=(BM, BN, BK, 8), B_TMA=tma, WORLD_BLOCK=8))
    case(f"all_gather_gemm gather tma={tma}", AG.gather_gemm_kernel,
         {**agg, "a_full": "*bf16", "gather_programs": "i32", **sync(True), **WORLD},
         dict(TILE=(BM, BN, BK, 8), B_TMA=tma, WORLD_BLOCK=8))
case("all_gather_gemm pull heap A_local", AG.pull_kernel,
     {**agg, "source": "constexpr", "b": ab(False)["b"], **sync(False), **WORLD},
     dict(TILE=(BM, BN, BK, 8), B_TMA=False, WORLD_BLOCK=8))
# As the op launches it on fp32 (the tiles and stages pick_config gives fp32), with the launcher's
# specializations (aligned pointers and row strides, unit strides as constants): its pipelined K loop
# must fit a Hopper SM's shared memory (two loops, one per source of A, once asked for 384 KiB).
F32 = {"a_local": "*fp32", "source": "constexpr", "a_full": "*fp32", "b": "*fp32", "c": "*fp32", **SHAPE,
       "strides": (I32, "constexpr", I32, "constexpr", I32)}
AG_ARGS = AG.gather_gemm_kernel.arg_names
case("all_gather_gemm gather fp32 tma=False", AG.gather_gemm_kernel,
     {**F32, "gather_programs": "i32", **sync(False), **WORLD},
     {"TILE": (128, 128, 64, 8), "B_TMA": False, "WORLD_BLOCK": 8,
      (AG_ARGS.index("strides"), 1): 1, (AG_ARGS.index("strides"), 3): 1},
     warps=4, stages=3, aligned=("a_local", "a_full", "b", "c", ("strides", 0), ("strides", 2), ("strides", 4)))
# gemm_reduce_scatter pushes each tile to its owner, gemm_all_reduce to every rank (TO_EVERY_RANK).
# Their tile config is one constexpr tuple (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M).
for to_every_rank, op in ((False, "gemm_reduce_scatter"), (True, "gemm_all_reduce")):
    for tma in (True, False):
        operands = {"a": ab(tma)["a"], "b": ab(tma)["b"], "slots": "*bf16"}
        sizes = {**SHAPE, **strides(4)}
        meta = dict(TILE=(BM, BN, BK, 8), USE_TMA=tma, TO_EVERY_RANK=to_every_rank, WORLD_BLOCK=8)
        case(f"{op} push tma={tma}", R.push_kernel, {**operands, "c": "*bf16", **sizes, **sync(False), **WORLD}, meta)
        case(f"{op} push_reduce tma={tma}", R.push_reduce_kernel,
             {**operands, "c": "*bf16", **sizes, "gemm_programs": "i32", **sync(tma), **WORLD}, meta)
case("reduce_slots", R.reduce_slots_kernel, {"slots": "*bf16", "c": "*bf16", "m": "i32", "N": "i32",
     "rank": "i32", "world_size": "i32"}, {"BLOCK": 1024})
print(json.dumps(results))
'''


@pytest.mark.sm90_child(CHILD)
def test_ops_kernels_compile_for_sm90_with_tma_and_wgmma(tmp_path):
    results = run_child(CHILD, tmp_path)
    assert len(results) == 28
    failed = {k: v["error"] for k, v in results.items() if not v["ok"]}
    assert not failed, failed
    too_big = {k: v["shared"] for k, v in results.items() if v["shared"] > HOPPER_SHARED_BYTES}
    assert not too_big, f"shared memory per program past a Hopper SM's {HOPPER_SHARED_BYTES} bytes: {too_big}"
    for name, r in results.items():
        if not name.startswith(("scatter", "reduce_slots")):  # the others hold a GEMM
            assert r["wgmma"], f"{name}: no wgmma in the PTX"
        wanted = "tma=True" in name or "c_tma" in name
        assert r["tma"] == wanted, f"{name}: bulk tensor copies {'missing' if wanted else 'unexpected'}"
        if "push_reduce" in name:  # a tile's flag at its own rank is read on this GPU only: a gpu-scoped release
            assert r["gpu_release"], f"{name}: no gpu-scoped release (own tiles' flags must not pay a sys fence)"
