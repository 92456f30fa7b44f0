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
    # stream-K on 4 programs: 15 tiles, 8 whole, then 7 x 7 K blocks shared out in ranges that
    # cross tile boundaries; 2 tiles in 3 K blocks each over 4 programs; 6 tiles stored by descriptor
    (80, 48, 112, MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1,
                               stream_k=True, tma=False)),
    (32, 16, 48, MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=4, num_stages=1,
                              stream_k=True)),
    (48, 64, 80, MatmulConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1,
                              stream_k=True, c_tma=True, subtile=True, programs=5)),
    (16, 16, 160, MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=4, num_stages=1,
                               stream_k=True, programs=3)),  # one tile in three pieces
]
TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 5e-3}  # fp32 runs as TF32 on GPUs


def _rel_err(got, want):
    return float((got.double() - want).norm() / want.norm())


def _matmul_body(ctx):
    from trident.ops import matmul
    from trident.ops.matmul import operands

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


def test_stream_k_keeps_all_full_waves_but_one_whole():
    from trident.ops.matmul import cut_tiles

    sk = MatmulConfig(stream_k=True)
    assert cut_tiles(320, 132, sk, 576) == 132  # 3 waves: the first whole, 188 tiles shared out
    assert cut_tiles(160, 132, sk, 576) == 0  # 1.2 waves: everything shared out
    assert cut_tiles(264, 132, sk, 576) == 264  # no partial wave: nothing to share
    assert cut_tiles(100, 132, sk, 1) == 100  # one K block: nothing to cut
    assert cut_tiles(320, 132, MatmulConfig(), 576) == 320
    assert cut_tiles(320, 132, MatmulConfig(split_k=2), 576) == 0


def test_config_refuses_two_ways_to_cut_k():
    import pytest

    with pytest.raises(ValueError, match="choose one"):
        MatmulConfig(split_k=2, stream_k=True)
    with pytest.raises(ValueError, match="at least 1"):
        MatmulConfig(split_k=0)


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
