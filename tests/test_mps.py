"""``trident run --mps``: a private MPS daemon, each rank's SM share, and the daemon always stopped.

A stand-in ``nvidia-cuda-mps-control`` on PATH records how it was called, so the daemon's life cycle
is checked on any machine; the real one runs in the GPU suites.
"""

import json
import os
import stat
import subprocess
import sys

import pytest

from trident.runtime import launcher, mps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAKE_CONTROL = r'''#!/usr/bin/env python3
import json, os, sys
record = {"argv": sys.argv[1:], "stdin": "" if sys.argv[1:] == ["-d"] else sys.stdin.read(),
          "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"), "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY"),
          "share": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}
with open(os.environ["FAKE_MPS_RECORD"], "a") as f:
    f.write(json.dumps(record) + "\n")
sys.exit(int(os.environ.get("FAKE_MPS_EXIT", "0")))
'''

RANK = r'''
import json, os, sys
with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"]), "w") as f:
    json.dump({k: os.environ.get(k) for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}, f)
sys.exit(int(sys.argv[2]))
'''


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    control = folder / mps.CONTROL
    control.write_text(FAKE_CONTROL)
    control.chmod(control.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_RECORD", str(tmp_path / "calls.jsonl"))
    return tmp_path / "calls.jsonl"


def _calls(record):
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


@pytest.mark.parametrize("exit_code", [0, 3])
def test_run_with_mps_starts_a_private_daemon_splits_the_sms_and_always_stops_it(tmp_path, fake_control, exit_code):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    proc = subprocess.run([sys.executable, "-m", "trident", "run", "-n", "4", "--mps", "--grace", "1", str(script),
                           str(tmp_path), str(exit_code)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == exit_code, proc.stderr
    start, stop = _calls(fake_control)
    share = str(100 // launcher.ranks_per_gpu(4))
    assert start["argv"] == ["-d"] and start["share"] is None  # the daemon runs unrestricted
    assert stop["argv"] == [] and stop["stdin"].strip() == "quit" and stop["pipe"] == start["pipe"]
    for rank in range(4):
        seen = json.loads((tmp_path / f"rank{rank}").read_text())
        assert seen == {"CUDA_MPS_PIPE_DIRECTORY": start["pipe"], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": share}
    assert not os.path.exists(os.path.dirname(start["pipe"])), "the daemon's folders are removed"
    assert "each rank may use" in proc.stderr


def test_mps_refuses_clearly_when_the_daemon_cannot_start(tmp_path, fake_control, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_EXIT", "1")
    with pytest.raises(Exception, match="nvidia-cuda-mps-control -d failed"):
        mps.MpsDaemon(2).start()
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(Exception, match="not on PATH"):
        mps.MpsDaemon(2, control=None).start()


def test_run_with_mps_but_no_mps_says_so_in_one_line(tmp_path):
    """It used to print an 18-line traceback."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**os.environ, "PATH": str(tmp_path / "nowhere")}  # no nvidia-cuda-mps-control
    proc = subprocess.run([sys.executable, "-m", "trident", "run", "-n", "2", "--mps", str(script), str(tmp_path), "0"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"trident run: --mps needs {mps.CONTROL} (NVIDIA's MPS, part of the driver's "
                                        f"utilities); it is not on PATH (run without --mps, or put it on PATH)"]
    assert not (tmp_path / "rank0").exists()  # no rank started


def test_sm_share():
    assert [mps.sm_share(n) for n in (1, 2, 3, 4, 8)] == [100, 50, 33, 25, 12]
    with pytest.raises(ValueError):
        mps.sm_share(0)


def test_the_launcher_names_the_rank_that_faulted_under_mps_or_says_it_is_unknown():
    """Under MPS one client's GPU fault ends every client: the first rank to exit is not the culprit."""
    import signal

    from trident.runtime.launcher import describe_failures

    # Without MPS, or alone: the first failure, as before.
    assert describe_failures([(0, 3), (1, -signal.SIGKILL)], mps=False) == (0, "rank 0 exited with code 3")
    assert describe_failures([(1, 3)], mps=True) == (1, "rank 1 exited with code 3")
    # A rank killed mid-kernel: it is the origin, and the others' failures are named as its fallout.
    rank, line = describe_failures([(0, 1), (1, -signal.SIGKILL), (2, 1)], mps=True)
    assert rank == 1 and line.startswith("rank 1 was killed by SIGKILL") and "MPS fault domain" in line
    assert "rank 0 exited with code 1; rank 2 exited with code 1" in line
    # A bad address in one rank: every rank exits with a code, and the origin cannot be known.
    rank, line = describe_failures([(0, 3), (1, 3)], mps=True)
    assert rank == 0 and "ranks [0, 1] failed together under MPS" in line and "not known" in line
