"""The control block's word indices and the fault kinds, as Triton constants for kernels.

The same numbers as :mod:`trident.layout` (which the host reads), wrapped in ``tl.constexpr`` so
that ``@triton.jit`` code can use them; every device module imports them from here.
"""

import triton.language as tl

from .. import layout

# Words of the control block (int64 indices; trident.layout says what each holds).
HEAP_SIZE = tl.constexpr(layout.HEAP_SIZE)
WAIT_TIMEOUT_NS = tl.constexpr(layout.WAIT_TIMEOUT_NS)
ERROR_COUNT = tl.constexpr(layout.ERROR_COUNT)
ERROR_KIND = tl.constexpr(layout.ERROR_KIND)
ERROR_RANK = tl.constexpr(layout.ERROR_RANK)
ERROR_PEER = tl.constexpr(layout.ERROR_PEER)
ERROR_OFFSET = tl.constexpr(layout.ERROR_OFFSET)
ERROR_EXPECTED = tl.constexpr(layout.ERROR_EXPECTED)
ERROR_OBSERVED = tl.constexpr(layout.ERROR_OBSERVED)
ABORT_ADDR = tl.constexpr(layout.ABORT_ADDR)
SCRATCH = tl.constexpr(layout.SCRATCH)
WORLD_SIZE = tl.constexpr(layout.WORLD_SIZE)
BARRIER_EPOCH = tl.constexpr(layout.BARRIER_EPOCH)
BARRIER_SLOTS = tl.constexpr(layout.BARRIER_SLOTS)
WINDOW_COUNT = tl.constexpr(layout.WINDOW_COUNT)
WINDOW_RANGES = tl.constexpr(layout.WINDOW_RANGES)

# Fault kinds (ERROR_KIND).
ERR_WAIT_TIMEOUT = tl.constexpr(layout.ERR_WAIT_TIMEOUT)
ERR_OUT_OF_HEAP = tl.constexpr(layout.ERR_OUT_OF_HEAP)
ERR_ABORTED = tl.constexpr(layout.ERR_ABORTED)
ERR_BAD_PEER = tl.constexpr(layout.ERR_BAD_PEER)
ERR_CAPACITY = tl.constexpr(layout.ERR_CAPACITY)
ERR_UNREACHABLE = tl.constexpr(layout.ERR_UNREACHABLE)
ERR_OFFSETS_DIFFER = tl.constexpr(layout.ERR_OFFSETS_DIFFER)

#: Heap bases are aligned to this many bytes (promised to the compiler by pointer translation).
BASE_ALIGN = tl.constexpr(layout.BASE_ALIGN)
