"""TMA descriptor arguments of prepared launches (trident.kernels.descriptors), against Triton's own
descriptor wrapper: the splice passes the C entry what Triton would, and encodes a (layout, address)
once. Runs without a GPU: Triton's wrapper is made around a recording C entry, and descriptors
without compiled metadata are encoded as plain arguments (no CUtensorMap needs a driver)."""

import pytest
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from trident.kernels.descriptors import Address, Rebased, rebased, splicer
from trident.kernels.prepared import by_address

driver = pytest.importorskip("triton.backends.nvidia.driver")

# a pointer, a descriptor, an int, a descriptor, a constexpr
SIGNATURE = {0: "*fp16", 1: "tensordesc<fp16[16, 32]>", 2: "i32", 3: "tensordesc<fp16[32, 16]>", 4: "constexpr"}
PREFIX = tuple(range(13))  # what precedes the kernel's arguments at the C entry: grid, stream, function, ...


def _plain(values) -> list:
    """Encoded arguments with addresses in place of Address objects (which compare by identity)."""
    return [(v.ptr, v.dtype) if isinstance(v, Address) else v for v in values]


def _wrapped():
    calls: list = []
    wrapper = driver.wrap_handle_tensordesc(lambda *args: calls.append(args), SIGNATURE, None)
    if splicer(wrapper) is None:  # this Triton's wrapper looks otherwise: launches keep Triton's path
        import triton

        assert not triton.__version__.startswith("3.6."), "Triton 3.6 (the GPU machine's) must be spliced"
        pytest.skip(f"Triton {triton.__version__}'s descriptor wrapper is not recognised")
    return wrapper, calls


def _descriptors():
    a, b = torch.zeros(64, 32, dtype=torch.float16), torch.zeros(32, 48, dtype=torch.float16)
    return (by_address(TensorDescriptor.from_tensor(a, [16, 32])),
            by_address(TensorDescriptor.from_tensor(b, [32, 16])))


def test_the_splice_passes_the_c_entry_what_tritons_wrapper_passes():
    wrapper, calls = _wrapped()
    c_entry, splice = splicer(wrapper)
    da, db = _descriptors()
    for args in ((1000, da, 7, db, 1), (2000, rebased(da, 4096), 9, rebased(db, 8192), 1)):
        wrapper(*PREFIX, *args)                      # Triton's path
        c_entry(*PREFIX, *splice(args))              # the prepared launch's path
        assert _plain(calls[-2]) == _plain(calls[-1])
    # The layout at the new address, nothing else changed.
    assert (4096, torch.float16) in _plain(calls[-1]) and (8192, torch.float16) in _plain(calls[-1])


def test_a_layout_at_an_address_is_encoded_once():
    _, splice = splicer(_wrapped()[0])
    da, db = _descriptors()
    first = splice((0, rebased(da, 4096), 1, rebased(db, 8192), 1))
    again = splice((0, rebased(da, 4096), 2, rebased(db, 8192), 1))
    assert first[1] is again[1] and again[11] == 2
    moved = splice((0, rebased(da, 4096 + 512), 2, rebased(db, 8192), 1))
    assert moved[1] is not first[1] and moved[1].ptr == 4096 + 512
    # Another layout at the same address is encoded anew (the kept one belongs to the other layout).
    other = by_address(TensorDescriptor.from_tensor(torch.zeros(64, 32, dtype=torch.float16), [32, 32]))
    shifted = splice((0, rebased(other, 4096), 2, rebased(db, 8192), 1))
    assert shifted[1] is not first[1]
    assert _plain(shifted[1:1 + 5]) == [(4096, torch.float16), 64, 32, 32, 1]


def test_a_rebased_descriptor_reads_as_its_layout_at_its_address():
    da, _ = _descriptors()
    moved = rebased(rebased(da, 4096), 512)  # rebasing a rebased one keeps the original layout
    assert isinstance(moved, Rebased) and moved.template is da.template
    assert (moved.base.data_ptr(), moved.base.dtype) == (512, torch.float16)
    assert (list(moved.shape), list(moved.strides), list(moved.block_shape)) == ([64, 32], [32, 1], [16, 32])


def test_other_launchers_are_not_spliced():
    assert splicer(print) is None and splicer(lambda *args: None) is None
    x = 1
    assert splicer(lambda *args: x) is None  # a closure over other names
