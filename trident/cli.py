"""The ``trident`` command: ``trident run -n N script.py [args]``, ``trident bench NAME`` and ``trident info``."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from typing import NamedTuple

from .runtime.launch import rank_environment
from .runtime.rendezvous import free_port


def _forward_lines(pipe, lock: threading.Lock) -> None:
    """Copy a rank's stdout to ours a whole line at a time: ranks writing at once never split
    each other's lines (unbuffered Python writes a line's text and its newline separately)."""
    out = getattr(sys.stdout, "buffer", None)
    for line in iter(pipe.readline, b""):
        with lock:
            if out is not None:
                out.write(line)
            else:
                sys.stdout.write(line.decode(errors="replace"))
            sys.stdout.flush()
    pipe.close()


def run(nprocs: int, command: list[str], grace: float = 10.0) -> int:
    """Start ``command`` once per rank with torchrun's environment; return the job's exit code.

    Every rank's stdout is forwarded line by line (whole lines, never interleaved mid-line);
    stderr is shared as is (progress bars redraw there). When a rank fails, the others get
    SIGTERM after ``grace`` seconds (they usually fail on their own first, with an error naming
    the lost rank), then SIGKILL.
    """
    port = free_port()
    procs, forwarders, lock = [], [], threading.Lock()
    sys.stdout.flush()
    for rank in range(nprocs):
        env = dict(os.environ, **rank_environment(rank, nprocs, port))
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE))
        forwarders.append(threading.Thread(target=_forward_lines, args=(procs[-1].stdout, lock), daemon=True))
        forwarders[-1].start()
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
        for thread in forwarders:  # the ranks' last lines
            thread.join(timeout=grace)
    if code == 0:
        code = next((p.returncode for p in procs if p.returncode != 0), 0)
        for rank, p in enumerate(procs):
            if p.returncode != 0:
                print(f"trident run: rank {rank} exited with code {p.returncode}", file=sys.stderr)
                break
    return code if code >= 0 else 128 - code


def info(as_json: bool = False) -> int:
    """Print the backend, versions, GPUs and the links between them (``--json``: as JSON).

    Works without a GPU (it says kernels run in the simulator) and without ``pynvml`` (it says
    so, and the link column reads ``n/a``).
    """
    import json

    from .bench.topology import system_info

    facts = system_info()
    if as_json:
        print(json.dumps(facts, indent=2))
        return 0
    width = max(len(k) for k in facts["summary"]) + 2
    for key, value in facts["summary"].items():
        print(f"{key:<{width}}{value}")
    if facts["gpus"]:
        rows = [[g["index"], g["name"], g["sms"], g["memory_mib"], g["capability"]] for g in facts["gpus"]]
        print("\n" + _grid(["gpu", "name", "SMs", "memory MiB", "capability"], rows))
        m = facts["peers"]
        if m["nvml"]:
            print(f"\nlinks: {m['nvml']}")
        cells = [[i] + [f"{m['links'][i][j]}{'' if m['peer_access'][i][j] else ' (no peer access)'}"
                        for j in range(m["gpus"])] for i in range(m["gpus"])]
        print("\npeer matrix (row GPU -> column GPU; peer access checked with torch.cuda.can_device_access_peer)")
        print(_grid(["gpu"] + [str(j) for j in range(m["gpus"])], cells))
    return 0


def _grid(headings: list, rows: list[list]) -> str:
    """A left-aligned text table."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) for i, h in enumerate(headings)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(headings, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


class Bench(NamedTuple):
    """A ``trident bench NAME``: the module run once per rank, arguments it always gets, its help, default ranks."""

    module: str
    args: tuple = ()
    help: str = ""
    ranks: int = 2


#: Every ``trident bench NAME``. A new benchmark is one line here (its module has a ``main(argv)``).
BENCHMARKS = {
    "ccl": Bench("trident.bench.ccl", (), "collectives against NCCL over message sizes"),
    "p2p": Bench("trident.bench.p2p", (), "load/store/get/put/atomics from every rank to every peer (heatmaps)"),
    "all-load": Bench("trident.bench.all_access", ("--mode", "load"), "every rank reads all peers at once"),
    "all-store": Bench("trident.bench.all_access", ("--mode", "store"), "every rank writes all peers at once"),
    "device-api": Bench("trident.bench.device_api", (), "device-API translation cost vs a plain copy", 1),
    "gemm": Bench("trident.bench.gemm", (), "trident's persistent matmul vs torch.matmul (cuBLAS), one GPU", 1),
    "gemm-all-scatter": Bench("trident.bench.gemm_all_scatter", (), "GEMM + all-scatter patterns vs torch + NCCL"),
    "all-gather-gemm": Bench("trident.bench.tensor_parallel", ("--op", "all_gather_gemm"),
                             "all-gather + GEMM patterns (TP MLP, first half) vs torch + NCCL"),
    "gemm-reduce-scatter": Bench("trident.bench.tensor_parallel", ("--op", "gemm_reduce_scatter"),
                                 "GEMM + reduce-scatter patterns (TP MLP, second half) vs torch + NCCL"),
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``trident`` command (and ``python -m trident``); returns the exit code."""
    parser = argparse.ArgumentParser(prog="trident", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run a script once per rank (like torchrun --standalone)")
    run_p.add_argument("-n", "--nproc", type=int, required=True, help="number of ranks")
    run_p.add_argument("script", help="a Python script, or -m module")
    run_p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    info_p = sub.add_parser("info", help="print the backend, versions, GPUs and the links between them")
    info_p.add_argument("--json", action="store_true", help="print as JSON")
    bench_p = sub.add_parser("bench", help="run a benchmark on N ranks: " + ", ".join(BENCHMARKS),
                             formatter_class=argparse.RawDescriptionHelpFormatter,
                             epilog="benchmarks:\n" + "\n".join(f"  {k:<18}{b.help} (default -n {b.ranks})"
                                                                for k, b in BENCHMARKS.items()))
    bench_p.add_argument("name", choices=list(BENCHMARKS))
    bench_p.add_argument("-n", "--nproc", type=int, default=None,
                         help="number of ranks (default: the benchmark's, listed below)")
    bench_p.add_argument("args", nargs="*", help="arguments for the benchmark (see `trident bench NAME --help`)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 2 and argv[0] == "bench" and argv[1] in BENCHMARKS and {"-h", "--help"} & set(argv[2:]):
        bench = BENCHMARKS[argv[1]]  # the benchmark's own help, from one process
        return subprocess.call([sys.executable, "-m", bench.module, *bench.args, "--help"])
    ns, extra = parser.parse_known_args(argv)
    if ns.command == "bench":
        ns.args += extra
    elif extra:
        if ns.command != "run":
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        ns.args += extra
    if ns.command == "info":
        return info(ns.json)
    if ns.command == "bench":
        bench = BENCHMARKS[ns.name]
        nproc = bench.ranks if ns.nproc is None else ns.nproc
        if nproc < 1:
            parser.error(f"-n must be at least 1, got {nproc}")
        # The benchmark records the command the user typed (its ranks only see `python -m module`).
        os.environ["TRIDENT_BENCH_COMMAND"] = " ".join(["trident", "bench", ns.name, "-n", str(nproc), *ns.args])
        os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast (see trident/bench/harness.py)
        return run(nproc, [sys.executable, "-m", bench.module, *bench.args, *ns.args])
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
