"""What starting and reporting rank processes needs, and nothing more: no torch, no CUDA.

``trident run`` (:mod:`trident.runtime.launcher`) imports only this (and the MPS daemon's control),
so the launcher starts in a fraction of a second instead of paying torch's import once more on
top of every rank's; :func:`trident.spawn` and the rendezvous use the same helpers.
"""

from __future__ import annotations

import signal
import socket


def rank_environment(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The torchrun-style variables for one rank of a job on this machine.

    Example::

        os.environ.update(rank_environment(1, 4, free_port()))   # RANK=1, WORLD_SIZE=4, ...
    """
    return {
        "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    }


def describe_exit(returncode: int) -> str:
    """How a process ended, from its return code (negative: the signal that killed it).

    Example::

        describe_exit(5), describe_exit(-11)   # "exited with code 5", "was killed by SIGSEGV"
    """
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"was killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"was killed by signal {-returncode}"


def free_port() -> int:
    """A TCP port on this machine that nobody listens on right now.

    Example::

        port = free_port()   # MASTER_PORT for a job on this machine
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
