"""Tile-level building blocks shared by the matmul and the GEMM + communication patterns.

A persistent kernel walks output tiles ``tile = pid, pid + P, pid + 2P, ...``; for each one it
asks :func:`tile_coords` where the tile sits, :func:`tile_dot` for its fp32 accumulator, and
:func:`tile_offsets` for where it goes. The GEMM's operands, sizes, strides and tiling travel as one
:class:`~trident.device.bundles.Gemm` (``gemm = Gemm(a, b, (M, N, K), strides, BLOCK_M, BLOCK_N,
BLOCK_K, GROUP_M, USE_TMA)`` at the top of the kernel). Two ways to read A and B, chosen by
``USE_TMA`` (a ``tl.constexpr``):

* ``USE_TMA=True``: ``a`` and ``b`` are host-made ``TensorDescriptor`` objects, and each block
  is one bulk tensor copy (TMA on Hopper) into shared memory; out-of-range rows and columns
  read as zero. Needs 16-byte aligned bases and row strides.
* ``USE_TMA=False``: ``a`` and ``b`` are plain pointers with strides; any layout, any alignment.

Both run in the simulator (Triton 3.6's interpreter executes descriptor loads). ``Gemm`` and
``Output`` are importable from here, with the helpers that take them (this module is public API).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...device.bundles import Gemm, Output  # noqa: F401 (public here: the tile helpers take them)


@triton.jit
def tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Row and column (in tiles) of output tile ``tile_id`` in grouped order.

    Consecutive tile ids walk down a group of ``GROUP_M`` tile rows before moving one tile
    column right, so programs running at the same time share rows of A and columns of B in L2.

    Returns:
        ``(pid_m, pid_n)``.

    Example::

        pid_m, pid_n = tile_coords(tile, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), 8)
    """
    in_group = GROUP_M * num_pid_n
    first_m = (tile_id // in_group) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % in_group) % group_m
    pid_n = (tile_id % in_group) // group_m
    return pid_m, pid_n


@triton.jit
def tile_dot(gemm, pid_m, pid_n):
    """One output tile of ``A @ B`` as an fp32 accumulator of shape ``(BLOCK_M, BLOCK_N)``.

    Args:
        gemm: the operands and tiling, a :class:`~trident.device.bundles.Gemm` (its strides are
            ignored with ``USE_TMA``).
        pid_m, pid_n: the tile, from :func:`tile_coords`.

    Returns:
        The fp32 tile; rows and columns past M and N hold garbage or zeros (mask them on store).

    Example::

        gemm = Gemm(a, b, (M, N, K), (K, 1, N, 1), 128, 128, 64, 8, True)
        acc = tile_dot(gemm, pid_m, pid_n)
    """
    return tile_dot_range(gemm, pid_m * gemm.BLOCK_M, pid_n * gemm.BLOCK_N, 0, tl.cdiv(gemm.K, gemm.BLOCK_K))


@triton.jit
def tile_dot_range(gemm, off_m, off_n, k_first, k_last):
    """The ``BLOCK_M x BLOCK_N`` block of ``A @ B`` whose first row and column are ``off_m, off_n``
    (any offsets, not only multiples of the block), over the K blocks ``k_first .. k_last - 1``
    (all of them: ``0, tl.cdiv(K, BLOCK_K)``; fewer: a split-K part). fp32. ``gemm`` is a
    :class:`~trident.device.bundles.Gemm`.

    Example::

        part = tile_dot_range(gemm, pid_m * 128, pid_n * 128, 0, 8)
    """
    return tile_dot_wide(gemm, None, 0, off_m, off_n, k_first, k_last)[0]


@triton.jit
def tile_dot_wide(gemm, b_tail, TAIL_N: tl.constexpr, off_m, off_n, k_first, k_last):
    """:func:`tile_dot_range` of a block ``BLOCK_N + TAIL_N`` columns wide, in one K loop: ``(acc, tail)``,
    the ``BLOCK_M x BLOCK_N`` block at ``off_n`` and the ``BLOCK_M x TAIL_N`` block right of it.

    Triton's blocks are powers of two; two of them side by side tile a width no power of two
    divides without ragged columns (an 8-rank shard's 576 = 2 x (256 + 32)). Each K step loads A's
    block once for both dots. ``b_tail`` reads B's tail columns: a descriptor of ``BLOCK_K x TAIL_N``
    boxes when the operands are read through descriptors (``USE_TMA``, ``B_TMA``), else B's pointer.
    ``TAIL_N`` 0 (``b_tail`` None): no tail, and ``tail`` is a placeholder.

    Example::

        acc, tail = tile_dot_wide(gemm, b_tail, 32, pid_m * 128, pid_n * 288, 0, tl.cdiv(K, 64))
    """
    BLOCK_M: tl.constexpr = gemm.BLOCK_M
    BLOCK_N: tl.constexpr = gemm.BLOCK_N
    BLOCK_K: tl.constexpr = gemm.BLOCK_K
    TAIL: tl.constexpr = TAIL_N > 0
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    tail = tl.full((BLOCK_M, TAIL_N if TAIL else 16), 0.0, tl.float32)  # unused (and dropped) without a tail
    if gemm.USE_TMA:
        for ki in range(k_first, k_last):
            x = gemm.a.load([off_m, ki * BLOCK_K])
            acc = tl.dot(x, gemm.b.load([ki * BLOCK_K, off_n]), acc)
            if TAIL:
                tail = tl.dot(x, b_tail.load([ki * BLOCK_K, off_n + BLOCK_N]), tail)
    else:
        # Rows and columns past the edge wrap around (% M, % N): the loads stay in bounds without
        # masks, and the store masks those lanes out. Only the K edge needs masking (zeros).
        rm = (off_m + tl.arange(0, BLOCK_M)) % gemm.M
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = gemm.a + rm.to(tl.int64)[:, None] * gemm.stride_am + (k_first * BLOCK_K + rk)[None, :] * gemm.stride_ak
        rows_b = (k_first * BLOCK_K + rk).to(tl.int64)
        if gemm.B_TMA:  # B through its descriptor (zeros past K and N): no pointer tensor of B held in the loop
            col = tl.cast(off_n, tl.int32)  # descriptor offsets are 32-bit
        else:
            rn = (off_n + tl.arange(0, BLOCK_N)) % gemm.N
            b_ptrs = gemm.b + rows_b[:, None] * gemm.stride_bk + rn[None, :] * gemm.stride_bn
            if TAIL:
                rt = (off_n + BLOCK_N + tl.arange(0, TAIL_N)) % gemm.N
                t_ptrs = b_tail + rows_b[:, None] * gemm.stride_bk + rt[None, :] * gemm.stride_bn
        for ki in range(k_first, k_last):
            k_left = gemm.K - ki * BLOCK_K
            x = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            if gemm.B_TMA:
                y = gemm.b.load([ki * BLOCK_K, col])
            else:
                y = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
                b_ptrs += BLOCK_K * gemm.stride_bk
            acc = tl.dot(x, y, acc)
            if TAIL:
                if gemm.B_TMA:
                    y_tail = b_tail.load([ki * BLOCK_K, col + BLOCK_N])
                else:
                    y_tail = tl.load(t_ptrs, mask=rk[:, None] < k_left, other=0.0)
                    t_ptrs += BLOCK_K * gemm.stride_bk
                tail = tl.dot(x, y_tail, tail)
            a_ptrs += BLOCK_K * gemm.stride_ak
    return acc, tail


@triton.jit
def tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Element offsets (int64) and the in-bounds mask of tile ``(pid_m, pid_n)`` of an M x N matrix.

    Example::

        offs, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, 1, BLOCK_M, BLOCK_N)
        tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)
    """
    return block_offsets(pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)


@triton.jit
def block_offsets(off_m, off_n, M, N, stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """:func:`tile_offsets` of the ``BLOCK_M x BLOCK_N`` block whose first row and column are ``off_m, off_n``.

    Example::

        offs, mask = block_offsets(pid_m * 128, pid_n * 288 + 256, M, N, stride_cm, 1, 128, 32)
    """
    rm = off_m + tl.arange(0, BLOCK_M)
    rn = off_n + tl.arange(0, BLOCK_N)
    offs = rm.to(tl.int64)[:, None] * stride_cm + rn[None, :] * stride_cn
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    return offs, mask


@triton.jit
def output_tile(out, pid_m, pid_n):
    """:func:`tile_offsets` of tile ``(pid_m, pid_n)`` of an :class:`~trident.device.bundles.Output`:
    ``(offs, mask)``, element offsets from ``out.c`` and the in-bounds mask.

    Example::

        offs, mask = output_tile(out, pid_m, pid_n)
        tl.store(out.c + offs, acc.to(out.c.dtype.element_ty), mask=mask)
    """
    return tile_offsets(pid_m, pid_n, out.M, out.N, out.stride_cm, out.stride_cn, out.BLOCK_M, out.BLOCK_N)


@triton.jit
def shard_tile(tile, rows, N, world_size, first_shard, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               GROUP_M: tl.constexpr):
    """Where tile ``tile`` lies when an ``(world_size * rows) x N`` matrix is cut into ``world_size``
    row shards of ``rows`` rows, each tiled on its own (so no tile straddles two shards).

    Tiles ``0 .. T-1`` (T tiles per shard) are shard ``first_shard``'s, the next T shard
    ``first_shard + 1``'s (mod ``world_size``), and so on; inside a shard, grouped order.

    Returns:
        ``(shard, pid_m, pid_n)``: the shard, and the tile's row and column (in tiles) inside it.

    Example::

        shard, pid_m, pid_n = shard_tile(tile, m, N, world_size, rank, 128, 128, 8)   # my shard first
        rows_from = shard * m + pid_m * 128
    """
    num_pid_m = tl.cdiv(rows, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    per_shard = num_pid_m * num_pid_n
    shard = (first_shard + tile // per_shard) % world_size
    pid_m, pid_n = tile_coords(tile % per_shard, num_pid_m, num_pid_n, GROUP_M)
    return shard, pid_m, pid_n
