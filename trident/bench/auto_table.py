"""The fused ops' ``auto`` tables from benchmark results: ``python -m trident.bench.auto_table RESULT.json ...``.

Reads records of ``trident bench gemm-all-scatter``, ``all-gather-gemm`` and ``gemm-reduce-scatter``
(their JSON files, or folders holding them), takes per measured shape the fastest of ``baseline``
and the op's patterns, and turns each (op, GPU model, world size) into rules as the ops'
``AUTO_TABLE`` hold them: ``[(minimum M*N*K, pattern), ...]``, largest first, each shape's choice
holding from its own size up to the next measured shape's. Going from the largest shape down, a
choice is kept while it stays within ``--tolerance`` of the fastest, so noise does not split the
table into rules that alternate between patterns of the same speed. Prints the rules as Python to paste
into the op's module, and for every measured shape what ``auto`` runs now against the fastest.

With ``--check`` the exit code is 1 when ``auto`` runs something slower than the fastest pattern
by more than ``--tolerance`` (default 2%, about the run-to-run spread of these benchmarks) on any
measured shape. Records whose ranks shared a GPU are skipped: there ``auto`` runs a correctness
setting (``fused_sequential``), and no timing of shared GPUs is a performance figure.

Example::

    python -m trident.bench.auto_table docs/results/h200-2026-12-03b --check
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from ..ops import OPS
from ..ops.fused.call import table_choice

#: Rules per (op, GPU model, world size): ``[(minimum M*N*K, pattern), ...]``, largest first.
Tables = dict[tuple[str, str, int], list[tuple[int, str]]]


def gpu_model(name: str) -> str:
    """The part of a GPU's name the ``auto`` tables key on: ``"NVIDIA H200"`` -> ``"H200"``.

    Example::

        gpu_model("NVIDIA H100 80GB HBM3")   # 'H100'
    """
    found = re.search(r"\b([A-Z]+\d{2,}[A-Za-z]*)\b", name)
    return found.group(1) if found else name


def _op(record: dict) -> str | None:
    op = record.get("params", {}).get("op") or record.get("benchmark", "").replace("-", "_")
    return op if op in OPS else None


def _size(shape: str) -> int:
    m, n, k = (int(v) for v in shape.split("x"))
    return m * n * k


def pattern_times(record: dict) -> dict[str, dict[str, float]]:
    """Per shape of a fused-op record, the device ms of ``baseline`` and of each of the op's patterns."""
    candidates = set(OPS[str(_op(record))].patterns) | {"baseline"}
    times: dict[str, dict[str, float]] = {}
    for row in record["rows"]:
        if row["pattern"] in candidates:
            times.setdefault(row["shape"], {})[row["pattern"]] = row["time_ms"]
    return times


def rules(times: dict[int, dict[str, float]], tolerance: float = 0.02) -> list[tuple[int, str]]:
    """Rules from each measured size's times per pattern: largest size first, the fastest pattern,
    kept for smaller sizes while it stays within ``tolerance`` of their fastest; each rule starts at
    the smallest size it covers, the last at 0 (below every measured size).

    Example::

        rules({100: {"a": 1.0, "b": 1.3}, 50: {"a": 1.01, "b": 1.0}, 10: {"a": 2.0, "b": 1.0}})
        # [(50, 'a'), (0, 'b')]: at 50, 'a' is within 2% of 'b'
    """
    out: list[tuple[int, str]] = []
    for size in sorted(times, reverse=True):
        best = min(times[size].values())
        if out and times[size].get(out[-1][1], float("inf")) <= best * (1 + tolerance):
            out[-1] = (size, out[-1][1])
        else:
            out.append((size, min(times[size], key=times[size].__getitem__)))
    if out:
        out[-1] = (0, out[-1][1])
    return out


def load(paths: list[str]) -> list[dict]:
    """Every fused-op record in ``paths`` (files, or folders searched for ``*.json`` with their subfolders),
    timed on GPUs of its own, in the order given (a later record of a shape replaces an earlier one)."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            files += sorted(os.path.join(top, name) for top, _, names in os.walk(path)
                            for name in names if name.endswith(".json"))
        else:
            files.append(path)
    records = []
    for name in files:
        with open(name) as f:
            record = json.load(f)
        if isinstance(record, dict) and _op(record) and "rows" in record and not record["meta"].get("ranks_share_gpus"):
            records.append({**record, "file": name})
    return records


def tables(records: list[dict], tolerance: float = 0.02) -> tuple[Tables, list[dict]]:
    """``(rules per (op, GPU, world size), one comparison row per measured shape)``; a later record of
    the same op, GPU, world size and shape replaces an earlier one."""
    measured: dict[tuple[str, str, int], dict[str, dict[str, float]]] = {}
    for record in records:
        key = (str(_op(record)), gpu_model(record["meta"]["gpu"]), int(record["meta"]["world_size"]))
        measured.setdefault(key, {}).update(pattern_times(record))
    out: Tables = {}
    compared = []
    for (op, gpu, world), shapes in measured.items():
        out[(op, gpu, world)] = rules({_size(s): t for s, t in shapes.items()}, tolerance)
        for shape, times in sorted(shapes.items(), key=lambda kv: -_size(kv[0])):
            fastest = min(times, key=times.__getitem__)
            now = table_choice(OPS[op].auto_table, gpu, world, _size(shape))
            now_ms = times.get(now)
            compared.append({"op": op, "gpu": gpu, "world_size": world, "shape": shape, "fastest": fastest,
                             "fastest_ms": times[fastest], "auto_now": now, "auto_now_ms": now_ms,
                             "auto_over_fastest": now_ms / times[fastest] if now_ms else None})
    return out, compared


def main(argv=None) -> int:
    """Print the rules and the comparison; with ``--check`` return 1 when ``auto`` is slower than allowed."""
    parser = argparse.ArgumentParser(prog="python -m trident.bench.auto_table", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="fused-op benchmark JSON files, or folders of them")
    parser.add_argument("--check", action="store_true", help="exit 1 when auto is slower than the fastest")
    parser.add_argument("--tolerance", type=float, default=0.02, help="slower by at most this fraction (0.02)")
    args = parser.parse_args(argv)
    found, compared = tables(load(args.paths), args.tolerance)
    if not found:
        print("no fused-op benchmark records (of GPUs of their own) in", " ".join(args.paths))
        return 1 if args.check else 0
    for (op, gpu, world), op_rules in sorted(found.items()):
        print(f"{op}: AUTO_TABLE[({gpu!r}, {world})] = {op_rules!r}")
    slow = []
    for row in compared:
        ratio = row["auto_over_fastest"]
        verdict = "unmeasured" if ratio is None else f"{ratio:.3f}x"
        print(f"  {row['op']} {row['gpu']} x{row['world_size']} {row['shape']}: fastest {row['fastest']} "
              f"{row['fastest_ms']:.4f} ms; auto runs {row['auto_now']} ({verdict})")
        if ratio is None or ratio > 1 + args.tolerance:
            slow.append(row)
    if args.check and slow:
        print(f"auto runs something slower than the fastest (by more than {args.tolerance:.0%}, or unmeasured) "
              f"on {len(slow)} shape(s): paste the rules above into the ops' AUTO_TABLE")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
