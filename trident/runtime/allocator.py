"""The symmetric allocator: byte offsets inside one heap, identical on every rank.

Each rank runs its own copy of this allocator. It is deterministic (first fit over a free list
kept in offset order, neighbours merged on free), so the same sequence of allocations and frees
gives the same offsets everywhere: that is what makes a tensor symmetric. The allocator also
keeps a running digest of that sequence; ranks compare digests at every barrier (and at every
call in debug mode) to catch a rank whose sequence diverged before it corrupts a peer's data.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass

from ..errors import HeapExhaustedError


@dataclass(frozen=True)
class Block:
    """One allocation: ``size`` bytes at ``offset`` from the heap base."""

    offset: int
    size: int


def _align_up(value: int, align: int) -> int:
    return (value + align - 1) // align * align


class SymmetricAllocator:
    """First-fit allocator over ``[start, end)`` byte offsets.

    Args:
        start: first usable offset (the control block lies before it).
        end: one past the last usable offset (the heap size).
        align: every block starts on a multiple of this many bytes.

    Example::

        alloc = SymmetricAllocator(65536, 1 << 20, 256)
        block = alloc.allocate(1000, "zeros float32 [250]")
        alloc.free(block.offset)
    """

    def __init__(self, start: int, end: int, align: int):
        if start % align or start >= end:
            raise ValueError(f"bad heap range [{start}, {end}) for alignment {align}")
        self.start, self.end, self.align = start, end, align
        self._free: list[tuple[int, int]] = [(start, end - start)]  # (offset, size), by offset
        self._used: dict[int, Block] = {}
        self._digest = hashlib.sha256()
        self.ops = 0  # allocations and frees so far, part of every divergence report
        self.peak = 0
        self.last_op = "nothing yet"

    # -- queries -------------------------------------------------------------------------
    @property
    def allocated_bytes(self) -> int:
        """Bytes in live blocks."""
        return sum(b.size for b in self._used.values())

    @property
    def free_bytes(self) -> int:
        """Bytes in free ranges (not necessarily contiguous)."""
        return sum(size for _, size in self._free)

    @property
    def largest_free_block(self) -> int:
        """Size of the largest free range: the biggest allocation that can succeed now."""
        return max((size for _, size in self._free), default=0)

    @property
    def digest(self) -> str:
        """Hex digest of every allocation and free so far; equal on every rank when in step."""
        return self._digest.hexdigest()[:16]

    def block_at(self, offset: int) -> Block | None:
        """The live block that starts at ``offset``, if any."""
        return self._used.get(offset)

    def block_containing(self, offset: int) -> Block | None:
        """The live block whose bytes include ``offset``, if any."""
        starts = sorted(self._used)
        i = bisect.bisect_right(starts, offset) - 1
        if i >= 0:
            block = self._used[starts[i]]
            if offset < block.offset + max(block.size, 1):
                return block
        return None

    def live_blocks(self) -> list[Block]:
        """Every live block, by offset."""
        return [self._used[o] for o in sorted(self._used)]

    # -- updates -------------------------------------------------------------------------
    def allocate(self, nbytes: int, what: str) -> Block:
        """Reserve ``nbytes`` (rounded up to the alignment; at least one unit) and return the block.

        Raises:
            HeapExhaustedError: no free range is large enough; the allocator is unchanged.
        """
        if nbytes < 0:
            raise ValueError(f"cannot allocate a negative number of bytes ({nbytes})")
        size = _align_up(max(nbytes, 1), self.align)
        for i, (offset, free_size) in enumerate(self._free):
            if free_size >= size:
                if free_size == size:
                    del self._free[i]
                else:
                    self._free[i] = (offset + size, free_size - size)
                block = Block(offset, size)
                self._used[offset] = block
                self._record(f"alloc {size} for {what}")
                self.peak = max(self.peak, self.allocated_bytes)
                return block
        raise HeapExhaustedError(
            f"symmetric heap exhausted: {what} needs {nbytes} bytes ({size} aligned) but only "
            f"{self.free_bytes} of {self.end} bytes are free (largest free range {self.largest_free_block} "
            f"bytes). Free tensors with ctx.free(t) or pass a larger heap_size to trident.init()."
        )

    def free(self, offset: int) -> Block:
        """Return the block starting at ``offset`` to the free list, merging with its neighbours."""
        block = self._used.pop(offset, None)
        if block is None:
            raise ValueError(f"no live allocation starts at heap offset {offset:#x} (double free?)")
        i = bisect.bisect_left(self._free, (offset, 0))
        self._free.insert(i, (offset, block.size))
        # Merge with the next range, then with the previous one.
        if i + 1 < len(self._free) and offset + block.size == self._free[i + 1][0]:
            self._free[i] = (offset, block.size + self._free[i + 1][1])
            del self._free[i + 1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:
            prev_offset, prev_size = self._free[i - 1]
            self._free[i - 1] = (prev_offset, prev_size + self._free[i][1])
            del self._free[i]
        self._record(f"free {block.size} at {offset:#x}")
        return block

    def _record(self, op: str) -> None:
        self.ops += 1
        self.last_op = op
        self._digest.update(op.encode() + b";")
