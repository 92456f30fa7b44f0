"""The ``trident`` command (also ``python -m trident``).

* ``trident run -n N [--grace S] script.py [args]`` or ``trident run -n N -m module [args]``: the
  script once per rank, with torchrun's environment (see :mod:`trident.runtime.launcher` for what
  happens to failures, signals and output). Every word after the script or module goes to it as
  it is, a ``--`` included (argparse's REMAINDER rule); a ``--`` before the script ends the
  launcher's own options.
* ``trident bench NAME [-n N] [args]``: a benchmark on N ranks; ``trident bench suite NAME [--out DIR]
  [--budget S] [--list]``: a named set of benchmarks, driven from this one process.
* ``trident info [--json]``: the backend, versions, GPUs and the links between them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import NamedTuple

from . import config
from .runtime.launcher import DEFAULT_GRACE, run

__all__ = ["BENCHMARKS", "Bench", "info", "main", "run", "split_run_argv"]


def info(as_json: bool = False) -> int:
    """Print the backend, versions, GPUs and the links between them (``--json``: as JSON).

    Works without a GPU (it says kernels run in the simulator) and without ``pynvml`` (it says
    so, and the link column reads ``n/a``).
    """
    import json

    from . import __version__, topology
    from .runtime.context import DEFAULT_HEAP_SIZE
    from .runtime.nodes import describe_environment

    facts = topology.system_info(default_heap_size=DEFAULT_HEAP_SIZE, version=__version__)
    facts["summary"]["nodes"] = describe_environment()  # how the ranks of a job started here map heaps
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
    "tp-layer": Bench("trident.bench.tp_layer", (), "a tensor-parallel Llama decoder layer (trident's inference ops) "
                                                    "vs torch + NCCL, decode to prefill, eager and in a CUDA graph"),
    "moe": Bench("trident.bench.moe", (), "expert-parallel MoE dispatch and combine (DeepSeek-V3 shapes) vs the "
                                          "torch path (all_to_all_single over NCCL), eager and in a CUDA graph"),
    "latency": Bench("trident.bench.latency", (), "host time per call, flag round trips, small collectives (eager, "
                                                  "CUDA graph) against empty launches, torch and NCCL"),
    "dist-backend": Bench("trident.bench.dist_backend", (), "host time per all-reduce: torch.distributed's "
                                                            "trident backend vs trident.ccl directly (vs NCCL)"),
    "gemm-all-scatter": Bench("trident.bench.gemm_all_scatter", (), "GEMM + all-scatter patterns vs torch + NCCL"),
    "all-gather-gemm": Bench("trident.bench.tensor_parallel", ("--op", "all_gather_gemm"),
                             "all-gather + GEMM patterns (TP MLP, first half) vs torch + NCCL"),
    "gemm-reduce-scatter": Bench("trident.bench.tensor_parallel", ("--op", "gemm_reduce_scatter"),
                                 "GEMM + reduce-scatter patterns (TP MLP, second half) vs torch + NCCL"),
}


#: ``trident bench suite``'s line in ``trident bench --help`` (the suite is no one-module benchmark).
_SUITE_HELP = "a named set of benchmarks, one after another: trident bench suite NAME [--out DIR] " \
              "[--budget S]; --list names the suites"

_RUN_USAGE = "trident run [-h] -n NPROC [--nodes N] [--grace S] [--mps] (script.py | -m MODULE) [args ...]"
_RUN_HELP = """\
Runs the script (or module) once per rank with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT, ...). Every word after the script goes to it verbatim, a -- included.

The first rank to fail is named, and its exit code is the job's (128 + N for signal N); ranks still
running --grace seconds later get SIGTERM, then SIGKILL. Ctrl-C or SIGTERM to the launcher reaches
each rank once (ranks run in their own sessions), and what still runs --grace seconds later is
killed. Each rank's stdout is forwarded a whole line at a time; ranks run with PYTHONUNBUFFERED=1
unless it is set."""


def split_run_argv(words: list[str]) -> tuple[list[str], list[str]]:
    """Split the words after ``trident run`` into the launcher's and the script's.

    The launcher's options (``-n``, ``--grace``, ``-h``) come first; the first other word is the
    script, or ``-m MODULE``, and every word after it belongs to the script, verbatim (``--`` and
    ``-n`` included). A ``--`` before the script ends the launcher's options.

    Example::

        split_run_argv(["-n", "2", "-m", "pkg.mod", "--", "-n", "3"])
        # (["-n", "2", "-m", "pkg.mod"], ["--", "-n", "3"])
    """
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("-n", "--nproc", "--grace", "--nodes"):
            i += 2
        elif word in ("-h", "--help", "--mps") or word.startswith(("--nproc=", "--grace=", "--nodes=")) or (
                word.startswith("-n") and len(word) > 2):
            i += 1
        elif word in ("--", "-m"):
            return words[:i + 2], words[i + 2:]
        else:  # the script, -mMODULE, or an option that argparse will reject
            return words[:i + 1], words[i + 1:]
    return words, []


def _parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, argparse.ArgumentParser]:
    """The ``trident`` parser and its ``run`` and ``bench`` subparsers."""
    parser = argparse.ArgumentParser(prog="trident", description="Run a script once per rank, run benchmarks, "
                                                                 "describe this machine's GPUs.")
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run a script once per rank (like torchrun --standalone)", usage=_RUN_USAGE,
                           allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
                           description=_RUN_HELP)
    run_p.add_argument("-n", "--nproc", type=int, required=True, help="number of ranks")
    run_p.add_argument("--nodes", type=int, default=1, metavar="N",
                       help="split the ranks into N logical nodes (contiguous blocks) that do not map each other's "
                            "heaps, as on N hosts: multi-node code tested on one machine (sets TRIDENT_NODES)")
    run_p.add_argument("--grace", type=float, default=DEFAULT_GRACE, metavar="S",
                       help=f"seconds from a rank's failure (or a signal) to SIGTERM, and from SIGTERM to SIGKILL, "
                            f"for the ranks still running (default {DEFAULT_GRACE:g})")
    run_p.add_argument("--mps", action="store_true",
                       help="ranks sharing a GPU run concurrently under a private MPS daemon, each held to its "
                            "share of the SMs (without it their kernels time-slice); the daemon always stops")
    run_p.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m does")
    run_p.add_argument("script", nargs="?", help="a Python script")
    run_p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script or module, passed on "
                                                              "verbatim (a -- too)")
    info_p = sub.add_parser("info", help="print the backend, versions, GPUs and the links between them")
    info_p.add_argument("--json", action="store_true", help="print as JSON")
    names = [*BENCHMARKS, "suite"]
    width = max(map(len, names)) + 2
    lines = [f"  {k:<{width}}{b.help} (default -n {b.ranks})" for k, b in BENCHMARKS.items()]
    bench_p = sub.add_parser("bench", help="run a benchmark on N ranks: " + ", ".join(names),
                             formatter_class=argparse.RawDescriptionHelpFormatter,
                             epilog="\n".join(["benchmarks:", *lines, f"  {'suite':<{width}}{_SUITE_HELP}"]))
    bench_p.add_argument("name", choices=names)
    bench_p.add_argument("-n", "--nproc", type=int, default=None,
                         help="number of ranks (default: the benchmark's, listed below)")
    bench_p.add_argument("--mps", action="store_true",
                         help="ranks sharing a GPU run concurrently under a private MPS daemon (as trident run --mps)")
    bench_p.add_argument("args", nargs="*", help="arguments for the benchmark (see `trident bench NAME --help`)")
    return parser, run_p, bench_p


def _suite(argv: list[str]) -> int:
    """``trident bench suite ...``: the suite runs here, once; it starts each benchmark's ranks itself."""
    from .bench import suite

    return suite.main(argv)


def _run_command(run_p: argparse.ArgumentParser, words: list[str]) -> int:
    """``trident run WORDS``."""
    head, script_args = split_run_argv(words)
    ns = run_p.parse_args(head)
    if ns.nproc < 1:
        run_p.error(f"-n must be at least 1, got {ns.nproc}")
    if ns.grace < 0:
        run_p.error(f"--grace must be at least 0, got {ns.grace:g}")
    if ns.nodes < 1 or ns.nproc % ns.nodes:
        run_p.error(f"--nodes {ns.nodes} must be at least 1 and divide -n {ns.nproc} (nodes of equal size)")
    if ns.module is not None:
        command = [sys.executable, "-m", ns.module, *script_args]
    elif ns.script is not None:
        if not os.path.exists(ns.script):
            run_p.error(f"no such script: {ns.script}")
        command = [sys.executable, ns.script, *script_args]
    else:
        run_p.error("missing the script to run (or -m MODULE)")
    env = {"TRIDENT_NODES": str(ns.nodes)} if ns.nodes > 1 else None
    return run(ns.nproc, command, grace=ns.grace, env=env, mps=ns.mps)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``trident`` command (and ``python -m trident``); returns the exit code."""
    parser, run_p, bench_p = _parsers()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:  # split by hand: argparse cannot tell `-m module` or a script's `--` from its own
        return _run_command(run_p, argv[1:])
    if argv[:2] == ["bench", "suite"]:  # the suite's arguments are the suite's, verbatim
        return _suite(argv[2:])
    if len(argv) >= 2 and argv[0] == "bench" and argv[1] in BENCHMARKS and {"-h", "--help"} & set(argv[2:]):
        bench = BENCHMARKS[argv[1]]  # the benchmark's own help, from one process
        return subprocess.call([sys.executable, "-m", bench.module, *bench.args, "--help"])
    ns, extra = parser.parse_known_args(argv)
    if ns.command != "bench" and extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if ns.command == "info":
        return info(ns.json)
    ns.args += extra
    if ns.name == "suite":  # `trident bench -n N suite ...`: the suite picks each benchmark's ranks
        if ns.nproc is not None:
            bench_p.error("trident bench suite takes no -n: each benchmark in it runs on its own ranks")
        return _suite(ns.args)
    bench = BENCHMARKS[ns.name]
    nproc = bench.ranks if ns.nproc is None else ns.nproc
    if nproc < 1:
        bench_p.error(f"-n must be at least 1, got {nproc}")
    env = {
        # The benchmark records the command the user typed (its ranks only see `python -m module`).
        "TRIDENT_BENCH_COMMAND": " ".join(["trident", "bench", ns.name, "-n", str(nproc),
                                           *(["--mps"] if ns.mps else []), *ns.args]),
        **config.NO_MULTICAST_ENV,  # never NVLink multicast (trident/config.py)
    }
    return run(nproc, [sys.executable, "-m", bench.module, *bench.args, *ns.args], env=env, mps=ns.mps)


if __name__ == "__main__":
    sys.exit(main())
