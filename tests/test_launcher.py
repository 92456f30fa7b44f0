"""The launchers: ``trident run`` (failures, signals, output, arguments), ``trident bench suite``,
``trident info``, :func:`trident.spawn`'s errors and results, and where the rendezvous store listens.

The ranks here are tiny scripts written to ``tmp_path`` that never import torch or trident (the
launcher runs any command), so each test takes a second or two. ``cli.run`` runs in this process
where it can; the tests that signal or close the launcher's stdout start it as ``python -m trident``.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import trident
from tests.conftest import script_env
from trident import cli
from trident.runtime import rendezvous

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script(tmp_path, name, body, head=""):
    path = tmp_path / name
    path.write_text(head + textwrap.dedent(body))
    return str(path)


def _alive(pid):
    """Whether ``pid`` runs (a zombie counts as gone: it has exited, only its parent has not reaped it)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def _pids(tmp_path, world):
    """The pids the ranks wrote to ``pid<rank>`` (a rank writes its file once it is ready)."""
    return [int((tmp_path / f"pid{r}").read_text()) for r in range(world)]


def _wait_for_files(paths, launcher, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) and os.path.getsize(p) for p in paths):
        assert launcher.poll() is None, f"the launcher exited with {launcher.returncode} before its ranks were ready"
        assert time.monotonic() < deadline, f"ranks never became ready: {paths}"
        time.sleep(0.02)


def _kill_leftovers(tmp_path):
    """SIGKILL every rank that wrote a pid file and still runs (after a failed test)."""
    for path in tmp_path.glob("pid*"):
        if path.read_text() and _alive(int(path.read_text())):
            os.kill(int(path.read_text()), signal.SIGKILL)


def _default_signals() -> None:
    """In the launcher's process before exec: the stop signals at their defaults, as a terminal's
    foreground job has them. A test session started in the background (``nohup pytest &``) ignores
    SIGINT, the child inherits that, and the launcher rightly leaves an ignored signal ignored."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _launcher(args, tmp_path, **popen):
    """``python -m trident ARGS`` in its own session (as a shell job is), stderr to ``tmp_path/err``."""
    env = script_env()
    err = open(tmp_path / "err", "wb")
    return subprocess.Popen([sys.executable, "-m", "trident", *args], cwd=REPO, env=env, stderr=err,
                            start_new_session=True, preexec_fn=_default_signals, **popen)


# ---- trident run: every rank watched; the first failure named; the others stopped --------------------

_PID = "import os, sys\nrank = int(os.environ['RANK'])\nopen(f'{sys.argv[1]}/pid{rank}', 'w').write(str(os.getpid()))\n"


def test_run_stops_lower_ranks_when_a_higher_rank_fails(tmp_path, capfd):
    """Rank 1 fails while rank 0 works on (and ignores SIGTERM): rank 0 is killed after the grace period."""
    script = _script(tmp_path, "r.py", head=_PID, body="""\
        import signal, time
        if rank == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            open(f"{sys.argv[1]}/ready0", "w").write("1")
            time.sleep(60)
            sys.exit(0)
        while not os.path.exists(f"{sys.argv[1]}/ready0"):
            time.sleep(0.01)
        sys.exit(5)
    """)
    start = time.monotonic()
    try:
        code = cli.run(2, [sys.executable, script, str(tmp_path)], grace=0.3)
        elapsed = time.monotonic() - start
        err = capfd.readouterr().err
        assert code == 5 and elapsed < 20, (code, elapsed, err)
        assert "trident run: rank 1 exited with code 5" in err and "rank 0 exited" not in err
        assert not _alive(_pids(tmp_path, 2)[0])
    finally:
        _kill_leftovers(tmp_path)


def test_run_names_the_first_failure_not_the_lowest_rank(tmp_path, capfd):
    """Rank 1 exits with 7; rank 0 then fails because rank 1 is gone: the job failed with rank 1's 7."""
    script = _script(tmp_path, "r.py", head=_PID, body="""\
        import time
        if rank == 1:
            sys.exit(7)
        while not os.path.exists(f"{sys.argv[1]}/pid1"):
            time.sleep(0.01)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # until rank 1 is gone (and reaped by the launcher)
            try:
                os.kill(int(open(f"{sys.argv[1]}/pid1").read()), 0)
            except ProcessLookupError:
                break
            except ValueError:  # the file is being written
                pass
            time.sleep(0.01)
        sys.exit(1)
    """)
    code = cli.run(2, [sys.executable, script, str(tmp_path)], grace=5)
    err = capfd.readouterr().err
    assert code == 7, err
    assert "trident run: rank 1 exited with code 7" in err and "rank 0 exited" not in err


def test_run_names_a_signal_and_exits_like_a_shell(tmp_path, capfd):
    script = _script(tmp_path, "r.py", """\
        import os, resource, signal
        if os.environ["RANK"] == "1":
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
            os.kill(os.getpid(), signal.SIGSEGV)
    """)
    code = cli.run(2, [sys.executable, script], grace=5)
    err = capfd.readouterr().err
    assert code == 128 + signal.SIGSEGV, err
    assert "trident run: rank 1 was killed by SIGSEGV" in err and "-11" not in err


# ---- trident run: arguments ------------------------------------------------------------------------

_ARGV = "import json, os, sys\nopen(os.environ['OUT'], 'w').write(json.dumps(sys.argv[1:]))\n"


def test_run_module_and_arguments_verbatim(tmp_path, monkeypatch):
    """``-m module`` (the form ``--help`` shows) works; every word after the script or module goes to
    it as it is, ``--`` and ``-n`` included."""
    (tmp_path / "argv_mod.py").write_text(_ARGV)
    script = str(tmp_path / "argv_mod.py")
    out = tmp_path / "argv.json"
    monkeypatch.setenv("OUT", str(out))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    cases = [
        (["-n", "1", "-m", "argv_mod", "a", "--", "--flag", "-n", "3"], ["a", "--", "--flag", "-n", "3"]),
        (["-n", "1", script, "--", "--flag"], ["--", "--flag"]),
        (["--nproc=1", "--", script, "-m", "x"], ["-m", "x"]),
    ]
    for argv, expected in cases:
        assert cli.main(["run", *argv]) == 0, argv
        assert json.loads(out.read_text()) == expected, argv


def test_run_rejects_bad_arguments(tmp_path, capsys):
    for argv, message in [(["-n", "0", "x.py"], "at least 1"), (["-n", "1", str(tmp_path / "no.py")], "no such script"),
                          (["-n", "1"], "the script to run"), (["-n", "1", "-m"], "expected one argument"),
                          (["-n", "1", "--bogus", "x.py"], "unrecognized arguments: --bogus")]:
        with pytest.raises(SystemExit):
            cli.main(["run", *argv])
        assert message in capsys.readouterr().err, argv


# ---- trident run: output ----------------------------------------------------------------------------

def test_run_ranks_are_unbuffered_unless_the_user_says(tmp_path, capfd, monkeypatch):
    """A rank's printed line survives its hard death: ranks run with PYTHONUNBUFFERED=1 (unless set)."""
    script = _script(tmp_path, "r.py", """\
        import os, signal
        print("unbuffered", repr(os.environ.get("PYTHONUNBUFFERED")))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    assert cli.run(1, [sys.executable, script], grace=5) == 128 + signal.SIGKILL
    assert "unbuffered '1'\n" in capfd.readouterr().out
    monkeypatch.setenv("PYTHONUNBUFFERED", "")  # the user's choice (block-buffered): kept
    cli.run(1, [sys.executable, script], grace=5)
    assert "unbuffered" not in capfd.readouterr().out


def test_run_ends_a_last_partial_line(tmp_path, capfd):
    """A rank's last line without a newline is never glued to another rank's line."""
    script = _script(tmp_path, "r.py", """\
        import os, sys, time
        if os.environ["RANK"] == "0":
            sys.stdout.write("partial")
        else:
            time.sleep(0.5)
            print("second")
    """)
    assert cli.run(2, [sys.executable, script], grace=5) == 0
    out = capfd.readouterr().out
    assert sorted(out.splitlines()) == ["partial", "second"] and out.endswith("\n"), repr(out)


def test_run_into_a_closed_pipe_finishes(tmp_path):
    """``trident run ... | head -1``: the ranks never block on a full pipe; the launcher exits cleanly."""
    script = _script(tmp_path, "r.py", head=_PID, body="""\
        for i in range(20000):
            print(f"rank {rank} line {i} " + "x" * 80)
    """)
    proc = _launcher(["run", "-n", "2", script, str(tmp_path)], tmp_path, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().startswith(b"rank ")
        proc.stdout.close()  # what `head -1` does after its line
        assert proc.wait(timeout=60) == 0
        err = (tmp_path / "err").read_text()
        assert "Error" not in err and "Exception" not in err, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _kill_leftovers(tmp_path)


# ---- trident run: signals to the launcher ---------------------------------------------------------------

_SIGNALLED = _PID + """\
import signal, time
got = []
def note(signum, frame):
    got.append(signum)
    open(sys.argv[1] + f"/signals{rank}", "a").write(signal.Signals(signum).name + "\\n")
if rank == 0:
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, note)
else:  # rank 1 will not stop: the launcher must kill it after the grace period
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
open(sys.argv[1] + f"/ready{rank}", "w").write(str(os.getpgid(0)))
deadline = time.monotonic() + 30
while not got and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.3)  # cleanup that a second signal would interrupt
"""


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_run_passes_one_signal_to_each_rank_and_leaves_no_orphans(tmp_path, how):
    """Ctrl-C (SIGINT to the terminal's whole process group) and SIGTERM (to the launcher alone): each
    rank gets the signal once, a rank still running after the grace period is killed, the launcher
    exits with 128 + the signal."""
    script = _script(tmp_path, "r.py", _SIGNALLED)
    proc = _launcher(["run", "--grace", "1", "-n", "2", script, str(tmp_path)], tmp_path)
    sig = signal.SIGINT if how == "ctrl-c" else signal.SIGTERM
    try:
        _wait_for_files([tmp_path / f"ready{r}" for r in range(2)], proc)
        if how == "ctrl-c":
            os.killpg(proc.pid, sig)  # the terminal signals its foreground process group
        else:
            proc.send_signal(sig)
        code = proc.wait(timeout=30)
        err = (tmp_path / "err").read_text()
        assert (tmp_path / "signals0").read_text() == sig.name + "\n", err
        assert not any(_alive(pid) for pid in _pids(tmp_path, 2)), err
        groups = {int((tmp_path / f"ready{r}").read_text()) for r in range(2)}
        assert proc.pid not in groups, "the ranks share the launcher's process group: Ctrl-C reaches them twice"
        assert code == 128 + sig, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _kill_leftovers(tmp_path)


def test_run_ranks_stop_when_the_launcher_is_killed(tmp_path):
    """SIGKILL leaves the launcher no say: the ranks get SIGTERM from the kernel (Linux), not orphaned."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    script = _script(tmp_path, "r.py", "import time\ntime.sleep(30)\n", head=_PID)
    proc = _launcher(["run", "-n", "2", script, str(tmp_path)], tmp_path)
    try:
        _wait_for_files([tmp_path / f"pid{r}" for r in range(2)], proc)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in _pids(tmp_path, 2)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in _pids(tmp_path, 2))
    finally:
        _kill_leftovers(tmp_path)


# ---- trident bench suite / trident info -----------------------------------------------------------------

def test_bench_suite_runs_once_in_this_process(monkeypatch, capsys):
    import trident.bench

    calls = []
    fake = type(sys)("trident.bench.suite")
    fake.main = lambda argv: calls.append(argv) or 3
    monkeypatch.setitem(sys.modules, "trident.bench.suite", fake)
    monkeypatch.setattr(trident.bench, "suite", fake, raising=False)
    assert cli.main(["bench", "suite", "nightly", "--out", "d", "--budget", "60"]) == 3
    assert cli.main(["bench", "suite", "--list"]) == 3
    assert calls == [["nightly", "--out", "d", "--budget", "60"], ["--list"]]
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    assert "suite" in capsys.readouterr().out


def test_info_asks_trident_topology(monkeypatch, capsys):
    """``trident info`` prints what :func:`trident.topology.system_info` says, with the runtime's default heap."""
    from trident import topology
    from trident.runtime.context import DEFAULT_HEAP_SIZE

    seen = {}

    def fake(**kwargs):
        seen.update(kwargs)
        return {"summary": {"backend": "fake"}, "gpus": [], "peers": {"gpus": 0, "links": []}}

    monkeypatch.setattr(topology, "system_info", fake)
    assert cli.main(["info"]) == 0
    assert seen["default_heap_size"] == DEFAULT_HEAP_SIZE and "fake" in capsys.readouterr().out


# ---- trident.spawn: a rank that cannot hand back a result ------------------------------------------------

def _returns_a_lock(rank):
    return threading.Lock() if rank == 1 else rank


def _exits_quietly(rank):
    if rank == 0:
        os._exit(0)
    return rank


@pytest.mark.parametrize("fn, message", [
    (_returns_a_lock, "rank 1 returned an object that cannot be pickled: "),
    (_exits_quietly, "rank 0 exited with code 0 without returning a result"),
])
def test_spawn_says_why_a_result_is_missing(fn, message):
    with pytest.raises(trident.SpawnError) as info:
        trident.spawn(fn, 2, timeout=90)  # only bounds a regression: the error comes as soon as the rank is done
    assert str(info.value).startswith(message), str(info.value)


def _returns_tensors(rank):
    """Tensors to return by value, and (rank 0) where the spawned job's rendezvous store listens: one job for
    test_spawn_returns_tensors_by_value and test_spawn_store_listens_on_loopback_only."""
    big = torch.arange(1000.0)
    with trident.init(heap_size=1 << 22) as ctx:
        on_heap = ctx.full((3,), float(rank))
        view = ctx.arange(8)[2:4]
        listening = _listening_addresses(int(os.environ["MASTER_PORT"])) if ctx.rank == 0 else None
    # returned after close(): the heap tensors come back as CPU copies of their own elements
    return {"full": torch.full((3,), 1.0), "clone": torch.ones(2).cpu().clone(), "view": big[5:7],
            "heap": on_heap, "heap view": view}, listening


@pytest.fixture(scope="module")
def spawned():
    return trident.spawn(_returns_tensors, 2, timeout=120)


def test_spawn_returns_tensors_by_value(spawned):
    """Each rank's tensors come back (they used to die with the rank's shared memory: FileNotFoundError)."""
    results = [tensors for tensors, _ in spawned]
    for rank, got in enumerate(results):
        assert {k: v.tolist() for k, v in got.items()} == {
            "full": [1.0] * 3, "clone": [1.0] * 2, "view": [5.0, 6.0], "heap": [float(rank)] * 3, "heap view": [2, 3]}
        for t in got.values():  # own elements only: no heap, no larger storage behind them
            assert t.device.type == "cpu" and t.untyped_storage().nbytes() == t.numel() * t.element_size()


# ---- the rendezvous store: reachable only where the ranks reach it ------------------------------------

def _listening_addresses(port):
    """Local addresses of the sockets listening on TCP ``port`` (from /proc/net/tcp and tcp6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    raw = bytes.fromhex(address)
                    # the kernel prints each 32-bit word in host (little-endian) order
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                    found.append(socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words))
    return found


def test_spawn_store_listens_on_loopback_only(spawned):
    """The store carries the heap's handles: it used to listen on every interface (``*:PORT``). Rank 0 of the
    job of :func:`_returns_tensors` looked, inside its context."""
    assert [listening for _, listening in spawned] == [["127.0.0.1"], None]


def test_trident_run_store_listens_on_loopback_only(tmp_path):
    script = _script(tmp_path, "store.py", """\
        import os
        import trident
        from tests.test_launcher import _listening_addresses
        with trident.init(heap_size=1 << 20) as ctx:
            if ctx.rank == 0:
                print("listening", _listening_addresses(int(os.environ["MASTER_PORT"])), flush=True)
    """)
    proc = subprocess.run([sys.executable, "-m", "trident", "run", "-n", "2", script], cwd=REPO, env=script_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "listening ['127.0.0.1']" in proc.stdout, proc.stdout


def test_store_listens_on_master_addr_or_trident_store_host(monkeypatch):
    monkeypatch.delenv(rendezvous.STORE_HOST_VARIABLE, raising=False)
    port = rendezvous.free_port()
    with rendezvous.listen_socket("127.0.0.2", port, 0) as sock:  # any MASTER_ADDR: its own interface only
        assert sock.getsockname() == ("127.0.0.2", port)
    monkeypatch.setenv(rendezvous.STORE_HOST_VARIABLE, "0.0.0.0")  # every interface, asked for explicitly
    with rendezvous.listen_socket("127.0.0.1", port, 0) as sock:
        assert sock.getsockname() == ("0.0.0.0", port)
    monkeypatch.setenv(rendezvous.STORE_HOST_VARIABLE, "192.0.2.77")  # TEST-NET: no interface of this machine
    with pytest.raises(OSError, match="rank 0: the rendezvous store cannot listen on 192.0.2.77:.*TRIDENT_STORE_HOST"):
        rendezvous.listen_socket("127.0.0.1", port, 0)


def test_run_when_rank_0_dies_the_others_print_only_the_error(tmp_path):
    """Rank 0 hosts the store: when it died, the others printed hundreds of lines of the store's C++
    stack traces around the one good RankTimeoutError."""
    script = _script(tmp_path, "rank0_dies.py", """\
        import os, time
        import trident
        ctx = trident.init(heap_size=1 << 20, timeout=20)
        if ctx.rank == 0:
            time.sleep(0.5)
            os._exit(3)
        ctx.barrier()
        time.sleep(1)
        ctx.barrier()
    """)
    proc = subprocess.run([sys.executable, "-m", "trident", "run", "-n", "3", "--grace", "5", script], cwd=REPO,
                          env={k: v for k, v in script_env().items() if k != "TORCH_CPP_LOG_LEVEL"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    for rank in (1, 2):
        assert f"[rank{rank}]: trident.errors.RankTimeoutError: rank {rank}: barrier cannot complete: a rank is " \
               f"gone (rank 0: process" in proc.stderr, proc.stderr[-3000:]
    assert not [line for line in lines if "frame #" in line or "TCPStore.cpp" in line], proc.stderr[-3000:]
    assert len(lines) <= 35, proc.stderr  # the launcher's line and each survivor's traceback


def test_the_launcher_and_a_bare_import_load_no_torch():
    """``import trident`` loads only the backend choice and the errors (the rest on first use), and
    ``trident run`` only the launcher: neither imports torch where the backend is settled without a
    GPU probe (here TRIDENT_BACKEND=sim), so every job starts in a fraction of a second, not torch's
    import once more; the lazy names still resolve."""
    code = ("import sys, trident, trident.cli\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "assert trident.TridentError and trident.__version__\n"
            "assert callable(trident.init) and 'torch' in sys.modules\n"
            "assert trident.load is trident.device.load and 'load' in trident.__all__ and 'ccl' in dir(trident)\n"
            "print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**script_env(), "TRIDENT_BACKEND": "sim"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
