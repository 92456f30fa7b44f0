"""Small fixes to Triton's CPU interpreter, applied only when the simulator runs.

Triton 3.6's interpreter cannot run ``for p in range(world)`` (nor ``tl.range``) when ``world``
is a kernel argument: it turns scalar arguments into one-element numpy arrays, and its
``tensor.__index__`` calls ``int()`` on them, which numpy 2 refuses for arrays with a dimension.
Kernels that loop over peers are the bread and butter of multi-GPU code, so the simulator
makes ``__index__`` take the array's single item. Newer Triton releases do not need this; the
fix is applied only where the bug is present.
"""

from __future__ import annotations

import numpy as np

_applied = False


def _needs_index_fix() -> bool:
    from triton.runtime import interpreter

    fake = type("T", (), {})()
    fake.handle = type("H", (), {"data": np.array([3], dtype=np.int32)})()
    scope = interpreter._LangPatchScope()
    probe = type("Probe", (), {})
    interpreter._patch_lang_tensor(probe, scope)
    try:
        probe.__index__(fake)
        return False
    except TypeError:
        return True
    finally:
        scope.restore()


def apply() -> None:
    """Install the fixes this Triton needs (idempotent)."""
    global _applied
    if _applied:
        return
    _applied = True
    from triton.runtime import interpreter

    try:
        needed = _needs_index_fix()
    except AttributeError:  # a Triton whose interpreter is laid out differently: leave it alone
        return
    if not needed:
        return
    original = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).item()))

    interpreter._patch_lang_tensor = patch_lang_tensor
