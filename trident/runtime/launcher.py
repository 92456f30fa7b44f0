"""``trident run``'s engine: one process per rank on this machine, watched until the job ends.

:func:`run` starts the ranks with torchrun's variables (see :func:`~trident.runtime.processes.rank_environment`)
and then, until every rank has exited:

* **failures**: every rank is watched all the time (not in rank order). The first rank to exit
  with a non-zero code, or to be killed by a signal, is named on stderr (``trident run: rank 1
  exited with code 5`` / ``... was killed by SIGSEGV``); ranks still running ``grace`` seconds
  later get SIGTERM, and SIGKILL ``grace`` seconds after that. The job's exit code is that first
  failure's (128 + the signal's number for a signal, as a shell reports it).
* **signals**: each rank runs in its own session, so a Ctrl-C at the terminal reaches only the
  launcher. On SIGINT, SIGTERM or SIGHUP the launcher passes that one signal to each rank's
  process group, waits ``grace`` seconds, then SIGKILLs what is left (a second signal kills at
  once); it then exits with 128 + the signal's number. If the launcher itself is killed (SIGKILL),
  Linux sends every rank SIGTERM, so no rank is left behind.
* **output**: each rank's stdout is forwarded a whole line at a time (ranks never split each
  other's lines; a last line without a newline gets one); stderr is shared as is. Ranks run with
  ``PYTHONUNBUFFERED=1`` unless the environment sets it, so lines appear as they are printed and
  survive a hard death, and with ``TORCH_CPP_LOG_LEVEL=ERROR`` unless it is set (torch's C++
  warnings, such as a stack trace for every store call once rank 0 is gone, drown the real error).
  If our stdout is closed (``trident run ... | head``), the ranks' output is read and dropped, so
  they never block on a full pipe, and the launcher exits quietly.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
import time

from ..errors import BackendUnavailableError
from .mps import MpsDaemon
from .processes import describe_exit, free_port, rank_environment

#: Seconds between a failure (or a signal to the launcher) and stopping the ranks still running.
DEFAULT_GRACE = 10.0

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def shell_status(returncode: int) -> int:
    """A Popen return code as a shell reports it: a death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _say(message: str) -> None:
    try:
        print(f"trident run: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr is gone too: nothing left to tell
        pass


class _Stdout:
    """Our stdout, shared by the ranks' forwarders. Once its reader goes away (``| head``) the
    ranks' output is dropped: they must still be drained, or they block on a full pipe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.closed = False

    def write(self, data: bytes) -> None:
        with self.lock:
            if self.closed:
                return
            try:
                out = getattr(sys.stdout, "buffer", None)
                if out is not None:
                    out.write(data)
                else:
                    sys.stdout.write(data.decode(errors="replace"))
                sys.stdout.flush()
            except (OSError, ValueError):  # BrokenPipeError, a closed file, a hung-up terminal
                self.closed = True
                try:  # Python's own flush at exit would fail on the broken pipe and say so
                    devnull = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(devnull, sys.stdout.fileno())
                    os.close(devnull)
                except (OSError, ValueError, AttributeError):
                    pass


def _forward(pipe, stdout: _Stdout) -> None:
    """Copy one rank's stdout to ours a whole line at a time: ranks printing at once never split
    each other's lines (unbuffered Python writes a line's text and its newline separately)."""
    with pipe:
        for line in iter(pipe.readline, b""):
            if not line.endswith(b"\n"):  # the rank's last words: never glued to another rank's line
                line += b"\n"
            stdout.write(line)


def _die_with_launcher():
    """A ``preexec_fn`` (Linux): the rank gets SIGTERM if the launcher dies, even by SIGKILL."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    launcher = os.getpid()

    def setup():  # runs in the child between fork and exec: keep it to system calls
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != launcher:  # the launcher died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return setup


class _Job:
    """The ranks' processes and what the launcher has done to them so far."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []
        self.exits: queue.Queue = queue.Queue()  # (rank, returncode), in the order the ranks exit
        self.running: set[int] = set()
        self.asked: set[int] = set()  # ranks already sent their one polite signal
        self.stopping = False  # a rank failed or the launcher got a signal: the job is being stopped
        self.threads: list[threading.Thread] = []

    def start(self, nprocs: int, command: list[str], env: dict[str, str]) -> None:
        """Start the ranks, then their forwarders and reapers (if one fails to start, :meth:`finish`
        still stops those already running)."""
        stdout, port = _Stdout(), free_port()
        preexec = _die_with_launcher() if sys.platform.startswith("linux") else None
        for rank in range(nprocs):
            rank_env = {**env, **rank_environment(rank, nprocs, port)}
            # Own session: the terminal's Ctrl-C reaches only the launcher, which passes it on once.
            self.procs.append(subprocess.Popen(command, env=rank_env, stdout=subprocess.PIPE,
                                               start_new_session=True, preexec_fn=preexec))
            self.running.add(rank)
        # Threads only after the forks: preexec_fn runs Python in the child, which threads make unsafe.
        for rank, proc in enumerate(self.procs):
            self._thread(_forward, proc.stdout, stdout)
            self._thread(self._reap, rank, proc)

    def _thread(self, target, *args) -> None:
        self.threads.append(threading.Thread(target=target, args=args, daemon=True))
        self.threads[-1].start()

    def _reap(self, rank: int, proc: subprocess.Popen) -> None:
        # A thread per rank blocks in waitpid, so exits are queued in the order they happen.
        self.exits.put((rank, proc.wait()))

    def send(self, sig: int, ranks=None) -> list[int]:
        """Send ``sig`` to the process group of each running rank in ``ranks`` (default: all);
        return the ranks signalled."""
        sent = []
        for rank in sorted(self.running if ranks is None else set(ranks) & self.running):
            try:
                os.killpg(self.procs[rank].pid, sig)  # the group: the rank's own children too
                sent.append(rank)
            except (ProcessLookupError, PermissionError):  # exited since
                pass
        return sent

    def ask_to_stop(self, sig: int) -> list[int]:
        """The one polite signal to each running rank that has not had one yet."""
        sent = self.send(sig, self.running - self.asked)
        self.asked.update(sent)
        return sent

    def finish(self, grace: float) -> None:
        """Kill whatever still runs, reap it, and let the forwarders write the ranks' last lines.

        A job that was stopped (or whose launcher failed) also loses what the ranks left behind in
        their process groups, e.g. a rank's own child processes: nothing outlives ``trident run``.
        """
        if self.stopping or self.running:
            for proc in self.procs:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):  # the group is empty
                    pass
        for proc in self.procs:
            proc.wait()
        deadline = time.monotonic() + grace  # a rank's leftover child may hold its stdout open
        for thread in self.threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def run(nprocs: int, command: list[str], grace: float = DEFAULT_GRACE, env: dict[str, str] | None = None,
        mps: bool = False) -> int:
    """Start ``command`` once per rank and watch the ranks until all have exited; return the job's exit code.

    Args:
        nprocs: number of ranks.
        command: what each rank runs, e.g. ``[sys.executable, "script.py", "--flag"]``.
        grace: seconds between the first failure (or a signal to the launcher) and stopping the
            ranks still running; as long again between SIGTERM and SIGKILL.
        env: variables for the ranks on top of ours (the ranks also get torchrun's variables and
            ``PYTHONUNBUFFERED=1`` unless it is set).
        mps: run the ranks under a private MPS daemon, each held to its share of the SMs of the
            GPU it shares (:mod:`trident.runtime.mps`); the daemon is stopped however the job ends.

    Returns:
        0 when every rank exited with 0; else the first failure's code (128 + N for signal N), or
        128 + N when the launcher got signal N (SIGINT, SIGTERM, SIGHUP) before any failure.

    See the module's docstring for what happens on a failure, a signal or a closed stdout.
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be at least 1, got {nprocs}")
    env = {**os.environ, **(env or {})}
    env.setdefault("PYTHONUNBUFFERED", "1")  # lines appear as printed, and survive a hard death
    # torch's C++ warnings (each store call that fails once rank 0, its host, is gone logs a stack
    # trace) buried the one error that says which rank went; errors are still logged.
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    received: list[int] = []
    previous = {}
    if threading.current_thread() is threading.main_thread():  # only there can Python handle signals
        for sig in _STOP_SIGNALS:
            if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup, `&` in a script: ignored here, and by the ranks
                previous[sig] = signal.signal(sig, lambda signum, frame: received.append(signum))
    try:
        sys.stdout.flush()  # our own lines before the ranks'
    except (OSError, ValueError):
        pass
    job = _Job()
    daemon = MpsDaemon(ranks_per_gpu(nprocs)) if mps else None
    try:
        if daemon is not None:
            try:
                env.update(daemon.start())
            except BackendUnavailableError as exc:  # nothing started yet: one line says it all
                _say(str(exc))
                return 1
            _say(f"MPS daemon started: each rank may use {daemon.share}% of its GPU's SMs")
        job.start(nprocs, command, env)
        return _watch(job, grace, received, mps)
    finally:
        job.finish(grace)
        if daemon is not None:
            daemon.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def ranks_per_gpu(nprocs: int) -> int:
    """How many of ``nprocs`` ranks share one GPU (ranks go round-robin over the visible GPUs)."""
    from ..platform import gpus_visible  # torch: only a job under MPS asks (the launcher starts without it)

    return -(-nprocs // max(gpus_visible(), 1))


#: Seconds the launcher under MPS waits after a first failure for the ranks that fail with it.
MPS_WINDOW = 1.0


def describe_failures(failures: list[tuple[int, int]], mps: bool) -> tuple[int, str]:
    """``(rank, line)``: the rank to blame for ``failures`` (``(rank, returncode)`` in exit order) and
    the launcher's line about them.

    Without MPS the first failure is named. Under MPS a fatal GPU fault of one client (a bad address,
    a rank killed while its kernel runs) ends the GPU work of every client of the daemon, so the rank
    that exited first is often not the one that faulted: a rank killed by a signal is named as the
    origin; ranks that all exited with codes are named together, the origin unknown.
    """
    rank, code = failures[0]
    if not mps or len(failures) < 2:
        return rank, f"rank {rank} {describe_exit(code)}"
    signalled = [(r, c) for r, c in failures if c < 0]
    others = "; ".join(f"rank {r} {describe_exit(c)}" for r, c in failures if (r, c) not in signalled[:1])
    if signalled:
        rank, code = signalled[0]
        return rank, (f"rank {rank} {describe_exit(code)}; under MPS a rank that dies while its kernel runs ends "
                      f"the GPU work of every rank sharing the daemon (the MPS fault domain), so these failed with "
                      f"it: {others}")
    return rank, (f"ranks {sorted(r for r, _ in failures)} failed together under MPS ({others}): a GPU fault in one "
                  f"MPS client ends every client of the daemon, so which rank faulted is not known; run without "
                  f"--mps, or with TRIDENT_DEBUG=1, to find it")


def _watch(job: _Job, grace: float, received: list[int], mps: bool = False) -> int:
    """The wait loop of :func:`run`: every rank on every pass, signals as they come."""
    first = None  # (rank, returncode) of the failure the launcher names
    together: list[tuple[int, int]] = []  # under MPS: the failures within MPS_WINDOW of the first
    report_at = None  # under MPS: when to name them
    stopped_by = None  # the first signal the launcher got
    term_at = kill_at = None  # when to SIGTERM / SIGKILL the ranks still running
    handled = 0
    while job.running:
        try:
            rank, code = job.exits.get(timeout=0.05)
            job.running.discard(rank)
            if code != 0 and report_at is not None:
                together.append((rank, code))
            if code != 0 and first is None and stopped_by is None:
                first, job.stopping = (rank, code), True
                if mps:  # name them once the ranks failing with it have exited too
                    together, report_at = [(rank, code)], time.monotonic() + min(MPS_WINDOW, grace)
                else:
                    _say(f"rank {rank} {describe_exit(code)}")
                term_at = time.monotonic() + grace
            continue  # drain every exit already queued before acting on the clock
        except queue.Empty:
            pass
        now = time.monotonic()
        if report_at is not None and now >= report_at:
            assert first is not None  # report_at is set with the first failure only
            first, report_at = _name_failures(together, first), None
        while handled < len(received):
            sig = signal.Signals(received[handled])
            handled += 1
            if stopped_by is None:
                stopped_by, job.stopping = sig, True
                sent = job.ask_to_stop(sig)
                _say(f"got {sig.name}: passed it to ranks {sent}; SIGKILL in {grace:g} s for any still running")
                kill_at = now + grace if kill_at is None else min(kill_at, now + grace)
                term_at = None
            else:
                _say(f"got {sig.name} again: killing ranks {sorted(job.running)}")
                kill_at = now
        if term_at is not None and now >= term_at:
            term_at = None
            sent = job.ask_to_stop(signal.SIGTERM)
            if sent:
                assert first is not None  # term_at is set with the first failure only
                _say(f"sent SIGTERM to ranks {sent}, still running {grace:g} s after rank {first[0]} failed")
            kill_at = now + grace
        if kill_at is not None and now >= kill_at:
            kill_at = float("inf")
            sent = job.send(signal.SIGKILL)
            if sent:
                _say(f"sent SIGKILL to ranks {sent}")
    if report_at is not None:
        assert first is not None  # report_at is set with the first failure only
        first = _name_failures(together, first)
    if first is not None:
        return shell_status(first[1])
    return 128 + stopped_by if stopped_by is not None else 0


def _name_failures(together: list[tuple[int, int]], first: tuple[int, int]) -> tuple[int, int]:
    """Say which rank failed (:func:`describe_failures`, under MPS); returns ``(rank, returncode)`` to blame."""
    rank, line = describe_failures(together, mps=True)
    _say(line)
    return rank, dict(together).get(rank, first[1])
