"""Exporting trace events: Chrome/Perfetto trace JSON and a PNG timeline.

The timeline needs matplotlib, an optional dependency (the ``bench`` extra): it is imported only
when a timeline is drawn, so tracing and the JSON export work without it.
"""

from __future__ import annotations

import json

from .device import KIND_NAMES

#: Timeline colours per event kind (compute blue, communication orange, waiting grey).
COLOURS = {"compute": "#1f77b4", "comm": "#ff7f0e", "wait": "#9a9a9a"}


def _origin(events) -> int:
    return min((e.t_start for e in events), default=0)


def chrome_trace(events, title: str | None = None) -> dict:
    """The events as a Chrome trace document (opens in ui.perfetto.dev and chrome://tracing).

    One process per rank (``pid`` = rank), one thread per program (``tid`` = program id), one
    complete event (``ph: "X"``) per record with category ``compute``, ``comm`` or ``wait``.
    Times are microseconds from the earliest event; ``args`` keep tile, peer and the raw
    nanosecond times. ``otherData`` holds the title and the dropped-event counts.

    Args:
        events: :class:`trident.trace.Events` (or any list of :class:`trident.trace.Event`).
        title: shown in ``otherData``.

    Returns:
        A JSON-serializable dict.

    Example::

        json.dump(chrome_trace(trace.gather()), open("trace.json", "w"))
    """
    t0 = _origin(events)
    out = []
    for rank in sorted({e.rank for e in events}):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for program in sorted({e.program for e in events if e.rank == rank}):
            out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": program,
                        "args": {"name": f"program {program}"}})
    for e in events:
        kind = KIND_NAMES.get(e.kind, f"kind {e.kind}")
        name = f"{kind} tile {e.tile}" + (f" -> rank {e.peer}" if kind != "compute" else "")
        out.append({"ph": "X", "name": name, "cat": kind, "pid": e.rank, "tid": e.program,
                    "ts": (e.t_start - t0) / 1e3, "dur": max(e.t_end - e.t_start, 0) / 1e3,
                    "args": {"tile": e.tile, "peer": e.peer, "t_start_ns": e.t_start, "t_end_ns": e.t_end}})
    dropped = getattr(events, "dropped_by_rank", {})
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "otherData": {"title": title or "trident trace", "dropped_events": sum(dropped.values()),
                          "dropped_by_rank": {str(r): n for r, n in dropped.items()}}}


def write_chrome(events, path: str, title: str | None = None) -> dict:
    """Write :func:`chrome_trace` of ``events`` to ``path``; returns the document."""
    doc = chrome_trace(events, title)
    with open(path, "w") as f:
        json.dump(doc, f)
    return doc


def _pyplot():
    """matplotlib's pyplot and ``Patch``, drawing into files (no display needed)."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("drawing a trace timeline needs matplotlib: pip install matplotlib "
                          "(or install trident with the bench extra: pip install 'trident[bench]')") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    return plt, Patch


def plot_timeline(events, path: str, title: str | None = None) -> str:
    """Draw ``events`` as a PNG timeline: one panel per rank, programs on y, time (us) on x.

    Args:
        events: :class:`trident.trace.Events`.
        path: the PNG to write.
        title: the figure title.

    Returns:
        ``path``.

    Raises:
        ImportError: when matplotlib is not installed (``pip install matplotlib``).

    Example::

        plot_timeline(trace.gather(), "timeline.png", title="GEMM + all-scatter, 4 ranks")
    """
    plt, Patch = _pyplot()
    ranks = sorted({e.rank for e in events}) or [0]
    t0 = _origin(events)
    rows = {r: sorted({e.program for e in events if e.rank == r}) or [0] for r in ranks}
    heights = [max(len(rows[r]), 1) for r in ranks]
    fig, axes = plt.subplots(len(ranks), 1, sharex=True, squeeze=False,
                             figsize=(10, min(2 + 0.18 * sum(heights) + 0.6 * len(ranks), 40)),
                             gridspec_kw={"height_ratios": heights})
    for ax, rank in zip(axes[:, 0], ranks, strict=True):
        index = {p: i for i, p in enumerate(rows[rank])}
        for kind in sorted({e.kind for e in events}):
            name = KIND_NAMES.get(kind, f"kind {kind}")
            mine = [e for e in events if e.rank == rank and e.kind == kind]
            for e in mine:  # broken_barh takes one row at a time
                ax.broken_barh([((e.t_start - t0) / 1e3, max(e.t_end - e.t_start, 1) / 1e3)],
                               (index[e.program] - 0.4, 0.8), facecolors=COLOURS.get(name, "#2ca02c"))
        ax.set_ylim(-0.6, len(rows[rank]) - 0.4)
        ax.set_ylabel(f"rank {rank}\nprogram")
        if len(rows[rank]) <= 16:
            ax.set_yticks(range(len(rows[rank])), [str(p) for p in rows[rank]], fontsize=7)
    axes[-1, 0].set_xlabel("time (us)")
    kinds = [KIND_NAMES.get(k, f"kind {k}") for k in sorted({e.kind for e in events})]
    axes[0, 0].legend(handles=[Patch(color=COLOURS.get(k, "#2ca02c"), label=k) for k in kinds],
                      loc="upper right", fontsize=7, ncol=len(kinds) or 1)
    dropped = getattr(events, "dropped", 0)
    fig.suptitle((title or "trident trace") + (f"  ({dropped} events dropped: buffer full)" if dropped else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
