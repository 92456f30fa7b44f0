"""Testing multi-rank code: a pool of rank processes that stays up between tests.

Starting processes and importing torch costs seconds per rank, far more than a small test,
so a :class:`RankPool` starts ``world_size`` processes once, gives each an open
:class:`trident.Context`, and then runs any picklable function ``fn(ctx, *args)`` on every
rank, returning the per-rank results. After each task the heap allocations the task made are
released and device faults cleared, so tasks do not see each other's leftovers. A task that
fails on any rank (or leaves the ranks' heaps out of step) gets the pool restarted, since the
other ranks may be stuck waiting for the failed one.

Example (pytest)::

    def _body(ctx, n):
        x = ctx.full((n,), ctx.rank)
        ctx.barrier()
        return ctx.peer_view(x, (ctx.rank + 1) % ctx.world_size).tolist()

    def test_neighbour(pool):
        results = pool.run(_body, 4)
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import time
import traceback
import warnings

from .errors import TridentError
from .runtime.processes import free_port, rank_environment


class RankFailure(TridentError):
    """A task failed on one or more ranks; the message holds every failing rank's traceback."""


def refusals(calls: dict) -> dict:
    """Run each zero-argument callable; map its name to the message it was refused with, or
    ``"accepted"`` when it ran. Catches ``ValueError``, ``TypeError`` and trident's errors only,
    so anything else (a crash) still fails the test.

    Example::

        messages = refusals({"dtype": lambda: trident.ccl.all_reduce(ctx, ctx.zeros(4, dtype=torch.bool))})
        assert "does not support dtype" in messages["dtype"]
    """
    messages = {}
    for name, call in calls.items():
        try:
            call()
            messages[name] = "accepted"
        except (ValueError, TypeError, TridentError) as exc:
            messages[name] = str(exc)
    return messages


def _forget_faults(ctx) -> None:
    """Clear the faults and the abort a task left behind, so the next task starts clean."""
    try:
        ctx.check()
    except TridentError:
        pass
    try:
        ctx.clear_abort()
    except TridentError:
        pass


def _worker(rank: int, world_size: int, port: int, init_kwargs: dict, conn) -> None:
    os.environ.update(rank_environment(rank, world_size, port))
    try:
        import trident

        ctx = trident.init(**init_kwargs)
    except BaseException:
        conn.send((False, traceback.format_exc(), ""))
        return
    conn.send((True, None, ctx.heap_digest))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            break
        if message is None:
            break
        # What the task allocates (its tensors, the collectives' workspace) goes back when it ends.
        with ctx.heap_scope():
            try:
                fn, args = pickle.loads(message)
                reply = (True, fn(ctx, *args))
            except BaseException:
                reply = (False, traceback.format_exc())
        _forget_faults(ctx)
        try:
            conn.send((*reply, ctx.heap_digest))
        except Exception:  # an unpicklable result
            conn.send((False, traceback.format_exc(), ctx.heap_digest))
    ctx.close()


#: How many times :class:`RankPool` starts its ranks when CUDA refuses one a context.
START_ATTEMPTS = 4
#: Seconds before the next start, times the attempt's number.
REFUSED_PAUSE_S = 3.0


def refused_only(failure: str) -> bool:
    """Whether a start-up failure report shows CUDA refusing a context to some rank, and nothing
    worse: the other ranks either failed the same way or timed out waiting for those."""
    reports = failure.split("--- rank ")[1:]
    refused = [r for r in reports if "ContextRefusedError" in r]
    return bool(refused) and all(r in refused or "RankTimeoutError" in r for r in reports)


class RankPool:
    """``world_size`` rank processes with open contexts, reused across tasks.

    Args:
        world_size: number of ranks.
        env: extra environment variables for the ranks (e.g. ``{"TRIDENT_DEBUG": "1"}``); they are
            set before the ranks import trident.
        nodes: split the ranks into this many logical nodes (``TRIDENT_NODES``): contiguous blocks
            that do not map each other's heaps, as on separate hosts.
        **init_kwargs: passed to :func:`trident.init` (heap_size, wait_timeout, timeout, ...).
    """

    def __init__(self, world_size: int, env: dict | None = None, nodes: int = 1, **init_kwargs):
        self.world_size = world_size
        self.env = {**({"TRIDENT_NODES": str(nodes)} if nodes > 1 else {}), **(env or {})}
        self.init_kwargs = init_kwargs
        self._procs: list = []
        self._conns: list = []

    def _start(self, timeout: float) -> None:
        """Start the ranks; start them all again, after a pause, when CUDA refused one a context
        (:class:`~trident.errors.ContextRefusedError`: an MPS daemon full of clients, for example
        while another job's ranks are exiting), at most :data:`START_ATTEMPTS` times in all."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return self._start_once(timeout)
            except RankFailure as exc:
                if attempt == START_ATTEMPTS or not refused_only(str(exc)):
                    raise
            pause = REFUSED_PAUSE_S * attempt
            # Said out loud, so a run's log shows when its pools needed a second start.
            warnings.warn(f"RankPool({self.world_size}): CUDA refused a rank a context (an MPS daemon at its "
                          f"client limit?); starting every rank again in {pause:.0f} s "
                          f"(attempt {attempt + 1} of {START_ATTEMPTS})", RuntimeWarning, stacklevel=2)
            time.sleep(pause)

    def _start_once(self, timeout: float) -> None:
        method = mp.get_context("spawn")
        port = free_port()
        # The children import trident while unpickling their target, before any code of ours runs
        # there, so variables read at import (TRIDENT_DEBUG, TRIDENT_BACKEND) must be inherited.
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            for rank in range(self.world_size):
                parent, child = method.Pipe()
                proc = method.Process(target=_worker, daemon=True,
                                      args=(rank, self.world_size, port, self.init_kwargs, child))
                proc.start()
                child.close()
                self._procs.append(proc)
                self._conns.append(parent)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        self._collect(timeout, "start-up")

    def _collect(self, timeout: float, what: str) -> list:
        failures: list[str]
        results, failures, digests = [None] * self.world_size, [], set()
        start = time.monotonic()
        deadline = start + timeout
        for rank, conn in enumerate(self._conns):
            if not conn.poll(max(deadline - time.monotonic(), 0.0)):
                self.close(force=True)
                late = "" if not failures else f" (other ranks had failed: {len(failures)} of them)"
                raise RankFailure(f"rank {rank} did not finish {what} within {time.monotonic() - start:.3g} s{late}")
            try:
                ok, value, digest = conn.recv()
            except EOFError:
                self.close(force=True)
                raise RankFailure(f"rank {rank} died during {what}") from None
            digests.add(digest)
            if ok:
                results[rank] = value
            else:
                failures.append(f"--- rank {rank} ---\n{value}")
                deadline = min(deadline, time.monotonic() + 5.0)  # the others may be stuck waiting for this one
        if failures or len(digests) > 1:
            self.close(force=True)
        if failures:
            raise RankFailure(f"{what} failed on {len(failures)} rank(s):\n" + "\n".join(failures))
        return results

    def run(self, fn, *args, timeout: float = 300.0) -> list:
        """Run ``fn(ctx, *args)`` on every rank; return ``[result of rank 0, rank 1, ...]``.

        Raises:
            RankFailure: ``fn`` raised on some rank, a rank died, or the task outran ``timeout``.
        """
        if not self._procs:
            self._start(timeout)
        payload = pickle.dumps((fn, args))
        for conn in self._conns:
            conn.send(payload)
        return self._collect(timeout, f"{getattr(fn, '__name__', 'task')}")

    def ask_to_close(self) -> None:
        """Ask the ranks to close their contexts and exit, without waiting (:meth:`close` waits): to
        close several pools, ask each first, so that they close side by side."""
        for conn in self._conns:
            try:
                conn.send(None)
            except Exception:
                pass
        self._conns = []

    def close(self, force: bool = False) -> None:
        """Stop the rank processes: ask them to close their contexts, or kill them (``force``)."""
        self.ask_to_close()
        for proc in self._procs:
            proc.join(timeout=0 if force else 10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._procs = []
