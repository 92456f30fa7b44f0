"""Shared fixtures: rank pools started once per test session (once per module under pytest-xdist).

The backend is the one trident picks (the simulator without a GPU); run the same tests on GPUs
with ``TRIDENT_BACKEND=cuda pytest`` or ``pytest --backend cuda``. Ranks share the machine's
GPUs round-robin (``LOCAL_RANK % device_count``), so several ranks may share one GPU.

With pytest-xdist (``-n W --dist loadfile``) each worker runs whole modules with pools of its
own; with ``--mps`` one daemon serves every worker and each rank gets ``100 / (MOST_RANKS * W)``
percent of the SMs, so that every worker's ranks together never ask for more than the GPU has.
A rank that the daemon refuses a context while other workers' ranks come and go is started again
(``RankPool``; ``trident.errors.ContextRefusedError``). With ``--mps`` the slowest modules come first
(:data:`SLOW_FIRST`; pass ``--no-loadscope-reorder``,
or xdist reorders modules by test count and runs one-test modules such as the stress test last).

Some tests must run alone on the GPU, so with ``--mps`` and several xdist workers they are skipped,
and run in a phase of their own (``pytest --backend cuda --mps -m "kills_ranks or device_wide"``;
``bash scripts/test.sh --gpu`` and ``trident bench suite gpu-tests`` run both phases):

* ``kills_ranks``: they kill or crash rank processes mid-job. Under MPS a fatal GPU error in one
  client reaches every client of the daemon, so it must not reach other workers' tests.
* ``device_wide``: they measure the whole GPU (its free memory), which other workers' ranks move.
"""

import os

import pytest

#: Markers of the tests that run alone on the GPU (see the module docstring).
ALONE = ("kills_ranks", "device_wide")

#: The most ranks any test's pool has: with --mps each rank gets 100 / this share of a GPU's SMs.
MOST_RANKS = 6
_MPS = []


def pytest_addoption(parser):
    parser.addoption("--backend", choices=["cuda", "sim"], default=None,
                     help="trident backend for the tests (default: cuda if a GPU is visible, else sim)")
    parser.addoption("--mps", action="store_true",
                     help="ranks sharing a GPU run concurrently under a private MPS daemon, each held to "
                          f"1/{MOST_RANKS} of the SMs (as `trident run --mps`); without it their kernels time-slice")


def _xdist_workers(config) -> int:
    """pytest-xdist's worker count (``-n W``), 1 without it."""
    workers = getattr(config.option, "numprocesses", None)
    if workers in (None, 0):
        return 1
    if not isinstance(workers, int):
        raise pytest.UsageError(f"--mps needs an explicit worker count (-n 3), not -n {workers}: each rank's "
                                f"SM share is 100 / ({MOST_RANKS} * workers)")
    return workers


def pytest_configure(config):
    backend = config.getoption("--backend")
    if backend:
        os.environ["TRIDENT_BACKEND"] = backend  # before any test module imports trident
    # xdist workers inherit the controller's environment (its daemon and SM share): only it starts one.
    if config.getoption("--mps") and not hasattr(config, "workerinput"):
        from trident.runtime.mps import MpsDaemon

        daemon = MpsDaemon(ranks_per_gpu=MOST_RANKS * _xdist_workers(config))
        os.environ.update(daemon.start())  # before any process of the session starts CUDA
        _MPS.append(daemon)


#: The modules that take longest on the GPU (the suite run of 2026-12-03): under pytest-xdist they start
#: first, so that none of them is still running alone at the end while the other workers idle.
SLOW_FIRST = ("test_examples.py", "test_stress.py", "test_compile_sm90.py", "test_ops_compile_sm90.py",
              "test_ccl.py", "test_progress.py", "test_compile_ccl.py", "test_bench.py")


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--mps"):
        return
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    workers = config.workerinput["workercount"] if hasattr(config, "workerinput") else _xdist_workers(config)
    if workers <= 1:
        return
    skip = pytest.mark.skip(reason="runs alone on the GPU (a test that kills ranks, or measures the whole GPU): "
                                   "in a phase of its own, -m 'kills_ranks or device_wide' without xdist")
    for item in items:
        if any(marker in item.keywords for marker in ALONE):
            item.add_marker(skip)


def pytest_collection_finish(session):
    """Start the sm_90 compile children of the selected tests now (tests/sm90_harness.py says why);
    not under pytest-xdist, whose every worker collects every test."""
    config, items = session.config, session.items
    if hasattr(config, "workerinput") or getattr(config.option, "numprocesses", None) not in (None, 0):
        return
    from tests import sm90_harness

    for item in items:
        marker = item.get_closest_marker("sm90_child")
        if marker is not None:
            sm90_harness.start_early(marker.args[0])


def pytest_runtest_logreport(report):
    """With ``TRIDENT_FAILURE_LOG=PATH``, each failure's report is appended to PATH as it happens (a GPU
    run cut off at its time limit never prints pytest's summary; under pytest-xdist the controller
    writes every worker's failures)."""
    path = os.environ.get("TRIDENT_FAILURE_LOG")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(path, "a") as log:
            log.write(f"==== {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{report.longreprtext}\n")
            for name, text in report.sections:
                log.write(f"---- {name}\n{text[-4000:]}\n")


def pytest_unconfigure(config):
    from tests import sm90_harness

    sm90_harness.stop_early()
    for daemon in _MPS:
        daemon.stop(wait=False)  # this process is one of the daemon's clients: it quits once we exit


_POOLS = {}
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def script_env(**extra) -> dict:
    """The environment for ``trident run`` on a script outside the repository: the ranks import
    trident through PYTHONPATH when it is used from this checkout rather than installed (as on
    the GPU machine)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": _REPO + (os.pathsep + path if path else ""), **extra}

# Small heaps and short timeouts: a hang in a test should fail it in seconds, not minutes.
POOL_KWARGS = {"heap_size": 1 << 26, "timeout": 60.0, "wait_timeout": 20.0}


def get_pool(world_size, **env):
    """The session's pool of ``world_size`` ranks with the given extra environment."""
    from trident.testing import RankPool

    key = (world_size, tuple(sorted(env.items())))
    if key not in _POOLS:
        _POOLS[key] = RankPool(world_size, env=env, **POOL_KWARGS)
    return _POOLS[key]


def _close_all_pools():
    for pool in _POOLS.values():
        pool.ask_to_close()  # every pool's ranks close side by side
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


@pytest.fixture(scope="session", autouse=True)
def _close_pools():
    yield
    _close_all_pools()


@pytest.fixture(scope="module", autouse=True)
def _close_pools_per_module_under_xdist():
    """Under xdist a worker closes its pools after each module: workers * live ranks stay under
    MPS's limit of client processes per GPU (48), however many modules a worker runs."""
    yield
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _close_all_pools()


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
