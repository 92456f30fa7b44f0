"""Noticing ranks that are gone, so nobody waits for them until a timeout.

trident's ranks share one machine (CUDA IPC and the simulator's shared memory both need that),
so whether a peer is still there is a question the operating system answers exactly: is its
process alive? A thread per context asks every ``interval`` seconds. Unlike heartbeats, this
cannot mistake a busy rank (one compiling a kernel for a minute, say) for a dead one.

When a peer's process has exited, the watchdog records why and calls ``on_gone`` once: the
context then aborts its device waits (they end with a fault naming the lost rank) and its
host waits raise at once, naming it too.
"""

from __future__ import annotations

import os
import socket
import threading

_PF_EXITING = 0x4  # the kernel's task flag for a process that has begun to exit (see proc(5), /proc/pid/stat)


def process_state(pid: int) -> str | None:
    """None while ``pid`` runs; otherwise a short description of what became of it.

    A process counts as gone from the moment it begins to exit: a process with a GPU context can
    spend seconds in the driver's teardown (longer while other processes' kernels hold the GPU).
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"process {pid} exited"
    except PermissionError:
        return None  # it exists, owned by someone else
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, tty, tpgid, flags, ...
        state, flags = fields[0], int(fields[6])
    except (OSError, IndexError, ValueError):
        return None
    if state in ("Z", "X"):
        return f"process {pid} exited (a zombie, not yet reaped)"
    if flags & _PF_EXITING:  # tearing down: a GPU process can take long over it, but it is gone for us
        return f"process {pid} is exiting"
    return None


def identity() -> tuple[str, int]:
    """What a rank publishes so that peers can watch it: its host name and process id."""
    return socket.gethostname(), os.getpid()


class RankWatchdog:
    """Watches the processes of the other ranks on this host.

    Args:
        rank: this rank.
        identities: ``(host, pid)`` of every rank, from :func:`identity`.
        interval: seconds between looks.
        on_gone: called (from the watchdog thread) as ``on_gone(rank, why)`` for each lost rank.

    Example::

        dog = RankWatchdog(0, [identity(), peer_identity], 0.5, lambda r, why: print(r, why))
        dog.start()
        ...
        dog.stop()
    """

    def __init__(self, rank: int, identities: list[tuple[str, int]], interval: float, on_gone):
        host = socket.gethostname()
        self.rank = rank
        self.interval = interval
        self._pids = {r: pid for r, (h, pid) in enumerate(identities) if r != rank and h == host}
        self._on_gone = on_gone
        self._gone: dict[int, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"trident-watchdog-rank{rank}", daemon=True)

    @property
    def gone(self) -> dict[int, str]:
        """``{rank: why}`` for every peer seen gone so far."""
        with self._lock:
            return dict(self._gone)

    def start(self) -> None:
        """Start watching (a daemon thread)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; waits briefly for the thread to end."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * self.interval + 1)

    def look(self) -> dict[int, str]:
        """Check every peer now; report the newly lost ones. Returns :attr:`gone`.

        Every peer is checked before any is reported, so a report of this look already lists all
        the ranks it found gone: ranks often go together (one dies, a peer that waited on it fails
        and exits), and a rank reported alone could be the later one."""
        lost = {}
        for peer, pid in self._pids.items():
            if peer not in self._gone:
                why = process_state(pid)
                if why is not None:
                    lost[peer] = why
        with self._lock:
            self._gone.update(lost)
        for peer, why in lost.items():
            self._on_gone(peer, why)
        return self.gone

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.look()
