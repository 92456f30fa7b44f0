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


VICTIM = r'''
import json, os, signal, sys, time
import torch, triton, triton.language as tl
import trident

@triton.jit
def spin(flag_ptr, rank, heap_bases):
    trident.wait(flag_ptr, 1, rank, rank, heap_bases)   # nobody sets it: the kernel runs when its rank dies

ctx = trident.init(heap_size=1 << 24, timeout=60, wait_timeout=30)
flag, x = ctx.zeros(1, dtype=torch.int32), ctx.ones(256)
trident.ccl.all_reduce(ctx, x)   # the collective's workspace exists: the next call replays it
ctx.barrier()
if ctx.rank == 1:
    if not ctx.platform.simulator:   # the simulator's launches run to their end on the host
        spin[(1,)](flag, ctx.rank, ctx.heap_bases)
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(3.0)   # rank 1 died mid-kernel; the watchdog has seen it
try:
    trident.ccl.all_reduce(ctx, x)
    ctx.check()
    message = "no error"
except Exception as exc:
    message = f"{type(exc).__name__}: {exc}"
with open(os.path.join(sys.argv[1], "rank0.json"), "w") as f:
    json.dump({"message": message}, f)
'''


@pytest.mark.kills_ranks  # a rank dies mid-kernel: under MPS that ends every client's GPU work
def test_a_survivor_of_a_peer_dying_mid_kernel_is_told_who_died(tmp_path):
    """Under MPS (the GPU suite runs with it) the survivor's CUDA context fails at its next launch:
    its trident call must name rank 1 and the MPS fault domain, never a bare CUDA error; without
    MPS (the simulator) the call's wait is aborted naming rank 1."""
    import json
    import subprocess
    import sys

    from tests.conftest import script_env

    script = tmp_path / "victim.py"
    script.write_text(VICTIM)
    proc = subprocess.run([sys.executable, "-m", "trident", "run", "-n", "2", str(script), str(tmp_path)],
                          capture_output=True, text=True, timeout=180, env=script_env())
    assert proc.returncode != 0, proc.stdout[-2000:]
    message = json.loads((tmp_path / "rank0.json").read_text())["message"]
    assert "rank 1 is gone" in message, message
    if "illegal" in message or "launch failure" in message:  # CUDA's sticky error: it must come explained
        assert message.startswith("LostGpuContextError") and "MPS fault domain" in message, message
