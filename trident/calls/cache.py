"""The one small-call cache: what a call of an op decided and launched, kept per *layout*.

A decode loop calls the same collective or fused op every step, often on tensors that are new
each step (a compiled model's fresh activations, a custom op's fresh output). Everything the
first call checked and decided is a function of the call's *layout*: its tensors' shapes,
strides and dtypes, where each lies (on the heap or not, 16-byte aligned or not, which of them
share memory), and its options. So the cache is keyed on that, never on addresses, and a
recorded call is replayed with this call's addresses bound in (:mod:`trident.calls.recording`).

Finding the entry is most of a repeated call's own host time, so :meth:`CallCache.lookup` first
tries the layouts last used with the call's op and options through torch's C check of sizes,
strides, dtype and device (the one compiled graphs run on every call), then the placement of the
call's addresses (remembered per address tuple); only a call that matches none of them computes
its :func:`layout_key` in Python.

Each team (a context, a group) has one :class:`CallCache` (``team.call_cache``), registered with
the team's resources (:class:`trident.runtime.resources.Resources`): a workspace buffer that grew,
a ``heap_scope`` that ended or a ``close()`` starts a new *generation* of them and clears every
registered cache at once, so nothing recorded on the old buffers is replayed or kept alive. The
pipeline keeps a new recording only if all its steps saw the generation it ends in.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import torch_private

#: Entries a cache keeps; past this many layouts the oldest is dropped (a loop over ever-new
#: shapes must not grow the cache without bound).
MAX_ENTRIES = 256


def layout_key(name: str, tensors: tuple, options: tuple, heap: tuple[int, int] | None):
    """A call's key: ``name``, ``options`` and every tensor's layout, with no address in it.

    Per tensor: shape, strides, dtype, device (a host tensor of a recorded GPU call's layout must
    take the full path, whose check refuses it, not a replay that hands its address to a kernel),
    then its :func:`placement`: whether its base is 16-byte aligned (Triton specializes pointers
    on it; TMA needs it), whether it starts inside ``heap`` (``(lo, hi)`` addresses, or None:
    nothing counts as on the heap) and which earlier tensor it overlaps (in-place calls and
    aliasing decide what a call launches). ``None`` entries of ``tensors`` (absent optional
    operands) stay None.

    Returns:
        A key (hashable unless an option is not: :meth:`CallCache.get` answers None for such a
        key, and the call takes the full path, which says what is wrong with it), or None when an
        operand is not a tensor or has no storage (meta).

    Example::

        key = layout_key("all_reduce", (x, out), ("sum", "auto"), (heap_lo, heap_hi))
    """
    try:
        shapes = tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in tensors)
        ptrs = addresses(tensors)
        sizes = [0 if t is None else t.nbytes for t in tensors]
    except (AttributeError, TypeError, RuntimeError, NotImplementedError):
        return None  # not a tensor, a tensor without storage (meta): the full path
    return name, options, shapes, placement(ptrs, sizes, heap)


def placement(ptrs: Sequence[int | None], sizes: Sequence[int], heap: tuple[int, int] | None) -> tuple:
    """Where a call's tensors lie, as its key sees it: per tensor (None for an absent one) whether
    its address is 16-byte aligned, whether it lies on ``heap``, and the first earlier tensor it
    overlaps (-1: none). ``ptrs`` and ``sizes``: addresses (None: absent) and byte sizes.

    Example::

        placement([x.data_ptr(), x.data_ptr()], [x.nbytes] * 2, None)   # ((True, False, -1), (True, False, 0))
    """
    lo, hi = heap if heap is not None else (0, 0)
    facts: list[tuple[bool, bool, int] | None] = []
    for i, ptr in enumerate(ptrs):
        if ptr is None:
            facts.append(None)
            continue
        end, overlap = ptr + sizes[i], -1
        for j in range(i):
            start = ptrs[j]
            # an empty tensor's address may be 0: equal addresses count as overlapping
            if start is not None and (start < end and ptr < start + sizes[j] or start == ptr):
                overlap = j
                break
        facts.append((not ptr & 15, lo <= ptr < hi, overlap))
    return tuple(facts)


#: Layouts per op name and options whose C check :meth:`CallCache.lookup` tries before computing a key.
RECENT = 4
#: Times a kept layout's check is made again from a call it refused although the key matched (torch
#: sees that call's tensors otherwise: inference mode, requires_grad); past this the key finds it.
RENEWALS = 4
#: Address tuples whose placement a kept layout remembers (then it starts over).
_SEEN = 64


class _Guarded:
    """A kept entry with its layout's C check (:func:`trident.torch_private.layout_guard`) and
    what a call must add to pass it: its addresses' :func:`placement` (remembered per address
    tuple: a loop's fresh tensors come back at a few addresses)."""

    __slots__ = ("guard", "plain", "absent", "repeats", "distinct", "sizes", "heap", "placement", "entry", "seen",
                 "renewals")

    def __init__(self, guard, tensors: tuple, heap, placement: tuple, entry, renewals: int = 0):
        self.guard, self.heap, self.placement, self.entry = guard, heap, placement, entry
        self.renewals = renewals  # times the check was made again from a later call's tensors
        first: dict[int, int] = {}  # id -> the first position of each distinct tensor (the guard sees each once)
        absent, repeats, distinct = [], [], []
        for i, t in enumerate(tensors):
            if t is None:
                absent.append(i)
                continue
            j = first.setdefault(id(t), i)
            if j == i:
                distinct.append(i)
            else:
                repeats.append((i, j))
        self.absent, self.repeats, self.distinct = tuple(absent), tuple(repeats), tuple(distinct)
        self.plain = not self.absent and not self.repeats  # the guard takes the operands as they come
        self.sizes = [0 if t is None else t.nbytes for t in tensors]
        self.seen: dict[tuple, bool] = {}

    def matching_addresses(self, tensors: tuple, heap):
        """``tensors``' addresses (None for an absent one) when they have the kept layout and
        placement, else None. An operand that was the same tensor as an earlier one (in place)
        must be that tensor again; one that was absent must be absent again."""
        try:
            if self.plain:
                if not self.guard(*tensors):
                    return None
                ptrs: tuple = tuple(map(_data_ptr, tensors))
            else:
                if len(tensors) != len(self.sizes):
                    return None
                for i in self.absent:
                    if tensors[i] is not None:
                        return None
                for i, j in self.repeats:
                    if tensors[i] is not tensors[j]:
                        return None
                if not self.guard(*[tensors[i] for i in self.distinct]):
                    return None
                ptrs = addresses(tensors)
        except TypeError:  # another number of operands, an operand that is not a tensor
            return None
        if heap != self.heap:
            return None
        same = self.seen.get(ptrs)
        if same is None:
            same = placement(ptrs, self.sizes, heap) == self.placement
            if len(self.seen) >= _SEEN:
                self.seen.clear()
            self.seen[ptrs] = same
        return ptrs if same else None


def _distinct(tensors: tuple) -> list:
    """The tensors of ``tensors`` (not None), each once: torch's guard refuses a tensor seen twice."""
    out: list = []
    for t in tensors:
        if t is not None and not any(t is u for u in out):
            out.append(t)
    return out


_data_ptr = torch.Tensor.data_ptr


def _address(t) -> int | None:
    return None if t is None else t.data_ptr()


def addresses(tensors: tuple) -> tuple:
    """Each tensor's ``data_ptr()`` (None for an absent one): what a replay binds.

    Example::

        addresses((x, None))   # (x.data_ptr(), None)
    """
    return tuple(map(_address, tensors))


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

    __slots__ = ("_resources", "_entries", "_guarded", "_recent", "max_entries", "__weakref__")

    def __init__(self, resources=None, max_entries: int = MAX_ENTRIES):
        self._resources = resources
        if resources is not None:
            resources.caches.add(self)  # cleared at once when the memory moves (Resources.moved)
        self._entries: dict = {}
        self._guarded: dict = {}  # key -> _Guarded: the entry with its layout's C check
        self._recent: dict = {}  # (name, options) -> the _Guarded that lookup tries first, latest used first
        self.max_entries = max_entries

    @property
    def generation(self) -> int:
        """The generation of the resources now: a recording whose steps saw another one launched on
        memory that has moved since (the pipeline keeps it only if all its steps saw this one)."""
        return 0 if self._resources is None else self._resources.generation

    def lookup(self, name: str, options: tuple, tensors: tuple, heap: tuple[int, int] | None):
        """The entry kept for this call's layout: ``(entry, addresses)`` (the tensors' ``data_ptr()``,
        None for an absent one) when there is one, else ``(None, key)`` (the :func:`layout_key` to
        :meth:`put` the call's entry under; None: the call cannot be kept).

        The layouts last used with ``name`` and ``options`` (up to :data:`RECENT`) are checked
        first, in C (sizes, strides, dtype, device: a few hundred nanoseconds, a repeated call's
        usual case), then their :func:`placement` from the addresses; any other call computes
        its key in Python.

        Example::

            entry, found = cache.lookup("all_reduce", ("sum", "auto"), (x, out), team.heap_range)
            if entry is not None:
                entry.replay((x, out), ptrs=found)
        """
        try:
            recent = self._recent.get((name, options), ())
        except TypeError:
            recent = ()  # an option that cannot be hashed: layout_key's key says so below
        for place, kept in enumerate(recent):
            ptrs = kept.matching_addresses(tensors, heap)
            if ptrs is not None:
                if place:  # the layout used last is checked first next time
                    self._recent[name, options] = [kept, *(k for k in recent if k is not kept)]
                return kept.entry, ptrs
        key = layout_key(name, tensors, options, heap)
        entry = self.get(key)
        if entry is None:
            return None, key
        kept = self._guarded.get(key)
        if kept is not None and kept in recent and kept.renewals < RENEWALS:
            # Its check refused this call's tensors, which have its layout: torch sees them otherwise
            # (made under inference_mode, requiring grad). Checked against these from now on.
            kept = self._guard(key, entry, tensors, heap, kept.renewals + 1) or kept
        if kept is not None:  # used again: among the first checked
            self._recent[key[:2]] = [kept, *(k for k in recent if k is not kept and k.entry is not entry)][:RECENT]
        return entry, addresses(tensors)

    def get(self, key):
        """The entry kept for ``key``, or None (also for a key that cannot be hashed)."""
        try:
            return self._entries.get(key)
        except TypeError:
            return None

    def put(self, key, entry, tensors: tuple | None = None, heap: tuple[int, int] | None = None) -> None:
        """Keep ``entry`` for ``key`` (the oldest entry goes past :attr:`max_entries`; a key that
        cannot be hashed keeps nothing). With the call's ``tensors`` (and the ``heap`` its key
        was made with), :meth:`lookup` checks the entry's layout in C, first among its name's and
        options'."""
        try:
            hash(key)
        except TypeError:
            return  # an option that cannot be hashed: such calls are not kept
        if key not in self._entries and len(self._entries) >= self.max_entries:
            self._drop(next(iter(self._entries)))
        self._entries[key] = entry
        kept = None if tensors is None else self._guard(key, entry, tensors, heap, 0)
        if kept is not None:
            self._recent[key[:2]] = [kept, *self._recent.get(key[:2], ())][:RECENT]

    def _guard(self, key, entry, tensors: tuple, heap, renewals: int):
        """``entry``'s layout check made from ``tensors`` (kept for ``key``), or None without torch's."""
        guard = torch_private.layout_guard(_distinct(tensors))
        if guard is None:
            return None
        kept = self._guarded[key] = _Guarded(guard, tensors, heap, key[3], entry, renewals)
        return kept

    def _drop(self, key) -> None:
        del self._entries[key]
        kept = self._guarded.pop(key, None)
        if kept is not None and kept in self._recent.get(key[:2], ()):
            self._recent[key[:2]] = [k for k in self._recent[key[:2]] if k is not kept]

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
        self._guarded.clear()
        self._recent.clear()

    def __len__(self) -> int:
        return len(self._entries)
