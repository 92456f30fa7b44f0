"""Host-side coordination between ranks through torch.distributed's key-value store.

trident exchanges heap handles, compares allocation digests and runs host barriers through the
store that every torch.distributed job already has (the TCPStore that torchrun or
``init_process_group`` set up), so no communication library is needed on the host. Using the
store directly, instead of a collective, lets every timeout name the ranks that never arrived.
"""

from __future__ import annotations

import atexit
import datetime
import os
import socket
import time

import torch.distributed as dist

from .. import platform as _platform
from .. import torch_private
from ..errors import DivergenceError, RankTimeoutError
from .processes import free_port


def _env_int(name: str, default: int | None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        if default is None:
            raise ValueError(f"environment variable {name} is not set; launch with torchrun, "
                             f"`trident run -n N`, or trident.spawn()")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


STORE_HOST_VARIABLE = "TRIDENT_STORE_HOST"


def store_listen_address(master_addr: str) -> str:
    """The address rank 0's store listens on: ``TRIDENT_STORE_HOST`` if set, else ``master_addr``.

    torch's TCPStore would listen on every interface; the store carries the heap's handles, so it
    listens only where the ranks reach it: on loopback when ``MASTER_ADDR`` is a loopback address (as
    ``trident run`` and :func:`~trident.spawn` set it), else on ``MASTER_ADDR``'s interface.
    ``TRIDENT_STORE_HOST=0.0.0.0`` listens on every interface (as torch would).
    """
    return os.environ.get(STORE_HOST_VARIABLE) or master_addr


def listen_socket(master_addr: str, port: int, rank: int) -> socket.socket:
    """A listening TCP socket for rank 0's store on :func:`store_listen_address` and ``port``."""
    address = store_listen_address(master_addr)
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ValueError(f"rank {rank}: cannot resolve the rendezvous store's address {address!r} "
                         f"(MASTER_ADDR or {STORE_HOST_VARIABLE}): {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own server does
        sock.bind(sockaddr[:2] if family == socket.AF_INET else sockaddr)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"rank {rank}: the rendezvous store cannot listen on {address}:{port} "
                                 f"({exc.strerror}); rank 0 hosts it, so MASTER_ADDR must be one of rank 0's "
                                 f"addresses, or set {STORE_HOST_VARIABLE} to the address to listen on") from None
    return sock


def join_process_group(backend: str, timeout: float) -> tuple[dist.Store, int, int, int]:
    """Join the default torch.distributed group, creating it from the environment if needed.

    Args:
        backend: trident's backend ("cuda" or "sim"); picks the torch.distributed backends
            of a group trident creates: "cpu:gloo,cuda:nccl" with a GPU per rank, else "gloo"
            (ranks sharing a GPU, where NCCL cannot run: ``ctx.platform.nccl_usable`` is False).
        timeout: seconds to wait for every rank to arrive.

    Returns:
        ``(store, rank, world_size, local_rank)``.
    """
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local_rank = _env_int("LOCAL_RANK", rank)
        return torch_private.default_store(), rank, world, local_rank

    world = _env_int("WORLD_SIZE", 1 if "RANK" not in os.environ else None)
    rank = _env_int("RANK", 0 if world == 1 else None)
    local_rank = _env_int("LOCAL_RANK", rank)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} and WORLD_SIZE={world} are inconsistent: need 0 <= RANK < WORLD_SIZE")
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = _env_int("MASTER_PORT", free_port() if world == 1 else None)
    # Under torchrun its agent hosts the store (TORCHELASTIC_USE_AGENT_STORE): every rank is a client.
    hosts = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true"
    listen_fd = listen_socket(host, port, rank).detach() if hosts else None  # the store owns it from here
    start = time.monotonic()
    try:
        store = dist.TCPStore(host, port, world_size=None, is_master=hosts,
                              timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False,
                              master_listen_fd=listen_fd)
    except (RuntimeError, OSError) as exc:
        if listen_fd is not None:
            os.close(listen_fd)
        raise RankTimeoutError(
            f"rank {rank}: could not reach the rendezvous store at {host}:{port} (gave up after "
            f"{time.monotonic() - start:.3g} s; timeout {timeout:g} s); "
            f"rank 0 hosts it: has it started? ({exc})"
        ) from exc
    _check_world_size(store, rank, world, timeout)
    # NCCL needs a GPU per rank ("Duplicate GPU detected" otherwise, and its heartbeat thread warns
    # once a second after a peer exits): where ranks share a GPU, gloo serves cuda tensors too.
    nccl = backend == "cuda" and world <= _platform.gpus_visible()
    torch_backend = "cpu:gloo,cuda:nccl" if nccl else "gloo"
    dist.init_process_group(torch_backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=max(timeout, 60)))
    atexit.register(_destroy_process_group)  # the group is ours: tidy it away at exit
    return torch_private.default_store(), rank, world, local_rank


def _destroy_process_group() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # a peer may already be gone; nothing left to protect at exit
            pass


def _check_world_size(store: dist.Store, rank: int, world: int, timeout: float) -> None:
    """Every rank announces the world size it was given; a disagreement is an error, not a hang.

    Polls the announcements, so a rank that sees a different world size from any peer that has
    already announced raises at once (a peer that expects more ranks than exist would otherwise
    wait silently until the timeout)."""
    keys = [f"trident/world_size/{r}" for r in range(max(world, 1))]
    deadline = time.monotonic() + timeout
    try:
        store.set(keys[rank], str(world))
        sizes: dict[int, int] = {}
        while True:
            for r, key in enumerate(keys):
                if r not in sizes and store.check([key]):
                    sizes[r] = int(store.get(key))
            if len(set(sizes.values())) > 1:
                raise DivergenceError(f"rank {rank}: ranks disagree on WORLD_SIZE: {dict(sorted(sizes.items()))} "
                                      f"(rank: the WORLD_SIZE it was given)")
            if len(sizes) == len(keys) or time.monotonic() > deadline:
                break
            time.sleep(0.005)
    except DivergenceError:
        raise
    except Exception as exc:
        raise RankTimeoutError(
            f"rank {rank}: lost the rendezvous store (hosted by rank 0) while waiting for the other ranks "
            f"of a job of WORLD_SIZE={world}: rank 0 failed or stopped. Do all ranks have the same "
            f"WORLD_SIZE?"
        ) from exc
    missing = [r for r in range(len(keys)) if r not in sizes]
    if missing:
        raise RankTimeoutError(
            f"rank {rank}: timed out after {timeout:g} s waiting for ranks {missing} to join a job of "
            f"WORLD_SIZE={world}. Did they start, crash, or get a different WORLD_SIZE?"
        )


class Rendezvous:
    """All-gathers and barriers over the store, each named by a sequence number.

    Waits poll the store, so that they can end as soon as the watchdog sees a rank go.

    Args:
        store: a torch.distributed Store shared by every rank.
        prefix: a key prefix unique to one trident context.
        rank, world_size: this process's place in the job.
        timeout: seconds before a wait gives up and names the missing ranks.
    """

    def __init__(self, store: dist.Store, prefix: str, rank: int, world_size: int, timeout: float):
        self.store = dist.PrefixStore(prefix, store)
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self._seq = 0
        self._watchdog = None

    def watch(self, watchdog) -> None:
        """End waits at once when ``watchdog`` (a :class:`~trident.runtime.watchdog.RankWatchdog`)
        sees a peer go, instead of at the timeout."""
        self._watchdog = watchdog

    def among(self, prefix: str, rank: int, world_size: int) -> Rendezvous:
        """A rendezvous of some of these ranks (``rank`` of ``world_size``: a group's members) under
        ``prefix`` inside this one's keys, with the same timeout and watchdog."""
        sub = Rendezvous(self.store, prefix, rank, world_size, self.timeout)
        sub.watch(self._watchdog)
        return sub

    def peers_gone(self) -> dict[int, str]:
        """``{rank: what happened}`` for every peer the watchdog saw go (empty without one)."""
        return {} if self._watchdog is None else self._watchdog.gone

    def all_gather(self, what: str, value: bytes) -> list[bytes]:
        """Give every rank every rank's ``value``. ``what`` names the step in a timeout message."""
        self._seq += 1
        keys = [f"{self._seq}/{r}" for r in range(self.world_size)]
        self.store.set(keys[self.rank], value)  # type: ignore[arg-type]  # torch's stub: str only; bytes work
        self._wait(what, keys)
        values = self.store.multi_get(keys)
        if self._seq > 1:  # every rank has finished the previous step, so its keys can go
            self.store.delete_key(f"{self._seq - 1}/{self.rank}")
        return values

    def farewell(self, timeout: float = 10.0) -> None:
        """The last store access of a context: rank 0, which hosts the store, waits (at most
        ``timeout`` s) until every other rank has made its last one, so that none of them finds
        the store gone while it still reads from it."""
        self._seq += 1
        if self.rank != 0:
            self.store.set(f"{self._seq}/bye/{self.rank}", b"")  # type: ignore[arg-type]  # as in all_gather
            return
        keys = [f"{self._seq}/bye/{r}" for r in range(1, self.world_size)]
        deadline = time.monotonic() + timeout
        while keys and time.monotonic() < deadline and not self.store.check(keys):
            if self.peers_gone():
                return  # a lost rank will not say goodbye
            time.sleep(0.005)

    def _wait(self, what: str, keys: list[str]) -> None:
        """Poll until every key exists; a peer the watchdog saw go ends the wait at once.

        Polling with ``check`` (never a blocking ``wait``) keeps the store's client free for other
        threads and reacts to lost ranks between polls; the pause grows from 0.5 ms to 20 ms.
        """
        deadline = time.monotonic() + self.timeout
        pause = 0.0005
        failure = None
        while True:
            try:
                # Once the store has failed, ask it no more: each failed call logs a C++ stack trace.
                if failure is None and self.store.check(keys):
                    return
            except Exception as exc:  # the store's host (rank 0) may be gone: the watchdog will say
                failure = exc
            # Raised "from None": torch's store error carries a C++ stack trace of dozens of lines per
            # rank, which buried this message; its first line is kept in it instead.
            store = "" if failure is None else f"; the store said: {str(failure).splitlines()[0]}"
            gone = self.peers_gone()
            if gone:
                listing = "; ".join(f"rank {r}: {why}" for r, why in sorted(gone.items()))
                raise RankTimeoutError(f"rank {self.rank}: {what} cannot complete: a rank is gone ({listing})"
                                       f"{store}") from None
            if time.monotonic() > deadline:
                try:
                    if failure is not None:
                        raise failure
                    missing: list[int] | str = [r for r, key in enumerate(keys) if not self.store.check([key])]
                except Exception:
                    missing = "unknown (the store, hosted by rank 0, does not answer)"
                raise RankTimeoutError(
                    f"rank {self.rank}: {what} timed out after {self.timeout:g} s waiting for ranks {missing} "
                    f"(they never arrived: did they hang in a kernel, or take a different code path?){store}"
                ) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def broadcast(self, what: str, value: bytes | None, src: int) -> bytes:
        """Give every rank ``src``'s ``value`` (other ranks pass ``None``)."""
        mine = value if self.rank == src else b""
        assert mine is not None, f"rank {self.rank}: {what}: the source rank passes bytes"
        return self.all_gather(what, mine)[src]
