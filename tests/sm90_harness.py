"""The one harness of the sm_90 compile tests: kernels built for a Hopper GPU on a machine without one.

CI has no GPU, so only these tests compile trident's kernels (everything else runs them in Triton's
interpreter). Compiling needs trident imported for the cuda backend, which a pytest process that
already runs the simulator cannot switch to: each test starts a child process (:func:`run_child`,
environment from :func:`child_environment`) whose code builds kernels with :func:`compile_ptx`
(and :func:`with_ones`) and prints its results as JSON on its last line.

A test marked ``@pytest.mark.sm90_child(CODE)`` has its child started when the session has collected
it (:func:`start_early`, from conftest), at low priority: each child keeps one core busy for seconds,
and a serial run leaves part of the other idle (a fault test waiting out a timeout, a launcher
starting ranks), so the children compile there and the test itself mostly just reads the result.

Example (in a test)::

    CHILD = '''
    import json
    from tests.sm90_harness import compile_ptx
    from trident.ccl import kernels as K
    print(json.dumps({"ok": "st.global" in compile_ptx(K.broadcast_kernel, SIGNATURE, CONSTEXPRS)}))
    '''
    results = run_child(CHILD, tmp_path)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: What trident's kernels are built for: Hopper (H100/H200), CUDA, 32-thread warps.
TARGET = ("cuda", 90, 32)


def child_environment(tmp_path, **extra) -> dict[str, str]:
    """The environment of a compiling child: the cuda backend, no interpreter, a fresh Triton cache
    under ``tmp_path`` (so everything is really compiled), the repository importable."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRIDENT_BACKEND="cuda", TRITON_CACHE_DIR=str(tmp_path / "triton-cache"),
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    env.update(extra)
    return env


#: Children started before their tests (:func:`start_early`): code -> (process, its folder).
_EARLY: dict[str, tuple[subprocess.Popen, Path]] = {}


def start_early(code: str) -> None:
    """Start the compiling child of ``code`` now, at low priority, in a folder of its own (its output
    in files there); :func:`run_child` of the same code then waits for it instead of starting one."""
    if code in _EARLY:
        return
    folder = Path(tempfile.mkdtemp(prefix="trident-sm90-"))
    with open(folder / "stdout", "w") as out, open(folder / "stderr", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=err, cwd=ROOT,
                                env=child_environment(folder), preexec_fn=lambda: os.nice(10))
    _EARLY[code] = (proc, folder)


def stop_early() -> None:
    """End the early children no test collected (a run stopped early, ``-x``), and remove their folders."""
    while _EARLY:
        proc, folder = _EARLY.popitem()[1]
        proc.kill()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def run_child(code: str, tmp_path, timeout: float = 600) -> dict:
    """Run ``code`` in a compiling child (:func:`child_environment`), or wait for the one
    :func:`start_early` started; return the JSON of its last line."""
    early = _EARLY.pop(code, None)
    if early is None:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                              env=child_environment(tmp_path), timeout=timeout)
        returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    else:
        child, folder = early
        try:
            returncode = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            raise
        finally:
            stdout, stderr = (folder / "stdout").read_text(), (folder / "stderr").read_text()
            shutil.rmtree(folder, ignore_errors=True)
    assert returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def assert_compiled(code: str, tmp_path, count: int) -> None:
    """Run ``code`` in a compiling child (:func:`run_child`) whose results map each kernel it built to
    ``"ok"`` or what went wrong (:func:`outcome`): there must be ``count`` of them, every one ``"ok"``."""
    results = run_child(code, tmp_path)
    assert len(results) == count, results
    failed = {k: v for k, v in results.items() if v != "ok"}
    assert not failed, failed


def outcome(fn, signature: dict, constexprs: dict | None = None, check: str | None = None, **options) -> str:
    """``"ok"`` when :func:`compile_ptx` builds ``fn`` (and its PTX contains ``check``, if given), else
    what went wrong: the error (its last 1500 characters) or the missing PTX. For a child's results."""
    try:
        ptx = compile_ptx(fn, signature, constexprs, **options)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[-1500:]
    return "ok" if check is None or check in ptx else f"no {check} in the PTX"


#: Shared memory one program may use on a Hopper SM (227 KiB): a kernel that asks for more does not launch.
HOPPER_SHARED_BYTES = 232448


def compile_kernel(fn, signature: dict, constexprs: dict | None = None, aligned=(), num_warps: int = 4,
                   num_stages: int | None = None):
    """Compile the ``@triton.jit`` function ``fn`` for sm_90 (in a child: the cuda backend); return the
    compiled kernel (``.asm["ptx"]``, ``.metadata.shared``: its shared memory per program, in bytes).

    Args:
        signature: argument name -> Triton type (``"*fp16"``, ``"i32"``, ``"constexpr"``, ...).
        constexprs: values of the ``constexpr`` arguments (an element of a tuple argument: keyed
            ``(argument index, element index)``).
        aligned: arguments promised 16-byte divisible, as Triton's launcher specializes heap tensors
            and sizes: a name, or ``(name, i)`` for element ``i`` of a tuple argument.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {}
    for arg in aligned:
        name, *element = (arg,) if isinstance(arg, str) else arg
        if name in signature:
            attrs[(fn.arg_names.index(name), *element)] = [["tt.divisibility", 16]]
    options = {"num_warps": num_warps} | ({} if num_stages is None else {"num_stages": num_stages})
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs or {}, attrs=attrs)
    return triton.compile(source, target=GPUTarget(*TARGET), options=options)


def compile_ptx(fn, signature: dict, constexprs: dict | None = None, aligned=(), num_warps: int = 4,
                num_stages: int | None = None) -> str:
    """The PTX of :func:`compile_kernel` (same arguments)."""
    return compile_kernel(fn, signature, constexprs, aligned, num_warps, num_stages).asm["ptx"]


def with_ones(signature: dict, constexprs: dict, names) -> tuple[dict, dict]:
    """``(signature, constexprs)`` as Triton specializes them when the integer arguments ``names``
    are 1 (rank 1, world size 1, ...): they become constants, and a kernel must compile that way too."""
    signature, constexprs = dict(signature), dict(constexprs)
    for arg in names:
        if arg in signature:
            signature[arg], constexprs[arg] = "constexpr", 1
    return signature, constexprs
