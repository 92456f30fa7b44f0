"""Argument bundles of trident's own kernels: the groups that recur, passed to device helpers as one value.

A kernel keeps a grouped launch signature (tensors one by one, sizes and strides as tuples, the team
as ``rank, world_size, heap_bases``) and makes its bundles once, at the top::

    team = Team(rank, world_size, heap_bases)
    gemm = Gemm(a, b, shape, strides, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA)
    out = Output(c, gemm.M, gemm.N, stride_cm, 1, BLOCK_M, BLOCK_N, GROUP_M)
    call, arrival = enter_call(sync_ptr, c, team, WORLD_BLOCK)   # a CallSync (trident.ops.fused.sync)
    ...
    acc = tile_dot(gemm, pid_m, pid_n)
    offs, mask = output_tile(out, pid_m, pid_n)
    finish_call(call, team)

Helpers take the bundles and read their fields (``team.rank``, ``gemm.BLOCK_K``, ``call.epoch``).
The public device API keeps its ``(ptr, rank, peer, heap_bases)`` form: a helper calls
``trident.store(ptr, x, team.rank, peer, team.heap_bases)``.

The bundles are Triton aggregates (``triton.language.core._aggregate``, the decorator Gluon uses;
Triton 3.6 to 3.9 export it under that name only): fields only, no methods (Triton 3.6's interpreter
cannot call an aggregate's methods). Compiled, a field holds a Triton value: a tensor, a tensor
descriptor, or a constexpr (a block size, or an integer argument Triton specialized, such as a rank
of 1). In the simulator (Triton's interpreter, plain Python) a field holds what the kernel had: tensors,
and numbers as plain numbers, which mix with tensors as the kernel's own constexprs do. Absent
arguments (a ``trace_ptr`` of None) stay out of bundles, where the compiler would see a constexpr.
Upper-case fields are constexprs. Building a bundle costs nothing at run time: its fields are values
the kernel holds anyway, and Triton inlines the helpers that take it.

No ``from __future__ import annotations`` here: Triton 3.6 checks each field's value against its
annotation, which must be a class.
"""

import triton
import triton.language as tl
from triton.language.core import _aggregate as aggregate

#: A field's type: a Triton value (a tensor, a pointer, a tensor descriptor, a constexpr), or in the
#: simulator a plain number; Triton checks fields against it, so it admits all of them.
Value = object


@triton.constexpr_function
def _value(x):
    """``x`` as a field holds it: compiled, a number (a constexpr argument, which Triton hands over
    unwrapped, or a specialized integer) becomes a constexpr again; in the simulator it stays a number."""
    return x if triton.knobs.runtime.interpret or isinstance(x, tl.core.base_value) else tl.constexpr(x)


@aggregate
class Team:
    """The ranks a kernel works with: this rank, how many there are, and every rank's heap base."""

    rank: Value
    world_size: Value
    heap_bases: Value

    @triton.constexpr_function
    def __init__(self, rank, world_size, heap_bases):
        self.rank = _value(rank)
        self.world_size = _value(world_size)
        self.heap_bases = _value(heap_bases)


@aggregate
class CallSync:
    """A fused call's synchronization state (:mod:`trident.ops.fused.sync`): the sync block, the call's
    epoch, where its symmetric operand lies in this rank's heap (bytes from the base; 0 for a kernel
    that does not enter the call), and ``WORLD_BLOCK`` (a power of two >= world_size: one lane per rank)."""

    sync_ptr: Value
    epoch: Value
    offset: Value
    WORLD_BLOCK: Value

    @triton.constexpr_function
    def __init__(self, sync_ptr, epoch, offset, WORLD_BLOCK):
        self.sync_ptr = _value(sync_ptr)
        self.epoch = _value(epoch)
        self.offset = _value(offset)
        self.WORLD_BLOCK = _value(WORLD_BLOCK)


@aggregate
class Gemm:
    """The operands of ``A @ B`` and how its output is tiled (:mod:`trident.ops.gemm.tiles`).

    ``a`` and ``b`` are tensor descriptors (``USE_TMA``) or pointers to A (``M x K``) and B (``K x N``),
    or (``B_TMA`` without ``USE_TMA``) a pointer to A and a descriptor of B: where A's rows come from
    another tensor tile by tile (all_gather_gemm), B still needs no pointer tensor in the K loop;
    ``shape`` is ``(M, N, K)`` and ``strides`` starts with A's and B's element strides
    ``(stride_am, stride_ak, stride_bk, stride_bn, ...)`` (what follows, C's, is not read here).
    Output tiles are ``BLOCK_M x BLOCK_N``, walked in groups of ``GROUP_M`` tile rows; the K loop
    steps by ``BLOCK_K``.
    """

    a: Value
    b: Value
    M: Value
    N: Value
    K: Value
    stride_am: Value
    stride_ak: Value
    stride_bk: Value
    stride_bn: Value
    BLOCK_M: Value
    BLOCK_N: Value
    BLOCK_K: Value
    GROUP_M: Value
    USE_TMA: Value
    B_TMA: Value

    @triton.constexpr_function
    def __init__(self, a, b, shape, strides, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA, B_TMA=False):
        self.a = _value(a)
        self.b = _value(b)
        self.M = _value(shape[0])
        self.N = _value(shape[1])
        self.K = _value(shape[2])
        self.stride_am = _value(strides[0])
        self.stride_ak = _value(strides[1])
        self.stride_bk = _value(strides[2])
        self.stride_bn = _value(strides[3])
        self.BLOCK_M = _value(BLOCK_M)
        self.BLOCK_N = _value(BLOCK_N)
        self.BLOCK_K = _value(BLOCK_K)
        self.GROUP_M = _value(GROUP_M)
        self.USE_TMA = _value(USE_TMA)
        self.B_TMA = _value(B_TMA)


@aggregate
class Output:
    """The output matrix C (``M x N``, element strides ``stride_cm, stride_cn``) and its tiling, as the GEMM
    that writes it tiles it (``BLOCK_M x BLOCK_N``, ``GROUP_M``): a kernel that stores or sends C's tiles
    walks them with it. ``c`` is a pointer or, in the matmul, a tensor descriptor."""

    c: Value
    M: Value
    N: Value
    stride_cm: Value
    stride_cn: Value
    BLOCK_M: Value
    BLOCK_N: Value
    GROUP_M: Value

    @triton.constexpr_function
    def __init__(self, c, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N, GROUP_M):
        self.c = _value(c)
        self.M = _value(M)
        self.N = _value(N)
        self.stride_cm = _value(stride_cm)
        self.stride_cn = _value(stride_cn)
        self.BLOCK_M = _value(BLOCK_M)
        self.BLOCK_N = _value(BLOCK_N)
        self.GROUP_M = _value(GROUP_M)


__all__ = ["Team", "CallSync", "Gemm", "Output", "Value"]
