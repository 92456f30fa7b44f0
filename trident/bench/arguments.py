"""The command-line arguments every ``trident bench`` benchmark shares, and byte sizes.

``--out``/``--warmup``/``--repeats``/``--no-progress`` (:func:`add_common_args`), a message-size
sweep's ``--min-bytes``/``--max-bytes``/``--dtype`` (:func:`message_size_args`), the simulator's
shrunken run (:func:`simulator_sizes`), and ``"4K"``-style sizes both ways.
"""

from __future__ import annotations

import argparse


def add_common_args(parser: argparse.ArgumentParser, name: str, warmup: int = 3, repeats: int = 10) -> None:
    """Add ``--out``, ``--warmup``, ``--repeats`` and ``--no-progress`` to a benchmark's parser.

    Example::

        parser = argparse.ArgumentParser(prog="trident bench p2p")
        add_common_args(parser, "p2p")
    """
    parser.add_argument("--out", default=f"results/{name}", help="folder for the JSON and PNG files")
    parser.add_argument("--warmup", type=int, default=warmup, help="untimed calls before measuring")
    parser.add_argument("--repeats", type=int, default=repeats, help="timed calls; the median is reported")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def message_size_args(prog: str, description: str | None, name: str, max_bytes: int, warmup: int, repeats: int):
    """The ``parse_args(argv=None)`` of a benchmark that sweeps the message size of one collective call:
    ``--min-bytes`` (default 1K) and ``--max-bytes``, ``--dtype`` (default bfloat16) and
    :func:`add_common_args`'s.

    Example::

        parse_args = message_size_args("trident bench ccl", __doc__, "ccl", 1 << 30, warmup=5, repeats=20)
        args = parse_args(["--max-bytes", "1M"])
    """
    def parse_args(argv=None) -> argparse.Namespace:
        parser = argparse.ArgumentParser(prog=prog, description=description)
        add_size_range_args(parser, 1 << 10, max_bytes, what="message")
        parser.add_argument("--dtype", default="bfloat16")
        add_common_args(parser, name, warmup=warmup, repeats=repeats)
        return parser.parse_args(argv)
    return parse_args


def add_size_range_args(parser: argparse.ArgumentParser, min_bytes: int, max_bytes: int, what: str = "size") -> None:
    """Add ``--min-bytes`` and ``--max-bytes`` (``4K``, ``1M``, ``2G`` accepted) to a benchmark's parser.

    Example::

        add_size_range_args(parser, 1 << 10, 1 << 30, what="message")
    """
    parser.add_argument("--min-bytes", type=parse_bytes, default=min_bytes,
                        help=f"smallest {what} (default {human_bytes(min_bytes)})")
    parser.add_argument("--max-bytes", type=parse_bytes, default=max_bytes,
                        help=f"largest {what} (default {human_bytes(max_bytes)})")


def cap_size_range(args, max_bytes: int) -> None:
    """Lower ``args.max_bytes`` to at most ``max_bytes`` (a simulator run), and ``args.min_bytes`` with it:
    ``cap_size_range(args, 16 << 10)`` makes ``--min-bytes 64K --max-bytes 1G`` 16K..16K."""
    args.max_bytes = min(args.max_bytes, max_bytes)
    args.min_bytes = min(args.min_bytes, args.max_bytes)


def simulator_sizes(max_bytes: int, warmup: int, repeats: int):
    """A message-size benchmark's ``sim_sizes``: the simulator checks the benchmark, not the speed, so
    its sweep stops at ``max_bytes`` and it makes ``warmup`` + ``repeats`` calls per size.

    Example::

        sim_sizes = simulator_sizes(1 << 14, warmup=1, repeats=2)
    """
    def sim_sizes(args) -> None:
        cap_size_range(args, max_bytes)
        args.warmup, args.repeats = warmup, repeats
    return sim_sizes


def size_sweep(lo: int, hi: int, factor: int = 2) -> list[int]:
    """``lo, lo*factor, ...`` up to ``hi`` (both ends included when ``hi`` is on the grid)."""
    if lo < 1 or hi < lo or factor < 2:
        raise ValueError(f"bad size range {lo}..{hi} (factor {factor})")
    out, size = [], lo
    while size <= hi:
        out.append(size)
        size *= factor
    return out


def parse_bytes(text: str) -> int:
    """``"4K"``, ``"64MiB"``, ``"2G"``, ``"1048576"`` -> bytes (powers of 1024)."""
    t = str(text).strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if t and t[-1] in scale:
        return int(float(t[:-1]) * scale[t[-1]])
    return int(t)


def human_bytes(n: float) -> str:
    """``4096 -> "4 KiB"``, ``1 << 31 -> "2 GiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:g} {unit}" if unit == "B" else f"{n:.4g} {unit}"
        n /= 1024
    return str(n)
