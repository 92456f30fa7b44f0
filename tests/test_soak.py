"""A short, bounded fault-injection soak: faults mixed into a running job of collectives and fused ops.

Each round starts ``trident run -n 3`` on a workload that loops over collectives and a fused op with a
user tensor ``y`` that nothing may change, and injects one fault: a rank killed mid-collective, the heap
exhausted mid-op, the launcher's stdout closed (``| head``), or SIGTERM to the launcher. Every round must
end within its bound, leave no rank process and no heap file in /dev/shm behind, and every rank that
could check ``y`` must find it unchanged.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import script_env

pytestmark = pytest.mark.kills_ranks  # ranks die mid-job: see the marker in pyproject.toml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKLOAD = r'''
import os, signal, sys, time
import torch
import trident

mode, out = sys.argv[1], sys.argv[2]
ctx = trident.init(heap_size=1 << 22, timeout=30, wait_timeout=10)
with open(os.path.join(out, f"rank{ctx.rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
y = ctx.full((256,), 7.0)                      # the user's tensor: nothing may change it
x = ctx.zeros(1024)
B = torch.ones(16, 32, device=ctx.device)
ctx.barrier()
status = "done"
try:
    # 40 steps for sigterm (the launcher is signalled after the third line: the job must still be running),
    # 20 for the others (faults at steps 2 and 4, the fused op at steps 0, 8 and 16, then a clean end)
    for step in range(40 if mode == "sigterm" else 20):
        x.fill_(float(ctx.rank + step))
        if mode == "kill" and ctx.rank == ctx.world_size - 1 and step == 4:
            os.kill(os.getpid(), signal.SIGKILL)      # dies with its peers inside the next collective
        trident.ccl.all_reduce(ctx, x)
        ctx.check()  # a GPU records a wait that gave up (a lost peer) for the host; the simulator raised already
        if mode == "exhaust" and step == 2:
            try:                                  # the staging buffer cannot grow this far
                big = torch.ones(1 << 21, device=ctx.device)
                trident.ccl.all_gather(ctx, torch.empty(ctx.world_size << 21, device=ctx.device), big)
                status = "exhaustion not reported"
            except trident.HeapExhaustedError:
                pass
        if step % 8 == 0:
            out_c = torch.empty(ctx.world_size * 8, 32, device=ctx.device)
            trident.ops.all_gather_gemm(ctx, torch.ones(8, 16, device=ctx.device), B, out_c,
                                        pattern="fused_sequential")
        print(f"rank {ctx.rank} step {step}", flush=True)
        if mode == "sigterm":
            time.sleep(0.05)
except trident.TridentError as exc:
    status = f"{type(exc).__name__}"
except Exception as exc:  # anything else is a finding: say what it was
    status = f"{type(exc).__name__}: {str(exc)[:300]}"
finally:
    try:
        intact = bool(torch.all(y == 7.0))
    except Exception as exc:  # e.g. the CUDA context is gone
        intact = f"unknown ({type(exc).__name__})"
    with open(os.path.join(out, f"rank{ctx.rank}.status"), "w") as f:
        f.write(f"{status} y_intact={intact}")
if status == "done":
    ctx.close()
'''


def _shm_files_of(pids):
    return [n for n in os.listdir("/dev/shm") if n.startswith("trident-") and any(f"-p{p}-" in n for p in pids)]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _round(tmp_path, mode):
    """Run one round; return (launcher return code, {rank: status}, pids, seconds)."""
    folder = tmp_path / mode
    folder.mkdir()
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    command = [sys.executable, "-m", "trident", "run", "-n", "3", "--grace", "3", str(script), mode, str(folder)]
    env = script_env()  # the ranks run the workload from tmp_path
    start = time.monotonic()
    errors = open(folder / "launcher.err", "wb")  # what the launcher and ranks said: shown when a round fails
    if mode == "pipe":  # `trident run ... | head -1`: our reader goes away after one line
        launcher = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=errors)
        launcher.stdout.readline()
        launcher.stdout.close()
        code = launcher.wait(timeout=120)
    elif mode == "sigterm":
        launcher = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=errors)
        for _ in range(3):
            launcher.stdout.readline()  # the job is running its collectives
        launcher.send_signal(signal.SIGTERM)
        launcher.stdout.read()
        code = launcher.wait(timeout=60)
    else:
        code = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=errors,
                              timeout=120).returncode
    errors.close()
    seconds = time.monotonic() - start
    time.sleep(0.5)  # the kernel reaps the ranks
    pids = [int(p.read_text()) for p in sorted(folder.glob("rank*.pid"))]
    statuses = {int(p.stem[4:]): p.read_text() for p in sorted(folder.glob("rank*.status"))}
    return code, statuses, pids, seconds, (folder / "launcher.err").read_text(errors="replace")[-3000:]


@pytest.mark.parametrize("mode", ["kill", "exhaust", "pipe", "sigterm"])
def test_faults_mixed_into_a_running_job(tmp_path, mode):
    code, statuses, pids, seconds, said = _round(tmp_path, mode)
    assert len(pids) == 3, f"{mode}: only ranks {pids} started (launcher exit {code}); it said:\n{said}"
    assert seconds < 90, f"{mode}: the round took {seconds:.0f} s"
    assert not [p for p in pids if _alive(p)], f"{mode}: rank processes left running"
    assert _shm_files_of(pids) == [], f"{mode}: heap files left in /dev/shm"
    for rank, status in statuses.items():
        assert status.endswith("y_intact=True"), (mode, rank, status)
    if mode == "kill":
        assert code == 128 + signal.SIGKILL, code  # the first failure: rank 2, killed
        survivors_timed_out = all(s.startswith("RankTimeoutError") for s in statuses.values())
        assert sorted(statuses) == [0, 1] and survivors_timed_out, (statuses, said)
    elif mode == "exhaust":
        assert code == 0 and all(s.startswith("done") for s in statuses.values()), (code, statuses)
    elif mode == "pipe":
        assert code == 0 and len(statuses) == 3, (code, statuses)
    else:
        assert code == 128 + signal.SIGTERM, code
