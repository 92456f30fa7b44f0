"""Every example runs as written (``trident run -n 2 examples/NAME.py``) and reports success on every rank.

On a machine without a GPU that is the CPU simulator; each example checks its own result
against torch and exits non-zero when it is wrong.
"""

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("[!_]*.py"))  # _name.py: helpers
SUCCESS = ("ok", "matches")


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_on_two_ranks(name):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "trident", "run", "-n", "2", f"examples/{name}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for rank in range(2):
        lines = [line for line in proc.stdout.splitlines() if line.startswith(f"rank {rank}")]
        assert any(word in line for line in lines for word in SUCCESS), proc.stdout[-2000:]
