"""The ``trident`` command: ``trident run -n N script.py [args]``, ``trident bench NAME`` and ``trident info``."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from .runtime.launch import rank_environment
from .runtime.rendezvous import free_port


def run(nprocs: int, command: list[str], grace: float = 10.0) -> int:
    """Start ``command`` once per rank with torchrun's environment; return the job's exit code.

    When a rank fails, the others get SIGTERM after ``grace`` seconds (they usually fail on
    their own first, with an error naming the lost rank), then SIGKILL.
    """
    port = free_port()
    procs = []
    for rank in range(nprocs):
        env = dict(os.environ, **rank_environment(rank, nprocs, port))
        procs.append(subprocess.Popen(command, env=env))
    failed_at = None
    code = 0
    try:
        while any(p.poll() is None for p in procs):
            bad = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode not in (None, 0)]
            if bad and failed_at is None:
                failed_at = time.monotonic()
                code = bad[0][1]
                print(f"trident run: rank {bad[0][0]} exited with code {code}", file=sys.stderr)
            if failed_at is not None and time.monotonic() - failed_at > grace:
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
                failed_at = float("inf")
            time.sleep(0.05)
    except KeyboardInterrupt:
        for p in procs:
            p.send_signal(signal.SIGINT)
    finally:
        for p in procs:
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    if code == 0:
        code = next((p.returncode for p in procs if p.returncode != 0), 0)
        for rank, p in enumerate(procs):
            if p.returncode != 0:
                print(f"trident run: rank {rank} exited with code {p.returncode}", file=sys.stderr)
                break
    return code if code >= 0 else 128 - code


def info() -> int:
    """Print the backend and versions this process would use."""
    import torch
    import triton

    from . import config

    print(f"backend      {config.BACKEND}")
    print(f"debug        {config.DEBUG}")
    print(f"torch        {torch.__version__}")
    print(f"triton       {triton.__version__}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(f"gpu {i}        {p.name}, {p.multi_processor_count} SMs, {p.total_memory >> 20} MiB")
    else:
        print("gpus         none visible: kernels run in the CPU simulator (Triton's interpreter)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trident", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run a script once per rank (like torchrun --standalone)")
    run_p.add_argument("-n", "--nproc", type=int, required=True, help="number of ranks")
    run_p.add_argument("script", help="a Python script, or -m module")
    run_p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    sub.add_parser("info", help="print the backend, versions and GPUs")
    bench_p = sub.add_parser("bench", help="run a benchmark on N ranks: ccl")
    bench_p.add_argument("name", choices=["ccl"])
    bench_p.add_argument("-n", "--nproc", type=int, default=2, help="number of ranks")
    bench_p.add_argument("args", nargs="*", help="arguments for the benchmark (see `trident bench NAME -- --help`)")
    ns, extra = parser.parse_known_args(argv)
    if ns.command == "bench":
        ns.args += extra
    elif extra:
        if ns.command != "run":
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        ns.args += extra
    if ns.command == "info":
        return info()
    if ns.command == "bench":
        return run(ns.nproc, [sys.executable, "-m", f"trident.bench.{ns.name}", *ns.args])
    if ns.nproc < 1:
        parser.error(f"-n must be at least 1, got {ns.nproc}")
    if ns.script == "-m":
        command = [sys.executable, "-m", *ns.args]
    else:
        if not os.path.exists(ns.script):
            parser.error(f"no such script: {ns.script}")
        command = [sys.executable, ns.script, *ns.args]
    return run(ns.nproc, command)


if __name__ == "__main__":
    sys.exit(main())
