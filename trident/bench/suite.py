"""``trident bench suite NAME``: named lists of commands run one after another on a GPU machine.

A suite is a list of :class:`Step`: a command (a pytest run on the cuda backend, a ``trident
bench`` run, an example) with its own time limit. :func:`main` runs a suite's steps in order from
the repository root, each with its output in ``OUT/STEP.log``; it stops starting steps once the
total budget is spent (a hang cannot take the whole session), and writes ``OUT/summary.json``
after every step, so a run cut short still says how far it got::

    trident bench suite p2p --out results/suite-p2p --budget 540
    trident bench suite --list            # every suite and its steps

``summary.json``: ``{"schema": "trident-suite/1", "suite", "date", "budget_s", "elapsed_s", "ok",
"steps": [{"name", "command", "limit_s", "status", "returncode", "seconds", "log"}]}``, where
``status`` is ``ok``, ``failed``, ``timeout`` (killed at its limit) or ``skipped`` (the budget was
spent). The exit code is 0 only when every step ran and succeeded.

Commands name the running Python as ``{py}`` and the suite's output folder as ``{out}``. Every
step runs with the repository on ``PYTHONPATH`` and NVLink multicast off (see
:mod:`trident.bench.harness`); benchmarks and examples use the backend trident picks (set
``TRIDENT_BACKEND=sim`` to rehearse a suite on a CPU, at the simulator's tiny sizes).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time
from typing import Any

from .. import config

#: The repository: steps name tests/, examples/ and benchmarks/ relative to it.
ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMA = "trident-suite/1"
#: A step is not started with less than this left of the budget.
MIN_STEP_S = 15
#: Seconds a timed-out step gets to exit after SIGTERM before it is killed.
KILL_GRACE_S = 10
#: Lines of each step's log echoed to the terminal.
TAIL_LINES = 40
#: Seconds a suite may take unless ``--budget`` says otherwise: under the 10 minutes a command may
#: run on the lent GPU machines, with room to start the machine and fetch the results.
DEFAULT_BUDGET_S = 540


@dataclasses.dataclass(frozen=True)
class Step:
    """One command of a suite.

    Attributes:
        name: the step's name (its log is ``OUT/NAME.log``).
        argv: the command; ``{py}`` is the running Python, ``{out}`` the suite's output folder.
        limit_s: seconds it may run (cut to what is left of the budget).
        env: extra environment variables.
    """

    name: str
    argv: tuple[str, ...]
    limit_s: int
    env: tuple[tuple[str, str], ...] = ()

    def command(self, out: str) -> list[str]:
        """The command line, placeholders filled in."""
        return [a.replace("{py}", sys.executable).replace("{out}", out) for a in self.argv]


def pytest(name: str, *args: str, limit: int) -> Step:
    """A pytest run on the cuda backend (ranks share the GPUs when a test needs more ranks than there are)."""
    # -v and the failure log (tests/conftest.py): a run cut short by its time limit never prints pytest's
    # summary, yet still names every test that ran and says why each failure failed.
    return Step(name, ("{py}", "-m", "pytest", "-v", "-p", "no:cacheprovider", "--backend", "cuda", "-rfEs",
                       "--durations=10", "-o", "timeout=200", *args), limit,
                (("TRIDENT_FAILURE_LOG", f"{{out}}/{name}.failures.log"),))


def bench(name: str, benchmark: str, ranks: int, *args: str, limit: int, env: dict | None = None) -> Step:
    """``trident bench BENCHMARK -n RANKS ARGS``, its results in ``OUT/NAME``."""
    return Step(name, ("{py}", "-m", "trident", "bench", benchmark, "-n", str(ranks), *args, "--no-progress",
                       "--out", f"{{out}}/{name}"), limit, tuple((env or {}).items()))


def script(name: str, path: str, ranks: int, *args: str, limit: int) -> Step:
    """``trident run -n RANKS PATH ARGS`` (an example or a benchmark script)."""
    return Step(name, ("{py}", "-m", "trident", "run", "-n", str(ranks), path, *args), limit)


#: pytest-xdist's arguments for the GPU test run: five workers, each running whole modules (its own
#: rank pools), in the order tests/conftest.py gives them (slow modules first: xdist's own reorder
#: puts one-test modules such as the stress test last, where they ran alone past the time limit);
#: nothing where pytest-xdist is missing.
XDIST = ("-n", "5", "--dist", "loadfile", "--no-loadscope-reorder") if importlib.util.find_spec("xdist") else ()
#: The machine, driver and versions the results came from (``trident info``), first in every GPU suite.
INFO = Step("info", ("{py}", "-m", "trident", "info"), 60)
#: Markdown tables of every results record the suite wrote (for docs/figures.md).
SUMMARY = Step("summary", ("{py}", "-m", "trident.bench.summary", "{out}"), 60)
#: The fused ops' ``auto`` rules from the suite's fused-op records, and whether ``auto`` runs the fastest.
AUTO_TABLE = Step("auto_table", ("{py}", "-m", "trident.bench.auto_table", "{out}", "--check"), 60)


def _examples(ranks: tuple[int, ...] = (2, 4)) -> list[Step]:
    """Every example (``examples/*.py``; ``_name.py`` are helpers) at each rank count."""
    names = sorted(p.stem for p in (ROOT / "examples").glob("[!_]*.py"))
    return [script(f"{name}_{n}", f"examples/{name}.py", n, limit=120) for n in ranks for name in names]


def _p2p() -> list[Step]:
    steps = [INFO]
    for n in (2, 4):  # more ranks than GPUs share them: a correctness run, and the records say so
        steps += [bench(f"p2p_{n}", "p2p", n, "--bytes", "256M", limit=90),
                  bench(f"all_load_{n}", "all-load", n, "--max-bytes", "2G", limit=75),
                  bench(f"all_store_{n}", "all-store", n, "--max-bytes", "2G", limit=75)]
    # Last, so they cannot starve the link figures above: a traced kernel, and device-api (24 kernels to compile).
    return steps + [script("trace_demo_2", "benchmarks/trace_demo.py", 2, "--out", "{out}/trace_demo_2", limit=60),
                    bench("device_api", "device-api", 1, "--sizes-mib", "256", "1024", limit=120), SUMMARY]


#: Every suite by name: its steps, run in this order.
SUITES: dict[str, list[Step]] = {
    # The whole test suite on the GPU.
    # Ranks concurrent under MPS, each its share of the SMs; five pytest-xdist workers (whole modules each).
    # Tests that must run alone run last, serially (tests/conftest.py: those that kill ranks, since a fatal
    # GPU error under MPS reaches every client of the daemon, and those that measure the whole GPU).
    "gpu-tests": [INFO, pytest("pytest_cuda", "--mps", *XDIST, "-m", "not (kills_ranks or device_wide)", limit=430),
                  pytest("pytest_cuda_alone", "--mps", "-m", "kills_ranks or device_wide", limit=125)],
    # trident.ops.matmul against torch.matmul (cuBLAS): bf16 with the sweep of candidate configs, fp16 the table's.
    "gpu-gemm": [INFO, bench("gemm_bf16", "gemm", 1, "--sweep", "--dtype", "bfloat16", limit=420),
                 bench("gemm_fp16", "gemm", 1, "--dtype", "float16", limit=120)],
    # The three fused ops at one rank (each pattern against the GEMM alone) with timelines, then
    # gemm-all-scatter's cross-rank path at 2 ranks, then the workgroup_specialized kernels taken apart.
    "fused-ops": [INFO] + [bench(b.replace("-", "_"), b, 1, "--trace", limit=150)
                           for b in ("gemm-all-scatter", "all-gather-gemm", "gemm-reduce-scatter")]
                 + [bench("gemm_all_scatter_2", "gemm-all-scatter", 2, "--shapes", "1024x1536x2048", "--repeats", "3",
                          "--trace", limit=90), AUTO_TABLE,
                    script("fused_anatomy", "benchmarks/fused_anatomy.py", 1, "--out", "{out}/fused_anatomy",
                           limit=150)],
    # The device API's bandwidth: p2p, all-load, all-store at 2 and 4 ranks, a traced kernel, device-api.
    "p2p": _p2p(),
    # The collectives against NCCL at 2 and 4 ranks.
    "ccl": [INFO] + [bench(f"ccl_{n}", "ccl", n, "--max-bytes", "16M", "--repeats", "10", limit=150) for n in (2, 4)],
    # Every example as written, at 2 and 4 ranks.
    "examples": [INFO] + _examples(),
    # What a small call costs: host time, flag round trips, small collectives (eager and in CUDA graphs), one rank
    # alone, then ranks sharing the GPU under MPS (real latency and host time, never bandwidth).
    "latency": [INFO, bench("latency_1", "latency", 1, limit=120)]
               + [bench(f"latency_{n}", "latency", n, "--mps", "--small-only", limit=120) for n in (2, 4, 8)],
    # The inference layer: a tensor-parallel decoder layer (all_reduce_rmsnorm, gemm_all_reduce) against torch + NCCL.
    "inference": [INFO, bench("tp_layer_1", "tp-layer", 1, limit=300)]
                 + [bench(f"tp_layer_{n}", "tp-layer", n, "--mps", "--models", "8b", "--tokens", "1", "8", "32", "128",
                          limit=150) for n in (2, 4, 8)],
    # Expert parallelism: MoE dispatch and combine (DeepSeek-V3 shapes) against the torch path, one rank alone,
    # then ranks sharing the GPU under MPS with the bench's defaults, decode and prefill (correctness and
    # latency, never bandwidth), both layouts at decode.
    "moe": [INFO, bench("moe_1", "moe", 1, limit=240)]
           + [bench(f"moe_{n}", "moe", n, "--mps", limit=150) for n in (2, 4, 8)],
    # The headline figures at one rank in one device call (under ten minutes): host time per call through
    # every entry and its anatomy, MoE at decode and prefill sizes, the decoder layer at decode sizes with
    # its zero-copy and no-communication variants, GEMM + all-scatter against the GEMM alone.
    "headline": [INFO, bench("latency_1", "latency", 1, limit=120),
                 script("host_anatomy", "benchmarks/host_anatomy.py", 1, "--out", "{out}/host_anatomy", limit=90),
                 bench("moe_1", "moe", 1, "--tokens", "128", "4096", limit=150),
                 bench("tp_layer_1", "tp-layer", 1, "--models", "8b", "--tokens", "1", "32", limit=90),
                 bench("gemm_all_scatter_1", "gemm-all-scatter", 1, limit=120), AUTO_TABLE, SUMMARY],
    # One quick step in the CPU simulator: the suite machinery, anywhere (tests/test_bench.py runs it).
    "sim-smoke": [bench("p2p_sim", "p2p", 1, "--ops", "load", "--bytes", "4K", limit=90,
                        env={"TRIDENT_BACKEND": "sim"})],
}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _environment(step: Step, out: str) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""), "PYTHONUNBUFFERED": "1",
            # Never NVLink multicast on the shared GPU hosts (trident/config.py).
            **config.NO_MULTICAST_ENV, **{k: v.replace("{out}", out) for k, v in step.env}}


def _stop(proc: subprocess.Popen) -> None:
    """End a step's process group (the ranks it started too): SIGTERM, then SIGKILL after a grace period."""
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(log: str) -> str:
    with open(log, errors="replace") as f:
        lines = [line.rstrip() for line in f if line.strip() and "destroy_process_group" not in line]
    return "\n".join(lines[-TAIL_LINES:])


def run_step(step: Step, out: str, limit: float) -> dict:
    """Run one step with a time limit, its output in ``OUT/NAME.log``; returns its summary entry."""
    cmd, log = step.command(out), os.path.join(out, f"{step.name}.log")
    print(f"== {step.name} (limit {limit:.0f}s): {shlex.join(cmd)}", flush=True)
    t0 = time.monotonic()
    with open(log, "w") as f:
        try:
            # A session of its own, so a timeout ends the ranks the step started with it.
            proc = subprocess.Popen(cmd, cwd=ROOT, env=_environment(step, out), stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        except OSError as exc:
            f.write(f"could not start: {exc}\n")
            proc = None
        status, rc = "failed", None
        if proc is not None:
            try:
                rc = proc.wait(timeout=limit)
                status = "ok" if rc == 0 else "failed"
            except subprocess.TimeoutExpired:
                _stop(proc)
                status, rc = "timeout", proc.returncode
            except BaseException:  # Ctrl-C: leave nothing running
                _stop(proc)
                raise
    seconds = round(time.monotonic() - t0, 1)
    print(_tail(log))
    print(f"== {step.name}: {status} (exit {rc}) after {seconds}s", flush=True)
    return {"name": step.name, "command": shlex.join(cmd), "limit_s": round(limit), "status": status,
            "returncode": rc, "seconds": seconds, "log": os.path.basename(log)}


def run_suite(name: str, steps: list[Step], out: str, budget: float) -> dict:
    """Run ``steps`` in order within ``budget`` seconds; returns the summary (also ``OUT/summary.json``)."""
    os.makedirs(out, exist_ok=True)
    start = time.monotonic()
    summary: dict[str, Any]
    summary = {"schema": SCHEMA, "suite": name, "date": _now(), "budget_s": budget, "elapsed_s": 0.0, "ok": False,
               "steps": [{"name": s.name, "command": shlex.join(s.command(out)), "limit_s": s.limit_s,
                          "status": "pending", "returncode": None, "seconds": 0.0, "log": None} for s in steps]}
    for i, step in enumerate(steps):
        left = budget - (time.monotonic() - start)
        if left < MIN_STEP_S:
            summary["steps"][i]["status"] = "skipped"
            print(f"== {step.name}: skipped, the budget ({budget:g}s) is spent", flush=True)
        else:
            summary["steps"][i] = run_step(step, out, min(step.limit_s, left))
        summary["elapsed_s"] = round(time.monotonic() - start, 1)
        summary["ok"] = all(s["status"] == "ok" for s in summary["steps"])
        with open(os.path.join(out, "summary.json"), "w") as f:  # after every step: a cut-short run still says
            json.dump(summary, f, indent=2)
    bad = [f"{s['name']} ({s['status']})" for s in summary["steps"] if s["status"] != "ok"]
    print(f"suite {name}: {summary['elapsed_s']}s, {'all ok' if not bad else 'not ok: ' + ', '.join(bad)}; "
          f"{os.path.join(out, 'summary.json')}", flush=True)
    return summary


def parse_args(argv, suites: dict) -> argparse.Namespace:
    """``NAME [--out DIR] [--budget S]`` or ``--list``."""
    parser = argparse.ArgumentParser(prog="trident bench suite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", nargs="?", choices=list(suites), help="the suite to run")
    parser.add_argument("--out", default=None, help="folder for the logs and summary.json (default results/suite-NAME)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                        help=f"seconds for the whole suite; no step starts after it (default {DEFAULT_BUDGET_S})")
    parser.add_argument("--list", action="store_true", help="list the suites and their steps")
    args = parser.parse_args(argv)
    if args.name is None and not args.list:
        parser.error("name a suite, or --list")
    return args


def main(argv=None, suites: dict | None = None) -> int:
    """Run a suite: ``main(["p2p", "--out", "results/p2p", "--budget", "300"])``; ``main(["--list"])``.

    Args:
        argv: ``NAME [--out DIR] [--budget S]`` or ``--list`` (default: ``sys.argv[1:]``).
        suites: the suites to choose from (default :data:`SUITES`).

    Returns:
        0 when every step ran and succeeded, else 1.
    """
    suites = SUITES if suites is None else suites
    args = parse_args(sys.argv[1:] if argv is None else argv, suites)
    if args.list:
        for name, steps in suites.items():
            print(name)
            for step in steps:
                env = "".join(f"{k}={v} " for k, v in step.env)
                print(f"  {step.name:<30}{step.limit_s:>5}s  {env}{shlex.join(step.argv)}")
        return 0
    out = os.path.abspath(args.out or os.path.join("results", f"suite-{args.name}"))
    summary = run_suite(args.name, suites[args.name], out, args.budget)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
