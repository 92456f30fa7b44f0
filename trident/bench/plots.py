"""PNG plots for the benchmarks (matplotlib, imported only when a plot is drawn).

Every function takes a results record (see :mod:`trident.bench.harness`) and a path, and
returns the path written, or ``None`` when matplotlib is not installed. Figures of runs that are
not performance figures say so in their title.
"""

from __future__ import annotations

import sys


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib, or trident[bench]): no plot", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(record: dict, what: str) -> str:
    m = record["meta"]
    text = f"{what}\n{m['gpu']}, {m['world_size']} rank(s), {m['date']}"
    if not record.get("performance_figure", False):
        text += "\n(ranks share a GPU or simulator: correctness/harness run, not link bandwidth)"
    return text


def _save(plt, fig, path: str, record: dict, what: str) -> str:
    """Title the figure (what, GPU, date, and whether it is a performance figure), write the PNG, close it."""
    fig.suptitle(_title(record, what), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def heatmaps(record: dict, path: str, ops: list[str], value: str, unit_of) -> str | None:
    """One W x W heatmap per op: row = rank that issues, column = peer it targets.

    Args:
        record: a p2p record; rows have ``op``, ``rank``, ``peer`` and ``value``.
        path: the PNG to write.
        ops: the ops, one panel each.
        value: the row key to draw.
        unit_of: ``op -> unit label`` (GB/s for memory ops, Mops/s for atomics).
    """
    plt = _pyplot()
    if plt is None:
        return None
    import numpy as np

    w = record["meta"]["world_size"]
    cols = min(len(ops), 4)
    fig, axes = plt.subplots((len(ops) + cols - 1) // cols, cols, figsize=(3.6 * cols, 3.3 * ((len(ops) + cols - 1)
                             // cols) + 0.8), squeeze=False)
    for ax in axes.flat[len(ops):]:
        ax.axis("off")
    for ax, op in zip(axes.flat, ops, strict=False):
        grid = np.full((w, w), np.nan)
        for r in record["rows"]:
            if r["op"] == op:
                grid[r["rank"], r["peer"]] = r[value]
        im = ax.imshow(grid, cmap="viridis")
        for i in range(w):
            for j in range(w):
                if not np.isnan(grid[i, j]):
                    middle = (np.nanmax(grid) + np.nanmin(grid)) / 2  # viridis is dark below it
                    ax.text(j, i, f"{grid[i, j]:.3g}", ha="center", va="center", fontsize=8,
                            color="white" if grid[i, j] < middle else "black")
        ax.set_title(f"{op} ({unit_of(op)})", fontsize=9)
        ax.set_xlabel("peer")
        ax.set_ylabel("rank")
        ax.set_xticks(range(w))
        ax.set_yticks(range(w))
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return _save(plt, fig, path, record, "trident p2p: rank -> peer")


def curves(record: dict, path: str, x: str, series: dict[str, str], ylabel: str, what: str,
           fractions: dict[str, tuple[str, str]] | None = None) -> str | None:
    """Lines of ``rows[series key]`` against ``rows[x]`` (log x), plus a panel of ratios.

    Args:
        record: a record whose rows have ``x`` and the series keys (missing or None: not drawn).
        path: the PNG to write.
        x: the x key (bytes).
        series: ``{row key: legend label}``.
        ylabel: the left panel's axis label.
        what: the title's first line.
        fractions: ``{label: (numerator key, denominator key)}`` drawn in a second panel.
    """
    plt = _pyplot()
    if plt is None:
        return None
    rows = record["rows"]
    panels = 2 if fractions else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.2), squeeze=False)
    ax = axes[0, 0]
    for key, label in series.items():
        pts = [(r[x], r[key]) for r in rows if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", ms=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # small and large buffers differ by orders of magnitude
    ax.set_xlabel("buffer size per rank (bytes)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if fractions:
        ax2 = axes[0, 1]
        for label, (num, den) in fractions.items():
            pts = [(r[x], r[num] / r[den]) for r in rows if r.get(num) and r.get(den)]
            if pts:
                ax2.plot(*zip(*pts, strict=True), marker="o", ms=3, label=label)
        ax2.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax2.set_xscale("log", base=2)
        ax2.set_xlabel("buffer size per rank (bytes)")
        ax2.set_ylabel("trident / reference")
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=8)
    return _save(plt, fig, path, record, what)


def bars(record: dict, path: str, group: str, category: str, value: str, ylabel: str, what: str) -> str | None:
    """Grouped bars: one group per ``rows[group]`` value, one bar per ``rows[category]`` inside it."""
    plt = _pyplot()
    if plt is None:
        return None
    rows = record["rows"]
    groups = list(dict.fromkeys(r[group] for r in rows))
    cats = list(dict.fromkeys(r[category] for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(groups) * len(cats) / 2), 4))
    width = 0.8 / max(len(cats), 1)
    for i, cat in enumerate(cats):
        vals = [next((r[value] for r in rows if r[group] == g and r[category] == cat), 0) or 0 for g in groups]
        ax.bar([j + i * width for j in range(len(groups))], vals, width, label=str(cat))
    ax.set_xticks([j + width * (len(cats) - 1) / 2 for j in range(len(groups))], [str(g) for g in groups],
                  rotation=15)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8, loc="lower right")
    return _save(plt, fig, path, record, what)


def loglog(record: dict, path: str, panel: str, line: str, x: str, y: str, xlabel: str, ylabel: str,
           what: str) -> str | None:
    """One log-log panel per ``rows[panel]`` value, one line per ``rows[line]`` value (ccl: time vs bytes)."""
    plt = _pyplot()
    if plt is None:
        return None
    rows = record["rows"]
    panels = sorted({r[panel] for r in rows})
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(4 * max(len(panels), 1), 3.8), squeeze=False)
    for ax, name in zip(axes[0], panels, strict=False):
        for label in sorted({r[line] for r in rows if r[panel] == name}):
            pts = [(r[x], r[y]) for r in rows if r[panel] == name and r[line] == label]
            ax.loglog(*zip(*pts, strict=True), marker="o", ms=3, label=label)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    return _save(plt, fig, path, record, what)


def breakdown(record: dict, path: str, what: str) -> str | None:
    """Stacked bars per shape and pattern (rows with ``gemm_ms`` and ``exposed_comm_ms``): the GEMM
    alone, and the time on top of it (exposed communication). Returns the PNG path, or None without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return None
    rows = [r for r in record["rows"] if r["pattern"] != "gemm"]
    labels = [f"{r['shape']}\n{r['pattern']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(rows)), 4.5))
    x = range(len(rows))
    ax.bar(x, [min(r["gemm_ms"], r["time_ms"]) for r in rows], label="GEMM alone")
    ax.bar(x, [r["exposed_comm_ms"] for r in rows], bottom=[min(r["gemm_ms"], r["time_ms"]) for r in rows],
           label="on top of the GEMM (exposed communication)")
    ax.set_xticks(list(x), labels, rotation=60, fontsize=7)
    ax.set_ylabel("time (ms)")
    ax.legend(fontsize=8)
    return _save(plt, fig, path, record, what)
