"""trident.ops.matmul against torch: dtypes, ragged shapes, tile configs, both read paths, strided out.

Run inside a rank process of the pool: rank processes start with the backend already chosen, so
their kernels are interpreted in the simulator (and compiled with ``--backend cuda``).
"""

import torch

from trident.ops import MatmulConfig

# (M, N, K, config): ragged edges against every block size; None is the table's config.
CASES = [
    (33, 47, 65, None),
    (64, 64, 64, MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=4, num_stages=1)),
    (96, 40, 17, MatmulConfig(BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=2, tma=False)),
    (48, 80, 32, MatmulConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=2,
                              c_tma=True, subtile=True, programs=3)),
    # split-K: 7 K blocks in 3 parts (the last one shorter), and in 2 parts on the descriptor path
    (40, 24, 104, MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1, split_k=3,
                               tma=False)),
    (32, 48, 64, MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=4, num_stages=1, split_k=2)),
    # split_tail on 4 programs (the simulator's): 9 tiles, 8 whole, the last in 2 parts; 2 tiles in 3
    # parts each on 3 programs; 6 tiles, 5 whole, the last in 2 parts stored by descriptor
    (48, 48, 256, MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1,
                               split_tail=True, tma=False)),
    (32, 16, 512, MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=4, num_stages=1,
                               split_tail=True, programs=3)),
    (48, 64, 256, MatmulConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1,
                               split_tail=True, c_tma=True, subtile=True, programs=5)),
    # tiles with a tail of columns, 16 x (32 + 16): 96 = 2 tiles wide exactly (descriptors), and a ragged
    # 70 (pointers; the second tile's tail past N)
    (40, 96, 48, MatmulConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1, tail_n=16)),
    (33, 70, 50, MatmulConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1, tail_n=16,
                              tma=False)),
]
TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 5e-3}  # fp32 runs as TF32 on GPUs


def _rel_err(got, want):
    return float((got.double() - want).norm() / want.norm())


def _matmul_body(ctx):
    from trident.ops import matmul
    from trident.ops.gemm.matmul import operands

    gen = torch.Generator().manual_seed(7)
    out = {}
    dtypes = (torch.float16, torch.bfloat16, torch.float32)
    for dtype in dtypes[ctx.rank::ctx.world_size]:  # the ranks share the cases out
        for M, N, K, cfg in CASES:
            A = torch.randn(M, K, generator=gen).to(dtype).to(ctx.device)
            B = torch.randn(K, N, generator=gen).to(dtype).to(ctx.device)
            C = matmul(A, B, config=cfg)
            want = A.cpu().double() @ B.cpu().double()
            tma = operands(A, B, cfg or MatmulConfig(16, 16, 16))[2]
            out[(str(dtype), M, N, K, tma)] = (_rel_err(C.cpu(), want), bool(torch.isfinite(C).all()))
    # A strided destination (a column block of a wider matrix) is written, and nothing around it.
    A = torch.randn(40, 24, generator=gen).half().to(ctx.device)
    B = torch.randn(24, 32, generator=gen).half().to(ctx.device)
    wide = torch.full((40, 96), -7.0, dtype=torch.float16, device=ctx.device)
    matmul(A, B, out=wide[:, 32:64])
    out["strided"] = (_rel_err(wide[:, 32:64].cpu(), A.cpu().double() @ B.cpu().double()),
                      bool((wide[:, :32] == -7).all() and (wide[:, 64:] == -7).all()))
    return out


def test_matmul_matches_torch_for_dtypes_shapes_and_configs(pool2):
    results = {key: value for per_rank in pool2.run(_matmul_body) for key, value in per_rank.items()}
    assert len(results) == 3 * len(CASES) + 1
    assert any(key[-1] for key in results if key != "strided"), "no case took the descriptor (TMA) path"
    assert any(not key[-1] for key in results if key != "strided"), "no case took the pointer path"
    for key, (err, finite) in results.items():
        tol = 5e-3 if key == "strided" else TOL[getattr(torch, key[0].split(".")[1])]
        assert finite and err < tol, (key, err)


def _repeat_body(ctx):
    import importlib

    from trident.ops import matmul

    prepared = importlib.import_module("trident.ops.gemm.matmul")._PREPARED
    prepared.clear()  # earlier tests in this rank process may have made these signatures
    gen = torch.Generator().manual_seed(11 + ctx.rank)
    errors, added = [], []
    # a table config; a cut tail (scratch per call); TMA with a descriptor store; tiles with a tail of
    # columns through descriptors (B's second descriptor rebased per call) and through pointers
    for M, N, K, cfg in (CASES[0], CASES[6], CASES[3], CASES[9], CASES[10]):
        for call in range(3):  # new inputs and outputs each call, at new addresses
            before = len(prepared)
            A = torch.randn(M, K, generator=gen).half().to(ctx.device)
            B = torch.randn(K, N, generator=gen).half().to(ctx.device)
            keep = [torch.empty(call + 1, device=ctx.device)]  # shift the allocator's next addresses
            C = matmul(A, B, config=cfg)
            errors.append(_rel_err(C.cpu(), A.cpu().double() @ B.cpu().double()))
            added.append(len(prepared) - before)
            del keep
    # Operands that come back to earlier addresses with new data (weights and activations in a loop):
    # on a GPU their TMA descriptors are encoded once per address and reused.
    M, N, K, cfg = CASES[3]
    first, second = ([torch.empty(M, K, device=ctx.device, dtype=torch.half),
                      torch.empty(K, N, device=ctx.device, dtype=torch.half)] for _ in range(2))
    for A, B in (first, second, first, second, first):
        A.copy_(torch.randn(M, K, generator=gen))
        B.copy_(torch.randn(K, N, generator=gen))
        before = len(prepared)
        errors.append(_rel_err(matmul(A, B, config=cfg).cpu(), A.cpu().double() @ B.cpu().double()))
        added.append(len(prepared) - before)
    # The same shapes and strides at a base that is not 16-byte aligned: another signature (Triton
    # specializes pointers on alignment; TMA needs it), then the aligned one again.
    M, N, K, cfg = CASES[1]
    store = torch.randn(M * K + 1, generator=gen).half().to(ctx.device)
    B = torch.randn(K, N, generator=gen).half().to(ctx.device)
    for A in (store[:-1].view(M, K), store[1:].view(M, K), store[:-1].view(M, K)):
        before = len(prepared)
        errors.append(_rel_err(matmul(A, B, config=cfg).cpu(), A.cpu().double() @ B.cpu().double()))
        added.append(len(prepared) - before)
    return errors, added


def test_repeated_calls_launch_the_compiled_kernel_with_new_tensors(pool2):
    """A call with an earlier call's signature goes straight to the compiled kernel (no new entry in the
    cache) and still computes its own product; an unaligned base is another signature."""
    for errors, added in pool2.run(_repeat_body):
        assert all(err < TOL[torch.float16] for err in errors), errors
        assert added == [1, 0, 0] * 5 + [0] * 5 + [1, 1, 0], added


def test_cut_plan_fills_the_last_waves_with_parts():
    from trident.ops.gemm.matmul import cut_plan

    tail = MatmulConfig(split_tail=True)
    assert cut_plan(320, 132, tail, 576) == (264, 7)  # 2.43 waves of work (+ the cost) instead of 3
    assert cut_plan(97, 4, tail, 256) == (96, 4)  # 24 waves and one tile: the tile in 4 parts, one a program
    assert cut_plan(264, 132, tail, 576) == (264, 1)  # no partial wave: nothing to cut
    assert cut_plan(512, 132, tail, 64) == (512, 1)  # 3.9 waves: cutting gains less than it costs
    assert cut_plan(200, 132, tail, 15) == (200, 1)  # parts would be shorter than 8 K blocks
    assert cut_plan(320, 132, MatmulConfig(), 576) == (320, 1)
    assert cut_plan(320, 132, MatmulConfig(split_k=3), 576) == (0, 3)
    assert cut_plan(320, 132, MatmulConfig(split_k=3), 2) == (0, 2)


def test_config_refuses_two_ways_to_cut_k():
    import pytest

    with pytest.raises(ValueError, match="choose one"):
        MatmulConfig(split_k=2, split_tail=True)
    with pytest.raises(ValueError, match="at least 1"):
        MatmulConfig(split_k=0)


def test_config_refuses_a_tail_that_is_no_power_of_two_or_with_cut_tiles():
    import pytest

    for bad in (8, 48, 256):
        with pytest.raises(ValueError, match="tail_n must be 0 or a power of two >= 16 below BLOCK_N=256"):
            MatmulConfig(tail_n=bad)
    for how in (dict(split_k=2), dict(split_tail=True), dict(c_tma=True)):
        with pytest.raises(ValueError, match="never cut and store C through pointers"):
            MatmulConfig(tail_n=32, **how)
    assert MatmulConfig(tail_n=32).width == 288


def test_table_tiles_an_8_rank_shard_with_a_tail_for_the_matmul_only():
    """8192 x 576 x 36864 on 132 SMs: 128 x (256 + 32) tiles, 128 of them, one wave (a 256 x 128 tile
    grid wastes 64 of every 640 columns and has a partial second wave); the fused ops get no tail."""
    from trident.ops import pick_config
    from trident.platform import Platform

    h200 = Platform("cuda", torch.device("cuda", 0), 132, "NVIDIA H200", 1)
    shard = pick_config(8192, 576, 36864, torch.bfloat16, h200)
    assert (shard.BLOCK_M, shard.BLOCK_N, shard.tail_n) == (128, 256, 32)
    assert pick_config(8192, 576, 36864, torch.bfloat16, h200, column_tail=False).tail_n == 0
    for shape in ((8192, 4608, 36864), (8192, 3584, 14336), (8192, 448, 14336), (4096, 4096, 4096)):
        assert pick_config(*shape, torch.bfloat16, h200).tail_n == 0, shape


def _bad_input_body(ctx):
    from trident.ops import matmul
    from trident.testing import refusals

    a = torch.zeros(8, 4, device=ctx.device)
    messages = refusals(dict(enumerate((
        lambda: matmul(a, torch.zeros(5, 3, device=ctx.device)),
        lambda: matmul(a, torch.zeros(4, 3, dtype=torch.float16, device=ctx.device)),
        lambda: matmul(a.int(), torch.zeros(4, 3, device=ctx.device).int()),
        lambda: matmul(a, torch.zeros(4, 3, device=ctx.device), out=torch.zeros(3, 8, device=ctx.device)),
        lambda: matmul(a[0], torch.zeros(4, 3, device=ctx.device))))))
    empty = matmul(torch.zeros(0, 4, device=ctx.device), torch.zeros(4, 3, device=ctx.device))
    zero_k = matmul(torch.zeros(2, 0, device=ctx.device), torch.zeros(0, 3, device=ctx.device))
    return messages, tuple(empty.shape), bool((zero_k == 0).all())


def test_matmul_refuses_bad_input_and_handles_empty_sizes(pool2):
    messages, empty_shape, zero_k = pool2.run(_bad_input_body)[0]
    assert "K mismatch" in messages[0]
    assert "share one dtype" in messages[1]
    assert "dtype torch.int32" in messages[2]
    assert "out must be (8, 3)" in messages[3]
    assert "must be 2-D" in messages[4]
    assert empty_shape == (0, 3) and zero_k
