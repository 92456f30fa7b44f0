"""A private MPS control daemon for ranks that share a GPU (``trident run --mps``).

Without MPS, the kernels of different processes on one GPU time-slice: a cross-rank wait still
completes, but each one costs a time slice (milliseconds). Under MPS they run concurrently, but a
kernel that spins waiting for a peer can take every SM, and the peer's kernel then never starts: a
deadlock. The rule trident follows: **ranks that share a GPU under MPS each get their share of the
SMs** (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = 100 / ranks per GPU``, set before CUDA starts in the
rank), so every rank's kernels are resident at once.

:class:`MpsDaemon` starts ``nvidia-cuda-mps-control -d`` with its own pipe and log folders (no
other job's daemon is touched, and no device setting is changed) and always stops it (``quit``),
also when the job fails or is interrupted.

Example::

    with MpsDaemon(ranks_per_gpu=4) as env:       # env: the variables every rank needs
        subprocess.run(command, env={**os.environ, **env})
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile

from ..errors import BackendUnavailableError

#: The MPS control program (part of the NVIDIA driver's utilities).
CONTROL = "nvidia-cuda-mps-control"


def sm_share(ranks_per_gpu: int) -> int:
    """The percentage of a GPU's SMs each of ``ranks_per_gpu`` ranks may use (at least 1)."""
    if ranks_per_gpu < 1:
        raise ValueError(f"ranks_per_gpu must be at least 1, got {ranks_per_gpu}")
    return max(1, 100 // ranks_per_gpu)


class MpsDaemon:
    """A private MPS control daemon; a context manager whose value is the ranks' environment.

    Args:
        ranks_per_gpu: how many ranks share each GPU (their SM share is ``100 // ranks_per_gpu`` %).
        control: the control program (default: ``nvidia-cuda-mps-control`` on PATH).
    """

    def __init__(self, ranks_per_gpu: int, control: str | None = None):
        self.share = sm_share(ranks_per_gpu)
        self.control = control or shutil.which(CONTROL)
        self.folder: str | None = None
        self.running = False

    @property
    def environment(self) -> dict[str, str]:
        """What every rank's environment needs: the daemon's pipe and log folders and its SM share."""
        if self.folder is None:
            raise RuntimeError("the MPS daemon is not started")
        return {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(self.folder, "pipe"),
                "CUDA_MPS_LOG_DIRECTORY": os.path.join(self.folder, "log"),
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(self.share)}

    def _call(self, *args: str, stdin: str | None = None, timeout: float = 30.0) -> subprocess.CompletedProcess:
        env = {**os.environ, **self.environment}
        env.pop("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")  # the daemon itself runs unrestricted
        assert self.control is not None  # start() refuses without it
        return subprocess.run([self.control, *args], input=stdin, env=env, capture_output=True, text=True,
                              timeout=timeout)

    def start(self) -> dict[str, str]:
        """Start the daemon; return the ranks' environment. Raises with what is missing when it cannot."""
        if self.control is None:
            raise BackendUnavailableError(f"--mps needs {CONTROL} (NVIDIA's MPS, part of the driver's utilities); "
                                          f"it is not on PATH (run without --mps, or put it on PATH)")
        self.folder = tempfile.mkdtemp(prefix="trident-mps-")
        for sub in ("pipe", "log"):
            os.makedirs(os.path.join(self.folder, sub))
        done = self._call("-d")
        if done.returncode != 0:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise BackendUnavailableError(f"{CONTROL} -d failed (exit {done.returncode}): "
                                          f"{(done.stderr or done.stdout).strip()}")
        self.running = True
        return self.environment

    def stop(self, wait: bool = True, timeout: float = 10.0) -> None:
        """Tell the daemon to quit; idempotent.

        MPS's ``quit`` waits until every client process has ended. With ``wait`` (the launcher,
        whose ranks have exited) it waits up to ``timeout`` seconds for the daemon to go, then
        removes its folders. Without (a process that is itself an MPS client, like pytest's main
        process, cannot wait for its own exit) a detached helper sends ``quit`` and removes the
        folders once the daemon is gone.
        """
        if not self.running:
            return
        self.running = False
        assert self.control is not None and self.folder is not None  # set by start(), which made it run
        env = {**os.environ, **self.environment}
        env.pop("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        # One shell line, in its own session so it outlives this process: quit, then tidy up.
        line = f"echo quit | {shlex.quote(self.control)} >/dev/null 2>&1; rm -rf {shlex.quote(self.folder)}"
        helper = subprocess.Popen(["/bin/sh", "-c", line], env=env, start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if wait:
            try:
                helper.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass  # the helper goes on by itself once the last client has exited

    def __enter__(self) -> dict[str, str]:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
