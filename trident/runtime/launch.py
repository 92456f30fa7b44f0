"""Starting one process per rank: :func:`spawn` for tests and notebooks.

The command-line launcher (``trident run``) lives in :mod:`trident.runtime.launcher`; both set the variables
torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so
the same script runs under torchrun, ``trident run`` and :func:`spawn`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import time
import traceback

from ..errors import TridentError
from . import pickling
from .processes import describe_exit, free_port, rank_environment


class SpawnError(TridentError):
    """A rank started by :func:`spawn` failed: it raised (the message holds its traceback), died,
    exited without a result, or returned one that cannot be pickled; the message names the rank."""


def _child(rank: int, world_size: int, port: int, payload: bytes, results) -> None:
    """One rank of :func:`spawn`: puts ``(rank, True, pickled result)`` or ``(rank, False, why)``."""
    os.environ.update(rank_environment(rank, world_size, port))
    try:
        import trident  # noqa: F401  (before the user's module: sets TRITON_INTERPRET for the simulator)

        fn, args = pickle.loads(payload)
        value = fn(rank, *args)
    except BaseException:
        results.put((rank, False, f"rank {rank} raised:\n{traceback.format_exc()}"))
        raise SystemExit(1) from None
    try:
        # Pickled here, not by the queue: the queue pickles in a background thread, where a failure
        # is printed and the result dropped, and the parent waits forever. Not torch's multiprocessing
        # pickler either: it sends a tensor as a handle to this process's shared memory, gone once this
        # rank exits; pickling.dumps sends every tensor by value, as a CPU copy of its own elements.
        data = pickling.dumps(value)
    except Exception as exc:
        results.put((rank, False, f"rank {rank} returned an object that cannot be pickled: "
                                  f"{type(value).__name__} ({type(exc).__name__}: {exc}); return plain "
                                  f"data (tensors, numbers, lists, dicts; not the context)"))
        raise SystemExit(1) from None
    results.put((rank, True, data))


def _take(outputs: dict, rank: int, ok: bool, value) -> None:
    """Record one rank's message from :func:`_child`; a failure raises :class:`SpawnError`."""
    if not ok:
        raise SpawnError(value)
    try:
        outputs[rank] = pickle.loads(value)
    except Exception as exc:
        raise SpawnError(f"rank {rank} returned an object that cannot be unpickled here: "
                         f"{type(exc).__name__}: {exc}") from None


def _check_exits(procs: list, outputs: dict, results) -> None:
    """Raise :class:`SpawnError` for a rank that exited without a result, whatever its exit code."""
    for rank, proc in enumerate(procs):
        if proc.exitcode is None or rank in outputs:
            continue
        # A rank's message is in the pipe before it exits (its queue's thread is joined at exit),
        # so anything left there now was sent: read it before blaming the rank.
        while True:
            try:
                _take(outputs, *results.get(timeout=0.05))
            except queue.Empty:
                break
        if rank not in outputs:
            raise SpawnError(f"rank {rank} {describe_exit(proc.exitcode)} without returning a result")


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
        ``[fn's return value on rank 0, on rank 1, ...]``. Tensors in them come back by value as CPU
        tensors holding only their own elements: a GPU tensor or a heap tensor arrives as a CPU copy
        (so returning a heap tensor is safe even after ``ctx.close()``).

    Raises:
        SpawnError: a rank raised, died, exited without returning (``os._exit``), returned
            something that cannot be pickled (the context, a lock: return plain data), or
            ``timeout`` passed; the message names the rank and what happened, and the other ranks
            are stopped.

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
            except queue.Empty:
                _check_exits(procs, outputs, results)
                if deadline is not None and time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(outputs))
                    raise SpawnError(f"timed out after {timeout} s waiting for ranks {missing}") from None
                continue
            _take(outputs, rank, ok, value)
    finally:
        finished = len(outputs) == world_size
        for p in procs:
            if finished:
                p.join(timeout=30)  # let each rank close its context and exit cleanly
            if p.is_alive():
                p.terminate()
                p.join()
    return [outputs[r] for r in range(world_size)]
