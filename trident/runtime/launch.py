"""Starting one process per rank: :func:`spawn` for tests and notebooks.

The command-line launcher (``trident run``) lives in ``trident.cli``; both set the variables
torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so
the same script runs under torchrun, ``trident run`` and :func:`spawn`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import time
import traceback

from ..errors import TridentError
from .rendezvous import free_port


class SpawnError(TridentError):
    """A rank started by :func:`spawn` raised or died; the message holds its traceback."""


def rank_environment(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The torchrun-style variables for one rank of a job on this machine."""
    return {
        "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    }


def _child(rank: int, world_size: int, port: int, payload: bytes, results) -> None:
    os.environ.update(rank_environment(rank, world_size, port))
    try:
        import trident  # noqa: F401  (before the user's module: sets TRITON_INTERPRET for the simulator)

        fn, args = pickle.loads(payload)
        results.put((rank, True, fn(rank, *args)))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        raise SystemExit(1) from None


def spawn(fn, world_size: int, args: tuple = (), *, timeout: float | None = None) -> list:
    """Run ``fn(rank, *args)`` in ``world_size`` new processes, one per rank; return their results.

    ``fn`` must be picklable (defined at module top level) and typically calls
    ``trident.init()``, which finds the job through the environment this sets.

    Args:
        fn: the function each rank runs.
        world_size: number of processes.
        args: extra positional arguments for ``fn``.
        timeout: seconds before the remaining ranks are killed (None: no limit).

    Returns:
        ``[fn's return value on rank 0, on rank 1, ...]``.

    Raises:
        SpawnError: a rank raised or died; the other ranks are stopped.

    Example::

        def work(rank):
            with trident.init(heap_size=1 << 24) as ctx:
                return ctx.world_size

        assert trident.spawn(work, 4) == [4, 4, 4, 4]
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    method = mp.get_context("spawn")
    results = method.Queue()
    payload = pickle.dumps((fn, tuple(args)))
    port = free_port()
    procs = [method.Process(target=_child, args=(r, world_size, port, payload, results), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    outputs: dict[int, object] = {}
    try:
        while len(outputs) < world_size:
            try:
                rank, ok, value = results.get(timeout=0.2)
            except Exception:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in outputs]
                if dead:
                    raise SpawnError(f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode} "
                                     f"before returning") from None
                if deadline is not None and time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(outputs))
                    raise SpawnError(f"timed out after {timeout} s waiting for ranks {missing}") from None
                continue
            if not ok:
                raise SpawnError(f"rank {rank} raised:\n{value}")
            outputs[rank] = value
    finally:
        finished = len(outputs) == world_size
        for p in procs:
            if finished:
                p.join(timeout=30)  # let each rank close its context and exit cleanly
            if p.is_alive():
                p.terminate()
                p.join()
    return [outputs[r] for r in range(world_size)]
