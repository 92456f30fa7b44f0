"""The one small-call cache: what a call of an op decided and launched, kept per *layout*.

A decode loop calls the same collective or fused op every step, often on tensors that are new
each step (a compiled model's fresh activations, a custom op's fresh output). Everything the
first call checked and decided is a function of the call's *layout*: its tensors' shapes,
strides and dtypes, where each lies (on the heap or not, 16-byte aligned or not, which of them
share memory), and its options. So the cache is keyed on that, never on addresses, and a
recorded call is replayed with this call's addresses bound in (:mod:`trident.calls.recording`).

Each team (a context, a group) has one :class:`CallCache` (``team.call_cache``). Entries are
valid in one *generation* of the team's resources (:class:`trident.runtime.resources.Resources`):
a workspace buffer that grew, a ``heap_scope`` that ended or a ``close()`` starts a new one, and
the cache forgets everything recorded on the old buffers. Nothing outside this module and
``resources.py`` reads or bumps the generation.
"""

from __future__ import annotations

#: Entries a cache keeps; past this many layouts the oldest is dropped (a loop over ever-new
#: shapes must not grow the cache without bound).
MAX_ENTRIES = 256


def layout_key(name: str, tensors: tuple, options: tuple, heap: tuple[int, int] | None):
    """A call's key: ``name``, ``options`` and every tensor's layout, with no address in it.

    Per tensor: shape, strides, dtype, whether its base is 16-byte aligned (Triton specializes
    pointers on it; TMA needs it) and whether it starts inside ``heap`` (``(lo, hi)`` addresses,
    or None: nothing counts as on the heap). Across tensors: which earlier tensor each overlaps
    (in-place calls and aliasing decide what a call launches). ``None`` entries of ``tensors``
    (absent optional operands) stay None.

    Returns:
        A hashable key, or None when an option is not hashable (the call takes the full path,
        which says what is wrong with it).

    Example::

        key = layout_key("all_reduce", (x, out), ("sum", "auto"), (heap_lo, heap_hi))
    """
    try:
        return _key(name, tensors, options, heap)
    except (AttributeError, TypeError, RuntimeError, NotImplementedError):
        return None  # not a tensor, a tensor without storage (meta), an unhashable option: the full path


def _key(name: str, tensors: tuple, options: tuple, heap: tuple[int, int] | None):
    parts: list[object] = [name, options]
    spans: list[tuple[int, int] | None] = []
    lo, hi = heap if heap is not None else (0, 0)
    for t in tensors:
        if t is None:
            parts.append(None)
            spans.append(None)
            continue
        ptr = t.data_ptr()
        end = ptr + t.nbytes
        overlap = -1
        for j, span in enumerate(spans):
            if span is not None and (span[0] < end and ptr < span[1] or span[0] == ptr):
                overlap = j
                break
        spans.append((ptr, end))
        parts.append((t.shape, t.stride(), t.dtype, not ptr & 15, lo <= ptr < hi, overlap))
    key = tuple(parts)
    hash(key)
    return key


class CallCache:
    """Entries by layout key, valid in the current generation of ``resources`` (None: forever,
    for calls outside any team such as ``trident.ops.matmul``).

    Example::

        entry = team.call_cache.get(key)
        if entry is None:
            entry = full_call(...)
            team.call_cache.put(key, entry, generation)
    """

    __slots__ = ("_resources", "_generation", "_entries", "max_entries", "__weakref__")

    def __init__(self, resources=None, max_entries: int = MAX_ENTRIES):
        self._resources = resources
        self._generation = self.generation
        if resources is not None:
            resources.caches.add(self)  # cleared at once when the memory moves (Resources.moved)
        self._entries: dict = {}
        self.max_entries = max_entries

    @property
    def generation(self) -> int:
        """The generation of the resources now (entries recorded in another one are stale)."""
        return 0 if self._resources is None else self._resources.generation

    def get(self, key):
        """The entry kept for ``key`` (None if none, or if it was recorded on buffers that have moved)."""
        if self._resources is not None and self._resources.generation != self._generation:
            self._entries.clear()
            self._generation = self._resources.generation
        return self._entries.get(key)

    def put(self, key, entry, generation: int | None = None) -> bool:
        """Keep ``entry`` for ``key`` if the resources are still in ``generation`` (the one the entry
        was made in; None: now). Returns whether it was kept."""
        if key is None or (generation is not None and generation != self.generation):
            return False
        self.get(None)  # forget stale entries first
        if key not in self._entries and len(self._entries) >= self.max_entries:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = entry
        return True

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()

    def __len__(self) -> int:
        self.get(None)
        return len(self._entries)

