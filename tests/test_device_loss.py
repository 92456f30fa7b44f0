"""A peer that dies mid-kernel under MPS: the survivor's sticky CUDA error names the lost rank.

The fault itself needs ranks on a GPU under MPS (the GPU suite's ``trident run --mps`` tests); here
the translation is pinned on both backends: a sticky CUDA error raised inside a trident call or
``ctx.check()`` after the watchdog saw a peer's process end becomes a LostGpuContextError.
"""

import types

import pytest

from tests.conftest import get_pool
from trident.errors import LostGpuContextError
from trident.runtime.device_loss import explain_lost_context

STICKY = "Triton Error [CUDA]: an illegal memory access was encountered"


def _team(lost):
    return types.SimpleNamespace(lost_ranks=lost, watchdog_interval=0.01, who=lambda: "rank 0")


def test_a_sticky_error_after_a_peer_died_names_the_peer_and_the_fault_domain():
    error = explain_lost_context(_team({1: "process 4242 exited (killed by SIGKILL)"}), RuntimeError(STICKY))
    assert isinstance(error, LostGpuContextError)
    text = str(error)
    assert "rank 1 is gone: process 4242 exited (killed by SIGKILL)" in text
    assert "an illegal memory access was encountered" in text and "MPS fault domain" in text


def test_other_errors_and_errors_with_every_peer_alive_are_left_alone():
    assert explain_lost_context(_team({1: "gone"}), RuntimeError("CUDA out of memory")) is None
    assert explain_lost_context(_team({}), RuntimeError(STICKY)) is None  # after a short settle


def _inside_calls_body(ctx):
    import trident
    from trident.ccl import collectives
    from trident.runtime.context import Context

    def sticky(*args, **kwargs):
        raise RuntimeError(STICKY)

    # What the watchdog reports once a peer's process has ended (it watches real processes only).
    lost = property(lambda self: {7: "process 99 exited (killed by SIGKILL)"})
    patches = [(Context, "lost_ranks", lost), (collectives, "_launch", sticky)]
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
    seen = []
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        with pytest.raises(LostGpuContextError) as info:
            trident.ccl.all_reduce(ctx, ctx.ones(300))  # a layout not seen yet: the full path launches
        seen.append(str(info.value))
        backend = ctx.__dict__["_backend"]
        backend.synchronize = sticky
        try:
            with pytest.raises(LostGpuContextError) as info:
                ctx.check()
            seen.append(str(info.value))
        finally:
            del backend.synchronize  # the class's method again
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
    return seen


def test_trident_calls_and_check_raise_the_named_error():
    (messages,) = get_pool(1).run(_inside_calls_body)
    assert len(messages) == 2 and all("rank 7 is gone" in m and "MPS" in m for m in messages), messages
