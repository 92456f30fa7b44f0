"""The one small-call cache: what a call of an op decided and launched, kept per *layout*.

A decode loop calls the same collective or fused op every step, often on tensors that are new
each step (a compiled model's fresh activations, a custom op's fresh output). Everything the
first call checked and decided is a function of the call's *layout*: its tensors' shapes,
strides and dtypes, where each lies (on the heap or not, 16-byte aligned or not, which of them
share memory), and its options. So the cache is keyed on that, never on addresses, and a
recorded call is replayed with this call's addresses bound in (:mod:`trident.calls.recording`).

Each team (a context, a group) has one :class:`CallCache` (``team.call_cache``), registered with
the team's resources (:class:`trident.runtime.resources.Resources`): a workspace buffer that grew,
a ``heap_scope`` that ended or a ``close()`` starts a new *generation* of them and clears every
registered cache at once, so nothing recorded on the old buffers is replayed or kept alive. The
pipeline keeps a new recording only if all its steps saw the generation it ends in.
"""

from __future__ import annotations

#: Entries a cache keeps; past this many layouts the oldest is dropped (a loop over ever-new
#: shapes must not grow the cache without bound).
MAX_ENTRIES = 256


def layout_key(name: str, tensors: tuple, options: tuple, heap: tuple[int, int] | None):
    """A call's key: ``name``, ``options`` and every tensor's layout, with no address in it.

    Per tensor: shape, strides, dtype, device (a host tensor of a recorded GPU call's layout must
    take the full path, whose check refuses it, not a replay that hands its address to a kernel),
    whether its base is 16-byte aligned (Triton specializes pointers on it; TMA needs it) and
    whether it starts inside ``heap`` (``(lo, hi)`` addresses,
    or None: nothing counts as on the heap). Across tensors: which earlier tensor each overlaps
    (in-place calls and aliasing decide what a call launches). ``None`` entries of ``tensors``
    (absent optional operands) stay None. Every repeated call computes it, so it is one flat loop.

    Returns:
        A key (hashable unless an option is not: :meth:`CallCache.get` answers None for such a
        key, and the call takes the full path, which says what is wrong with it), or None when an
        operand is not a tensor or has no storage (meta).

    Example::

        key = layout_key("all_reduce", (x, out), ("sum", "auto"), (heap_lo, heap_hi))
    """
    lo, hi = heap if heap is not None else (0, 0)
    parts: list[object] = [name, options]
    spans: list[tuple[int, int]] = []
    try:
        for t in tensors:
            if t is None:
                parts.append(None)
                spans.append((-1, -1))  # overlaps nothing (an empty tensor's address may be 0)
                continue
            ptr = t.data_ptr()
            end = ptr + t.nbytes
            overlap = -1
            for j, (start, stop) in enumerate(spans):
                if start < end and ptr < stop or start == ptr:
                    overlap = j
                    break
            spans.append((ptr, end))
            parts.append((t.shape, t.stride(), t.dtype, t.device, not ptr & 15, lo <= ptr < hi, overlap))
    except (AttributeError, TypeError, RuntimeError, NotImplementedError):
        return None  # not a tensor, a tensor without storage (meta): the full path
    return tuple(parts)


class CallCache:
    """Entries by layout key. A team's cache (``resources`` given) registers with the team's
    resources, which clear it at once whenever memory behind its recordings moves
    (:meth:`trident.runtime.resources.Resources.moved`); without (calls outside any team, such as
    ``trident.ops.matmul``) entries stay until evicted.

    Example::

        entry = team.call_cache.get(key)
        if entry is None:
            entry = full_call(...)
            team.call_cache.put(key, entry)
    """

    __slots__ = ("_resources", "_entries", "max_entries", "__weakref__")

    def __init__(self, resources=None, max_entries: int = MAX_ENTRIES):
        self._resources = resources
        if resources is not None:
            resources.caches.add(self)  # cleared at once when the memory moves (Resources.moved)
        self._entries: dict = {}
        self.max_entries = max_entries

    @property
    def generation(self) -> int:
        """The generation of the resources now: a recording whose steps saw another one launched on
        memory that has moved since (the pipeline keeps it only if all its steps saw this one)."""
        return 0 if self._resources is None else self._resources.generation

    def get(self, key):
        """The entry kept for ``key``, or None (also for a key that cannot be hashed)."""
        try:
            return self._entries.get(key)
        except TypeError:
            return None

    def put(self, key, entry) -> None:
        """Keep ``entry`` for ``key`` (the oldest entry goes past :attr:`max_entries`; a key that
        cannot be hashed keeps nothing)."""
        try:
            hash(key)
        except TypeError:
            return  # an option that cannot be hashed: such calls are not kept
        if key not in self._entries and len(self._entries) >= self.max_entries:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = entry

    def ops(self) -> list[str]:
        """The op name of every entry, oldest first (the first part of its key).

        Example::

            ctx.call_cache.ops()   # ['device_barrier', 'all_reduce', 'all_reduce']
        """
        return [key[0] for key in self._entries]

    def entries(self, name: str | None = None) -> list:
        """The entries of op ``name`` (every entry when None), oldest first.

        Example::

            (entry,) = ctx.call_cache.entries("all_reduce")   # the one all_reduce layout kept
        """
        return [entry for key, entry in self._entries.items() if name is None or key[0] == name]

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
