"""PNG plots for the benchmarks (matplotlib, imported only when a plot is drawn).

Every function takes a results record (see :mod:`trident.bench.harness`) and a path, and
returns the path written, or ``None`` when matplotlib is not installed. Figures of runs that are
not performance figures say so in their title.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


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


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def bars(record: dict, path: str, group: str, category: str, value: str, ylabel: str, what: str,
         reference=None, ratio: str | None = None) -> str | None:
    """One panel per family (``rows[group]``), one labelled horizontal bar per ``rows[category]``
    inside it; the family's reference drawn as a dashed line, and each bar's ratio to it.

    Args:
        record: a record; its rows have ``group``, ``category`` and ``value`` (None: not drawn).
        path: the PNG to write.
        group: the row key whose values are the panels (families).
        category: the row key whose values label the bars.
        value: the row key drawn.
        ylabel: the value axis' label (with its unit).
        what: the title's first line.
        reference: the category value (or a ``row -> bool`` predicate) of each family's reference:
            drawn as a line, not a bar. A number: a line at that value in every panel (e.g. 1.0).
        ratio: how bars compare with the reference: ``"of"`` (value / reference, "0.33x"),
            ``"faster"`` (reference / value: times where lower is better) or None (no ratio).

    Example::

        plots.bars(record, "moe_128.png", "case", "series", "time_us", "time (us)", "MoE", reference="torch eager",
                   ratio="faster")
    """
    plt = _pyplot()
    if plt is None:
        return None
    rows = [r for r in record["rows"] if r.get(value) is not None]
    is_ref = reference if callable(reference) else (lambda r: reference is not None and r[category] == reference)
    families = list(dict.fromkeys(r[group] for r in rows))
    cols = 1 if len(families) <= 3 else 2
    heights = [0.32 * max(1, sum(1 for r in rows if r[group] == f and not is_ref(r))) + 0.9 for f in families]
    per_row = [max(heights[i:i + cols]) for i in range(0, len(families), cols)]
    fig, axes = plt.subplots(len(per_row), cols, figsize=(7.5 * cols, sum(per_row) + 1.2), squeeze=False,
                             gridspec_kw={"height_ratios": per_row})
    for ax in axes.flat[len(families):]:
        ax.axis("off")
    for ax, fam in zip(axes.flat, families, strict=False):
        mine = [r for r in rows if r[group] == fam and not is_ref(r)]
        ref_row = next((r for r in rows if r[group] == fam and is_ref(r)), None)
        ref = float(reference) if isinstance(reference, (int, float)) else (ref_row[value] if ref_row else None)
        labels, vals = [str(r[category]) for r in mine], [float(r[value]) for r in mine]
        fmt: Callable[[float], str]
        if isinstance(reference, (int, float)) and vals:  # values that are ratios: bars from the reference line
            assert ref is not None  # float(reference)
            lo, hi = min(vals + [ref]), max(vals + [ref])
            pad = (hi - lo) * 0.35 or 0.05
            ax.barh(range(len(mine)), [v - ref for v in vals], left=ref, height=0.6,
                    color=["tab:green" if v >= ref else "tab:orange" for v in vals])
            ax.set_xlim(lo - pad * 0.3, hi + pad)
            left, step, fmt = ref, (hi - lo + pad) * 0.01, "{:.3f}".format
        else:
            ax.barh(range(len(mine)), vals, color="tab:blue", height=0.6)
            top = max(vals + ([ref] if ref else []) + [0.0]) or 1.0
            ax.set_xlim(0, top * 1.45)  # room for the labels right of the bars
            left, step, fmt = 0.0, top * 0.01, _fmt
        ax.set_yticks(range(len(mine)), labels, fontsize=8)
        ax.invert_yaxis()
        for i, v in enumerate(vals):
            text = fmt(v)
            if ref and ratio and v:
                text += f"  ({ref / v:.3g}x faster)" if ratio == "faster" else f"  ({v / ref:.3g}x)"
            ax.text(max(v, left) + step, i, text, va="center", fontsize=7.5,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.8})
        if ref:
            name = "" if ref_row is None else f"{ref_row[category]}: "
            ax.axvline(ref, color="tab:red", ls="--", lw=1.2)
            ax.text(ref, -0.55, f" {name}{_fmt(ref)}", color="tab:red", fontsize=7.5, va="bottom", ha="left")
        ax.set_title(str(fam), fontsize=9, loc="left")
        ax.set_xlabel(ylabel, fontsize=8)
        ax.tick_params(axis="x", labelsize=7.5)
        ax.grid(axis="x", alpha=0.3)
    return _save(plt, fig, path, record, what)


def loglog(record: dict, path: str, panel: str, line: str, x: str, y: str, xlabel: str, ylabel: str,
           what: str, reference: str | None = None) -> str | None:
    """One log-log panel per ``rows[panel]`` value, one line per ``rows[line]`` value (ccl: time vs bytes).

    With ``reference`` (a ``rows[line]`` value, e.g. ``"nccl"``) present in the rows, a second row of
    panels shows each other line's speedup over it (reference y / y at the same x; above 1 is faster),
    the ratio being what such a comparison is about.
    """
    plt = _pyplot()
    if plt is None:
        return None
    rows = record["rows"]
    panels = sorted({r[panel] for r in rows})
    ratios = reference is not None and any(r[line] == reference for r in rows)
    n = max(len(panels), 1)
    fig, axes = plt.subplots(2 if ratios else 1, n, figsize=(4.2 * n, 6.6 if ratios else 3.8), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 2]} if ratios else None)
    for col, name in enumerate(panels):
        ax = axes[0, col]
        for label in sorted({r[line] for r in rows if r[panel] == name}):
            pts = sorted((r[x], r[y]) for r in rows if r[panel] == name and r[line] == label and r.get(y))
            if pts:
                ax.loglog(*zip(*pts, strict=True), marker="o", ms=3, label=label,
                          **({"color": "tab:red", "ls": "--"} if label == reference else {}))
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper left")
        if ratios:
            ref = {r[x]: r[y] for r in rows if r[panel] == name and r[line] == reference and r.get(y)}
            axr = axes[1, col]
            for label in sorted({r[line] for r in rows if r[panel] == name} - {reference}):
                pts = sorted((r[x], ref[r[x]] / r[y]) for r in rows
                             if r[panel] == name and r[line] == label and r.get(y) and r[x] in ref)
                if pts:
                    axr.plot(*zip(*pts, strict=True), marker="o", ms=3, label=label)
            axr.axhline(1.0, color="tab:red", ls="--", lw=1)
            axr.set_xscale("log")
            axr.set_xlabel(xlabel)
            axr.set_ylabel(f"speedup over {reference}")
            axr.grid(alpha=0.3)
            axr.legend(fontsize=7)
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
