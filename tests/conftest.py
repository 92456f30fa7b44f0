"""Shared fixtures: rank pools started once per test session.

The backend is the one trident picks (the simulator without a GPU); run the same tests on GPUs
with ``TRIDENT_BACKEND=cuda pytest`` or ``pytest --backend cuda``. Ranks share the machine's
GPUs round-robin (``LOCAL_RANK % device_count``), so several ranks may share one GPU.
"""

import os

import pytest

#: The most ranks any test's pool has: with --mps each rank gets 100 / this share of a GPU's SMs.
MOST_RANKS = 6
_MPS = []


def pytest_addoption(parser):
    parser.addoption("--backend", choices=["cuda", "sim"], default=None,
                     help="trident backend for the tests (default: cuda if a GPU is visible, else sim)")
    parser.addoption("--mps", action="store_true",
                     help="ranks sharing a GPU run concurrently under a private MPS daemon, each held to "
                          f"1/{MOST_RANKS} of the SMs (as `trident run --mps`); without it their kernels time-slice")


def pytest_configure(config):
    backend = config.getoption("--backend")
    if backend:
        os.environ["TRIDENT_BACKEND"] = backend  # before any test module imports trident
    if config.getoption("--mps"):
        from trident.runtime.mps import MpsDaemon

        daemon = MpsDaemon(ranks_per_gpu=MOST_RANKS)
        os.environ.update(daemon.start())  # before any process of the session starts CUDA
        _MPS.append(daemon)


def pytest_unconfigure(config):
    for daemon in _MPS:
        daemon.stop(wait=False)  # this process is one of the daemon's clients: it quits once we exit


_POOLS = {}

# Small heaps and short timeouts: a hang in a test should fail it in seconds, not minutes.
POOL_KWARGS = {"heap_size": 1 << 26, "timeout": 60.0, "wait_timeout": 20.0}


def get_pool(world_size, **env):
    """The session's pool of ``world_size`` ranks with the given extra environment."""
    from trident.testing import RankPool

    key = (world_size, tuple(sorted(env.items())))
    if key not in _POOLS:
        _POOLS[key] = RankPool(world_size, env=env, **POOL_KWARGS)
    return _POOLS[key]


@pytest.fixture(scope="session", autouse=True)
def _close_pools():
    yield
    for pool in _POOLS.values():
        pool.close()


@pytest.fixture(params=[2, 4], ids=["2ranks", "4ranks"])
def pool(request):
    """A pool of 2 and then of 4 ranks (tests using it run once for each)."""
    return get_pool(request.param)


@pytest.fixture
def pool2():
    return get_pool(2)


@pytest.fixture
def pool4():
    return get_pool(4)


@pytest.fixture
def debug_pool():
    """Two ranks with the device debug mode on (bounds checks, per-allocation agreement checks)."""
    return get_pool(2, TRIDENT_DEBUG="1")
