"""Checks that several test modules make the same way (fixtures stay in ``conftest.py``).

Example::

    from tests.helpers import assert_no_problems

    def test_all_reduce(world_pool):
        assert_no_problems(world_pool, _all_reduce_body)
"""

from __future__ import annotations

import math

import pytest
import torch
import triton

import trident
from trident.ops import MatmulConfig

# -- the fused GEMM ops' tests ----------------------------------------------------------------------

#: Tiles small enough that the tests' small shapes span several of them (and ragged ones).
SMALL = MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1)
#: Taller tiles, no grouping: a second tile walk.
TALL = MatmulConfig(BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=4, num_stages=1)
#: The largest relative error a GEMM result may have, per input dtype (fp32 accumulation).
GEMM_TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 5e-3}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``|got - want| / |want|`` in float64 on the host (``want`` a float64 host tensor); inf when
    ``got`` holds a NaN or inf (a tile nobody wrote: the tests fill C with NaN first)."""
    got = got.cpu().double()
    return float((got - want).norm() / want.norm()) if torch.isfinite(got).all() else math.inf


# -- any test -----------------------------------------------------------------------------------------


def assert_no_problems(pool, body, *args) -> None:
    """Run ``body(ctx, *args)`` on every rank of ``pool``; each rank returns the list of problems it
    found, and every list must be empty (the assertion shows them all)."""
    results = pool.run(body, *args)
    assert results == [[]] * pool.world_size, results


def assert_refused(messages: dict, expected: dict, prefix: str = "") -> None:
    """Every refusal in ``messages`` (call name -> error text, as ``trident.testing.refusals`` gives
    them) contains ``prefix`` (who refused), and each call named in ``expected`` says its text."""
    assert all(prefix in text for text in messages.values()), messages
    for name, text in expected.items():
        assert text in messages[name], (name, text, messages[name])


def assert_gemm_errors(results: list, per_rank: int, *where) -> None:
    """Every rank's list of ``(pattern, dtype, call, relative error)`` has ``per_rank`` entries, each
    error under ``GEMM_TOL[dtype]`` (``where`` goes into the message of one that is not).

    A body returns None instead where the NCCL baseline cannot run (ranks share a GPU): the test
    is skipped there."""
    if results[0] is None:
        pytest.skip("ranks share a GPU: torch.distributed's NCCL baseline cannot run")
    for errors in results:
        assert len(errors) == per_rank
        for name, dtype, call, err in errors:
            assert err < GEMM_TOL[dtype], (*where, name, str(dtype), call, err)


def capture_graph(step) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``step()``, captured on a side stream (as torch wants), after the device is idle."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            step()
    torch.cuda.synchronize()
    return graph


def run_graph_test(pool, body, *args) -> list:
    """``pool.run(body, *args)`` of a body that returns "skipped" without the cuda backend (no CUDA
    graphs): the test is skipped there, else the results are returned."""
    results = pool.run(body, *args)
    if results[0] == "skipped":
        pytest.skip("CUDA graphs need the cuda backend")
    return results


@triton.jit
def wait_for_one_kernel(flag_ptr, rank, heap_bases):
    """Wait until this rank's flag is 1: a kernel that runs until someone sets it, or the wait times out."""
    trident.wait(flag_ptr, 1, rank, rank, heap_bases)
