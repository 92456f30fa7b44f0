"""CallCache.lookup: the C check of a kept layout finds exactly the entries layout_key finds."""

import pytest
import torch

from trident import torch_private
from trident.calls import CallCache, layout_key

HEAP = None  # no tensor here lies on a heap


def _kept(cache: CallCache, name: str, tensors: tuple, options=("sum",)):
    """Put a fresh entry for ``tensors``' layout (as the pipeline does after a full call); return it."""
    entry, key = cache.lookup(name, options, tensors, HEAP)
    assert entry is None, "a layout seen for the first time has no entry"
    entry = object()
    cache.put(key, entry, tensors, HEAP)
    return entry


def _found(cache: CallCache, tensors: tuple, name="all_reduce", options=("sum",)):
    entry, found = cache.lookup(name, options, tensors, HEAP)
    return entry, found


def test_a_new_tensor_of_a_kept_layout_finds_its_entry_with_its_addresses():
    cache = CallCache()
    kept = _kept(cache, "all_reduce", (torch.ones(64), torch.empty(64)))
    x, out = torch.ones(64), torch.empty(64)
    entry, ptrs = _found(cache, (x, out))
    assert entry is kept and tuple(ptrs) == (x.data_ptr(), out.data_ptr())


@pytest.mark.parametrize("other", [
    torch.empty(65), torch.empty(64, dtype=torch.float16), torch.empty(128)[::2], torch.empty(64, 1)],
    ids=["shape", "dtype", "strides", "rank"])
def test_another_layout_misses(other):
    cache = CallCache()
    _kept(cache, "all_reduce", (torch.ones(64), torch.empty(64)))
    entry, key = _found(cache, (torch.ones(64), other))
    assert entry is None and key == layout_key("all_reduce", (torch.ones(64), other), ("sum",), HEAP)


def test_what_torchs_check_sees_beyond_the_key_still_finds_the_entry_by_its_key():
    """requires_grad is no part of a layout key: the C check refuses such a tensor, the key finds it."""
    cache = CallCache()
    kept = _kept(cache, "all_reduce", (torch.ones(64), torch.empty(64)))
    assert _found(cache, (torch.ones(64, requires_grad=True), torch.empty(64)))[0] is kept


def test_another_name_or_options_misses():
    cache = CallCache()
    _kept(cache, "all_reduce", (torch.ones(64), torch.empty(64)))
    assert _found(cache, (torch.ones(64), torch.empty(64)), options=("max",))[0] is None
    assert _found(cache, (torch.ones(64), torch.empty(64)), name="broadcast")[0] is None


def test_in_place_and_out_of_place_calls_keep_their_own_entries():
    """(x, x) and (x, out) have one layout per tensor but another aliasing: never the other's entry."""
    cache = CallCache()
    x = torch.ones(64)
    in_place = _kept(cache, "all_reduce", (x, x))
    out_of_place = _kept(cache, "all_reduce", (x, torch.empty(64)))
    y = torch.ones(64)
    assert _found(cache, (y, y))[0] is in_place
    assert _found(cache, (y, torch.empty(64)))[0] is out_of_place
    assert _found(cache, (y, y))[0] is in_place


def test_a_view_of_another_layout_at_the_same_address_misses():
    """An in-place entry's second operand must be the first tensor itself: a view of other strides
    at the same address is another call."""
    cache = CallCache()
    x = torch.ones(8, 8)
    _kept(cache, "all_reduce", (x, x))
    y = torch.ones(8, 8)
    entry, _ = _found(cache, (y, y.t()))
    assert entry is None


def test_a_shared_address_the_entry_did_not_have_misses():
    cache = CallCache()
    _kept(cache, "all_reduce", (torch.ones(64), torch.empty(64)))
    buffer = torch.ones(64)
    assert _found(cache, (buffer, buffer[:64]))[0] is None  # same layouts, now overlapping


def test_alignment_is_part_of_the_layout():
    cache = CallCache()
    base = torch.ones(80)
    kept = _kept(cache, "all_reduce", (base[:64], torch.empty(64)))
    assert _found(cache, (base[1:65], torch.empty(64)))[0] is None  # 4 bytes off: not 16-byte aligned
    assert _found(cache, (base[4:68], torch.empty(64)))[0] is kept  # 16 bytes off: aligned


def test_absent_operands_must_stay_absent():
    cache = CallCache()
    without = _kept(cache, "rmsnorm", (torch.ones(4, 8), None, torch.empty(4, 8)), ())
    with_residual = _kept(cache, "rmsnorm", (torch.ones(4, 8), torch.ones(4, 8), torch.empty(4, 8)), ())
    assert _found(cache, (torch.ones(4, 8), None, torch.empty(4, 8)), "rmsnorm", ())[0] is without
    assert _found(cache, (torch.ones(4, 8), torch.ones(4, 8), torch.empty(4, 8)), "rmsnorm", ())[0] is with_residual


def test_many_layouts_of_one_op_are_all_found():
    """More layouts than the C checks kept per op: the rest are found by their keys."""
    cache = CallCache()
    kept = {n: _kept(cache, "all_reduce", (torch.ones(n), torch.empty(n))) for n in range(1, 12)}
    for _ in range(2):
        for n, entry in kept.items():
            assert _found(cache, (torch.ones(n), torch.empty(n)))[0] is entry


def test_clear_and_eviction_forget_the_checked_layouts_too():
    cache = CallCache(max_entries=2)
    _kept(cache, "all_reduce", (torch.ones(1), torch.empty(1)))
    _kept(cache, "all_reduce", (torch.ones(2), torch.empty(2)))
    _kept(cache, "all_reduce", (torch.ones(3), torch.empty(3)))  # drops the first
    assert _found(cache, (torch.ones(1), torch.empty(1)))[0] is None
    assert _found(cache, (torch.ones(3), torch.empty(3)))[0] is not None
    cache.clear()
    assert _found(cache, (torch.ones(3), torch.empty(3)))[0] is None


def test_without_torchs_guard_every_call_is_found_by_its_key(monkeypatch):
    monkeypatch.setattr(torch_private, "layout_guard", lambda tensors: None)
    cache = CallCache()
    kept = _kept(cache, "all_reduce", (torch.ones(64), torch.empty(64)))
    assert _found(cache, (torch.ones(64), torch.empty(64)))[0] is kept


def test_a_non_tensor_operand_is_never_kept():
    cache = CallCache()
    _kept(cache, "all_reduce", (torch.ones(64), torch.empty(64)))
    assert _found(cache, (torch.ones(64), 3)) == (None, None)


def _keys_computed(monkeypatch) -> list:
    """Record each layout_key the cache computes (a call its C checks did not find)."""
    from trident.calls import cache as cache_module

    computed: list = []
    real = cache_module.layout_key
    monkeypatch.setattr(cache_module, "layout_key", lambda *args: computed.append(args[0]) or real(*args))
    return computed


def test_inference_mode_tensors_are_checked_in_c_from_their_second_call(monkeypatch):
    """A layout kept outside inference mode, called inside it (a serving loop after a warm-up): torch's
    check sees such tensors otherwise, so the first call is found by its key and the check is made
    again from its tensors; the next calls are found in C."""
    cache = CallCache()
    kept = _kept(cache, "all_reduce", (torch.ones(64), torch.empty(64)))
    computed = _keys_computed(monkeypatch)
    with torch.inference_mode():
        for _ in range(3):
            assert _found(cache, (torch.ones(64), torch.empty(64)))[0] is kept
    assert computed == ["all_reduce"]


def test_a_layout_used_in_both_modes_is_always_found_and_renewed_a_bounded_number_of_times(monkeypatch):
    from trident.calls.cache import RENEWALS

    cache = CallCache()
    kept = _kept(cache, "all_reduce", (torch.ones(64), torch.empty(64)))
    computed = _keys_computed(monkeypatch)
    for turn in range(3 * RENEWALS):
        with torch.inference_mode(turn % 2 == 0):
            assert _found(cache, (torch.ones(64), torch.empty(64)))[0] is kept
    # Each of the first RENEWALS calls renews the check for its mode; afterwards the check stays with
    # the last renewed mode (found in C) and calls in the other mode are found by their key.
    assert len(computed) == RENEWALS + RENEWALS
