"""Where things live inside each rank's heap. Shared by the host runtime and the device API.

Every heap starts with a reserved *control block*; user tensors are allocated after it.
The control block holds the settings a device-side wait reads (its timeout, the abort flag),
the first fault a kernel reported, and the slots of the device barrier. It is a table of
int64 words; the constants below are word indices.
"""

#: Bytes reserved at the start of every heap for the control block.
CONTROL_BYTES = 64 * 1024
#: Every allocation starts on this boundary (bytes); wide enough for 16-byte vector and TMA accesses.
ALLOC_ALIGN = 256
#: Heap bases must be aligned to this (bytes); the device API promises it to the compiler.
BASE_ALIGN = 256
#: Largest world size the control block has barrier slots for.
MAX_WORLD = 4096

MAGIC_VALUE = 0x54524944454E5431  # "TRIDENT1"

# Word indices (int64) inside the control block.
MAGIC = 0
HEAP_SIZE = 1
WAIT_TIMEOUT_NS = 2
ABORT = 3
ERROR_COUNT = 4
ERROR_KIND = 5
ERROR_RANK = 6
ERROR_PEER = 7
ERROR_OFFSET = 8
ERROR_EXPECTED = 9
ERROR_OBSERVED = 10
# Address (in this process) of the word device waits poll for an abort: on GPUs a pinned host word,
# so the host can raise it with a plain CPU store, no CUDA call that a busy or wedged driver could stall.
ABORT_ADDR = 11
SCRATCH = 12  # where debug mode sends a CAS whose address is outside the heap
WORLD_SIZE = 13  # the job's world size: debug mode checks every peer against it
BARRIER_EPOCH = 16
BARRIER_SLOTS = 1024  # one int64 per rank: the last barrier epoch that rank announced here
# Tensors registered with ctx.register (trident.runtime.windows): their count, then a (start, end)
# pair per window, byte offsets from this rank's heap base (start may be negative: the memory lies
# outside the heap). Debug mode's access check accepts addresses inside them as well as the heap.
WINDOW_COUNT = BARRIER_SLOTS + MAX_WORLD
WINDOW_RANGES = WINDOW_COUNT + 1
MAX_WINDOWS = 256

# Fault kinds written to ERROR_KIND.
ERR_WAIT_TIMEOUT = 1
ERR_OUT_OF_HEAP = 2
ERR_ABORTED = 3
ERR_BAD_PEER = 4
ERR_CAPACITY = 5  # a receive buffer (an MoE dispatch's capacity) too small: EXPECTED rows held, OBSERVED needed;
#                   OFFSET 1 when a region of the masked layout overflowed, else 0
ERR_UNREACHABLE = 6  # a peer in another node, whose heap is not mapped (heap_bases[peer] == 0)
# A fused call's symmetric operand at another heap offset on a peer: EXPECTED this rank's, OBSERVED the peer's.
# The call then reached no peer (trident.ops.fused.sync), so waits that would wait for one give up at once.
ERR_OFFSETS_DIFFER = 7

assert (WINDOW_RANGES + 2 * MAX_WINDOWS) * 8 <= CONTROL_BYTES


def align_up(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`ALLOC_ALIGN` (heap sizes, regions, allocations)."""
    return -(-int(nbytes) // ALLOC_ALIGN) * ALLOC_ALIGN


def span_bytes(shape, strides, itemsize: int) -> int:
    """Bytes from a tensor's first element to one past its last (0 when it has no elements):
    ``span_bytes(t.shape, t.stride(), t.element_size())``."""
    if any(n == 0 for n in shape):
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))) * itemsize
