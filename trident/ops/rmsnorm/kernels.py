"""The kernel of ``trident.ops.all_reduce_rmsnorm``: one-shot all-reduce + residual add + RMSNorm.

One program per row group, persistent: program ``pid`` handles rows ``pid, pid + programs, ...``.
Every rank reduces every row itself (one-shot): it reads each peer's copy of the row
(``reduce_tile``, rotated peer order, fp32), adds its local residual, normalises the row while it
is in registers and stores ``h`` and ``out`` into its *own* (possibly plain) outputs. Nothing is
written to peers, so no scratch and no middle sync are needed. An input that is not on the heap
is staged by the kernel itself: program ``pid`` copies its own rows into this rank's stage before
the entry sync, and program ``pid`` of every peer reads exactly those rows (the same rows on every
rank), so the sync's release publishes them; no separate copy launch. The collectives' entry sync
(peers' inputs are ready, heap offsets exchanged through ``shift``) and exit sync (nobody reads my
input any more, so the next call may overwrite it) bracket the work, with epochs on the device.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...ccl.device import reduce_tile
from ...ccl.kernels import _ARRIVAL, _enter, _exit
from ...device import arrival_ticket

#: Largest magnitude of float8_e4m3fn.
FP8_E4M3_MAX = 448.0
_FP8_MAX = tl.constexpr(FP8_E4M3_MAX)


@triton.jit
def _round_to_e4m3(v):
    """``v`` (fp32, |v| <= 448) rounded to the nearest float8_e4m3fn value (ties to even), still fp32.

    Triton's interpreter converts fp32 -> fp8e4nv wrongly when rounding carries into the exponent
    (127.7 -> 64 instead of 128); values already on the fp8 grid convert exactly. The simulator
    therefore rounds here first; on a GPU the hardware conversion (round to nearest even) is used.
    """
    bits = v.to(tl.int32, bitcast=True)
    exponent = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)  # below 2**-6: fp8 subnormals, step 2**-9
    ulp = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 3 mantissa bits
    magic = 12582912.0  # 1.5 * 2**23: adding and subtracting it rounds |v / ulp| <= 16 to an integer, ties to even
    rounded = ((v / ulp + magic) - magic) * ulp
    return tl.where(rounded == 0, v * 0.0, rounded)  # keep the sign of zero


@triton.jit
def all_reduce_rmsnorm_kernel(
    src_ptr, x_ptr,                                   # the caller's x; x on the heap (peers read it)
    residual_ptr, weight_ptr, out_ptr, h_ptr,         # local
    scale_ptr, scale_value, eps,                      # fp8 scale: a 1-element tensor, else scale_value
    shape,                                            # (tokens, hidden)
    sync_ptr,
    rank, world_size, heap_bases,
    ROUND_FP8_IN_FP32: tl.constexpr, STAGE: tl.constexpr, BLOCK_H: tl.constexpr, WORLD_BLOCK: tl.constexpr,
):
    """``h = sum over ranks of x (+ residual)``, ``out = h * rsqrt(mean(h^2) + eps) * weight`` per row.

    With ``STAGE``, ``x_ptr`` is the stage and ``src_ptr`` the caller's x; else both are x. An fp8 ``out``
    (float8_e4m3fn) is scaled and clamped to fp8's range."""
    FP8_OUT: tl.constexpr = out_ptr.dtype.element_ty == tl.float8e4nv
    tokens, hidden = shape
    pid = arrival_ticket(sync_ptr + _ARRIVAL)  # programs by arrival: the k-th to start meets the k-th on every peer
    cols = tl.arange(0, BLOCK_H)
    in_row = cols < hidden
    if STAGE:  # my rows into my stage; the previous call's readers of them passed its exit sync
        for row in range(pid, tokens, tl.num_programs(0)):
            offs = tl.cast(row, tl.int64) * hidden + cols
            tl.store(x_ptr + offs, tl.load(src_ptr + offs, mask=in_row), mask=in_row)
    epoch, shift = _enter(x_ptr, sync_ptr, pid, rank, world_size, heap_bases, WORLD_BLOCK)
    weight = tl.load(weight_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
    if FP8_OUT:
        if scale_ptr is not None:
            scale = tl.load(scale_ptr).to(tl.float32)
        else:
            scale = scale_value
    for row in range(pid, tokens, tl.num_programs(0)):
        offs = tl.cast(row, tl.int64) * hidden + cols
        h = reduce_tile(x_ptr + offs, rank, world_size, heap_bases, in_row, "sum", tl.float32, shift)
        if residual_ptr is not None:
            h += tl.load(residual_ptr + offs, mask=in_row, other=0.0).to(tl.float32)
        tl.store(h_ptr + offs, h.to(h_ptr.dtype.element_ty), mask=in_row)
        inv_rms = tl.rsqrt(tl.sum(h * h, axis=0) / hidden + eps)
        y = h * inv_rms * weight
        if FP8_OUT:
            y = tl.minimum(tl.maximum(y / scale, -_FP8_MAX), _FP8_MAX)
            if ROUND_FP8_IN_FP32:
                y = _round_to_e4m3(y)
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=in_row)
    _exit(epoch, sync_ptr, pid, rank, world_size, heap_bases, WORLD_BLOCK)


def num_warps(block_h: int) -> int:
    """Warps for a row of ``block_h`` elements (a power of two)."""
    return 4 if block_h <= 1024 else 8 if block_h <= 4096 else 16


__all__ = ["all_reduce_rmsnorm_kernel", "num_warps", "FP8_E4M3_MAX"]
