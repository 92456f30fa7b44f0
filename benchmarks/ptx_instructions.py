"""PTX instructions per fused-op kernel, compiled for sm_90 on any machine (no GPU needed).

A static measure of what a change adds to the kernels: it builds the kernels that
``tests/test_ops_compile_sm90.py`` builds (the same signatures and constexprs) and counts the
instructions of each kernel's PTX body (labels, directives and comments left out). Run it on two
checkouts to compare them::

    python benchmarks/ptx_instructions.py --out results/ptx/after.json
    (cd ../old-checkout && python benchmarks/ptx_instructions.py --out /tmp/before.json)
    python benchmarks/ptx_instructions.py --compare /tmp/before.json results/ptx/after.json

Static counts are not time: a branch not taken costs nothing at run time. Device time comes from
``trident bench`` on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The compile test's child program, with its per-kernel record replaced by an instruction count.
_RECORD = 'results[name] = {"ok": True, "wgmma": "wgmma" in ptx, "tma": "cp.async.bulk.tensor" in ptx}'
_COUNT = 'results[name] = {"ok": True, "instructions": count(ptx)}'
_COUNTER = '''
import re
def count(ptx):
    body = ptx.split("$L__func_end")[0]
    return sum(1 for line in body.splitlines()
               if re.match(r"\\s+[a-z@]", line.split("//")[0]) and not line.strip().startswith("."))
'''


def child_program() -> str:
    """The compile test's child program, counting instructions instead of checking for wgmma/TMA."""
    source = (ROOT / "tests" / "test_ops_compile_sm90.py").read_text()
    child = source.split("CHILD = r'''")[1].split("'''")[0]
    if _RECORD not in child:
        raise SystemExit("tests/test_ops_compile_sm90.py changed its record line: update this script's _RECORD")
    return _COUNTER + child.replace(_RECORD, _COUNT)


def measure() -> dict:
    """``{kernel: instructions}`` for this checkout (compiled in a child process with the cuda backend)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as cache:
        env.update(TRIDENT_BACKEND="cuda", TRITON_CACHE_DIR=cache,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        proc = subprocess.run([sys.executable, "-c", child_program()], capture_output=True, text=True, cwd=ROOT,
                              env=env, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: r.get("instructions", r.get("error")) for name, r in results.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="JSON file for this checkout's counts")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="print two saved counts side by side")
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(Path(p).read_text())["kernels"] for p in args.compare)
        print(f"{'kernel':45s} {'before':>7} {'after':>7} {'added':>6}")
        for name in after:
            b, a = before.get(name), after[name]
            added = a - b if isinstance(a, int) and isinstance(b, int) else ""
            print(f"{name:45s} {b!s:>7} {a!s:>7} {added!s:>6}")
        return 0
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    record = {"commit": commit.strip(), "kernels": measure()}
    for name, count in record["kernels"].items():
        print(f"{name:45s} {count}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
