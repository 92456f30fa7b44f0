"""The simulator patches ``triton.language`` once per launch (trident/backends/interpreter_fixups.py,
fix-up 11): Triton's interpreter re-patched it at every call of a ``@triton.jit`` helper, which cost
45% of a MoE dispatch's time. A kernel calling helpers many times still computes what it should, the
patching work does not grow with the calls, and the language is whole again after the launch.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from trident.platform import SIMULATOR

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the interpreter's patching exists only in the simulator")


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _calls_helper(x_ptr, out_ptr, CALLS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    for _ in tl.static_range(CALLS):
        x = _twice(x) - x  # one helper call per step; the value stays x
    tl.store(out_ptr + offs, _twice(x))


def _patches_made(monkeypatch, calls: int) -> int:
    """How many times the interpreter patched a language namespace during one launch with ``calls``
    helper calls, checking the kernel's result."""
    from triton.runtime import interpreter

    made = [0]
    original = interpreter._patch_builtin

    def counting(*args, **kwargs):
        made[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(interpreter, "_patch_builtin", counting)
    x = torch.arange(16, dtype=torch.float32)
    out = torch.empty_like(x)
    _calls_helper[(1,)](x, out, CALLS=calls, BLOCK=16)
    assert torch.equal(out, 2 * x), (calls, out)
    monkeypatch.setattr(interpreter, "_patch_builtin", original)
    return made[0]


def test_helper_calls_do_not_patch_the_language_again(monkeypatch):
    one, many = _patches_made(monkeypatch, 1), _patches_made(monkeypatch, 12)
    assert one > 0, "the launch itself patches the language"
    assert many == one, f"12 helper calls patched {many} times, 1 call {one}: patching grows with the calls"


def test_the_language_is_whole_after_a_launch(monkeypatch):
    _patches_made(monkeypatch, 3)
    for name in ("load", "store", "arange", "where", "atomic_add"):
        assert tl.core.is_builtin(getattr(tl, name)), f"tl.{name} is still patched after the launch"
