"""The collective kernels compile for sm_90 (CI has no GPU, so nothing else compiles them).

Triton specializes an integer argument equal to 1 into a compile-time constant, so a kernel
must also compile when ``rank``, ``world_size`` or a size is 1: each kernel is built both ways.
"""

import pytest

from tests.sm90_harness import assert_compiled

CHILD = r'''
import json
import triton.language as tl
from tests.sm90_harness import outcome, with_ones
from trident.ccl import kernels as K

COMMON = {"sync_ptr": "*i64", "rank": "i32", "world_size": "i32", "heap_bases": "*i64", "BLOCK": "constexpr",
          "WORLD_BLOCK": "constexpr"}
CASES = {
    "all_gather": (K.all_gather_kernel, {"src_ptr": "*bf16", "inp_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32",
                   "STAGE": "constexpr"}, {"STAGE": False}),
    "all_gather_staged": (K.all_gather_kernel, {"src_ptr": "*bf16", "inp_ptr": "*bf16", "out_ptr": "*bf16",
                          "n": "i32", "STAGE": "constexpr"}, {"STAGE": True}),
    "reduce_scatter": (K.reduce_scatter_kernel, {"src_ptr": "*fp16", "inp_ptr": "*fp16", "out_ptr": "*fp16", "m": "i32",
                       "OP": "constexpr", "ACC": "constexpr", "STAGE": "constexpr"},
                       {"OP": "sum", "ACC": tl.float32, "STAGE": False}),
    "reduce_scatter_staged": (K.reduce_scatter_kernel, {"src_ptr": "*bf16", "inp_ptr": "*bf16", "out_ptr": "*bf16",
                              "m": "i32", "OP": "constexpr", "ACC": "constexpr", "STAGE": "constexpr"},
                              {"OP": "max", "ACC": tl.float32, "STAGE": True}),
    "all_to_all_v": (K.all_to_all_kernel, {"src_ptr": "*fp32", "inp_ptr": "*fp32", "out_ptr": "*fp32",
                     "table_ptr": "*i64", "inner": "i32", "equal_rows": "i32", "EQUAL": "constexpr",
                     "STAGE": "constexpr"}, {"EQUAL": False, "STAGE": False}),
    "all_to_all": (K.all_to_all_kernel, {"src_ptr": "*fp32", "inp_ptr": "*fp32", "out_ptr": "*fp32",
                   "table_ptr": "*i64", "inner": "i32", "equal_rows": "i32", "EQUAL": "constexpr",
                   "STAGE": "constexpr"}, {"EQUAL": True, "STAGE": False}),
    "all_to_all_staged": (K.all_to_all_kernel, {"src_ptr": "*bf16", "inp_ptr": "*bf16", "out_ptr": "*bf16",
                          "table_ptr": "*i64", "inner": "i32", "equal_rows": "i32", "EQUAL": "constexpr",
                          "STAGE": "constexpr"}, {"EQUAL": True, "STAGE": True}),
    "broadcast": (K.broadcast_kernel, {"src_ptr": "*i32", "x_ptr": "*i32", "out_ptr": "*i32", "n": "i32", "src": "i32",
                  "STAGE": "constexpr", "COPY": "constexpr"}, {"STAGE": False, "COPY": False}),
    "broadcast_staged": (K.broadcast_kernel, {"src_ptr": "*bf16", "x_ptr": "*bf16", "out_ptr": "*bf16", "n": "i32",
                         "src": "i32", "STAGE": "constexpr", "COPY": "constexpr"}, {"STAGE": True, "COPY": True}),
    "one_shot": (K.all_reduce_one_shot_kernel, {"src_ptr": "*bf16", "x_ptr": "*bf16", "scratch_ptr": "*bf16",
                 "out_ptr": "*bf16", "n": "i32", "OP": "constexpr", "ACC": "constexpr", "STAGE": "constexpr"},
                 {"OP": "max", "ACC": tl.float32, "STAGE": False}),
    "one_shot_staged": (K.all_reduce_one_shot_kernel, {"src_ptr": "*bf16", "x_ptr": "*bf16", "scratch_ptr": "*bf16",
                        "out_ptr": "*bf16", "n": "i32", "OP": "constexpr", "ACC": "constexpr", "STAGE": "constexpr"},
                        {"OP": "sum", "ACC": tl.float32, "STAGE": True}),
    "two_shot": (K.all_reduce_two_shot_kernel, {"src_ptr": "*i64", "x_ptr": "*i64", "scratch_ptr": "*i64",
                 "out_ptr": "*i64", "n": "i32", "chunk": "i32", "OP": "constexpr", "ACC": "constexpr",
                 "STAGE": "constexpr"}, {"OP": "min", "ACC": tl.int64, "STAGE": False}),
    "two_shot_staged": (K.all_reduce_two_shot_kernel, {"src_ptr": "*fp16", "x_ptr": "*fp16", "scratch_ptr": "*fp16",
                        "out_ptr": "*fp16", "n": "i32", "chunk": "i32", "OP": "constexpr", "ACC": "constexpr",
                        "STAGE": "constexpr"}, {"OP": "sum", "ACC": tl.float32, "STAGE": True}),
}
results = {}
for name, (fn, sig, cst) in CASES.items():
    for ones in (False, True):
        signature = {**sig, **COMMON}
        constexprs = {"BLOCK": 1024, "WORLD_BLOCK": 8, **cst}
        if ones:
            signature, constexprs = with_ones(signature, constexprs,
                                              ("rank", "world_size", "n", "m", "chunk", "inner", "src", "equal_rows"))
        results[f"{name}{'-ones' if ones else ''}"] = outcome(fn, signature, constexprs)
print(json.dumps(results))
'''


@pytest.mark.sm90_child(CHILD)
def test_collective_kernels_compile_for_sm90_also_with_arguments_equal_to_one(tmp_path):
    assert_compiled(CHILD, tmp_path, 26)
