"""Markdown summaries of benchmark results, for docs: ``python -m trident.bench.summary RESULTS_DIR``.

Finds every ``*.json`` results record under the folder and prints, for each, the command,
machine, versions and date, the shared-GPU note when there is one, and a compact table, ready to
paste into docs/benchmarks.md next to the PNG it came with.
"""

from __future__ import annotations

import json
import os
import sys

from . import arguments, harness

# The table each benchmark gets: (row key, heading, format).
COLUMNS = {
    "all-load": [("size", "B per rank", ""), ("trident_gbps", "trident GB/s", ".1f"),
                 ("copy_engine_gbps", "copy engine GB/s", ".1f"), ("nccl_gbps", "NCCL GB/s", ".1f"),
                 ("of_copy_engine", "of copy engine", ".1%"), ("correct", "ok", "")],
    "device-api": [("variant", "variant", ""), ("size", "size", ""), ("gb_per_s", "GB/s", ".0f"),
                   ("fraction_of_plain", "vs plain", ".1%"), ("vector_access", "vector access", ""),
                   ("correct", "ok", "")],
    "ccl": [("collective", "collective", ""), ("impl", "impl", ""), ("bytes", "bytes", "d"),
            ("time_us", "time us", ".1f"), ("busbw_gbps", "busbw GB/s", ".1f")],
}
COLUMNS["all-store"] = COLUMNS["all-load"]


def markdown_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Rows as a Markdown table; a missing value is ``-``.

    Example::

        markdown_table([{"op": "load", "gbps": 3.5}], [("op", "op", ""), ("gbps", "GB/s", ".1f")])
    """
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |",
             "|" + "|".join("---" if f == "" else "---:" for _, _, f in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(format(r[k], f) if r.get(k) is not None else "-" for k, _, f in columns) + " |")
    return "\n".join(lines)


def p2p_matrices(record: dict) -> str:
    """A p2p record as one W x W Markdown matrix per op (row: the rank that issues; column: the peer)."""
    w = record["meta"]["world_size"]
    out = []
    for op in dict.fromkeys(r["op"] for r in record["rows"]):
        cells = {(r["rank"], r["peer"]): r for r in record["rows"] if r["op"] == op}
        unit = "GB/s" if "gbps" in next(iter(cells.values())) else "Mops/s"
        lines = [f"| {op} ({unit}) | " + " | ".join(f"peer {p}" for p in range(w)) + " |",
                 "|---|" + "---:|" * w]
        for rank in range(w):
            vals = [cells.get((rank, p)) for p in range(w)]
            lines.append(f"| rank {rank} | " + " | ".join(
                "-" if v is None else f"{v['value']:.4g}" + ("" if v["correct"] else " (wrong data)") for v in vals)
                + " |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def summarize(record: dict, source: str = "") -> str:
    """One results record as Markdown: what ran where and when, then its table.

    Args:
        record: a results record (validated).
        source: the JSON file's path, named in the text.

    Returns:
        Markdown text.
    """
    harness.validate(record)
    m = record["meta"]
    rows = [dict(r, size=arguments.human_bytes(r["bytes"]) if "bytes" in r else None) for r in record["rows"]]
    for r in rows:
        if r.get("trident_gbps") and r.get("copy_engine_gbps"):
            r["of_copy_engine"] = r["trident_gbps"] / r["copy_engine_gbps"]
    where = (f"Command: `{m['command']}`; {m['gpus']} GPU(s), driver {m.get('driver')}, torch {m['torch']}, "
             f"Triton {m['triton']}, trident {m['trident']}, {m['date']}.")
    text = [f"### {record['benchmark']}: {m['world_size']} rank(s), {m['gpu']}", "",
            where + (f" Raw data: `{source}`." if source else "")]
    if record["note"]:
        text += ["", f"**Note: {record['note']}.**"]
    if record["benchmark"] == "p2p":
        text += ["", p2p_matrices(record)]
    elif record["benchmark"] in COLUMNS:
        text += ["", markdown_table(rows, COLUMNS[record["benchmark"]])]
    return "\n".join(text) + "\n"


def main(argv=None) -> int:
    """Print the Markdown summary of every results record under the given folder(s)."""
    folders = (argv if argv is not None else sys.argv[1:]) or ["results"]
    found = 0
    for folder in folders:
        for root, _, files in sorted(os.walk(folder)):
            for name in sorted(files):
                if not name.endswith(".json"):
                    continue
                path = os.path.join(root, name)
                try:
                    with open(path) as f:
                        record = json.load(f)
                    if record.get("schema") != harness.SCHEMA:
                        continue
                    print(summarize(record, path))
                    found += 1
                except (OSError, ValueError) as exc:
                    print(f"<!-- {path}: not a results record ({exc}) -->\n")
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
