"""The one harness of the sm_90 compile tests: kernels built for a Hopper GPU on a machine without one.

CI has no GPU, so only these tests compile trident's kernels (everything else runs them in Triton's
interpreter). Compiling needs trident imported for the cuda backend, which a pytest process that
already runs the simulator cannot switch to: each test starts a child process (:func:`run_child`,
environment from :func:`child_environment`) whose code builds kernels with :func:`compile_ptx`
(and :func:`with_ones`) and prints its results as JSON on its last line.

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
import subprocess
import sys

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


def run_child(code: str, tmp_path, timeout: float = 600) -> dict:
    """Run ``code`` in a compiling child (:func:`child_environment`); return the JSON of its last line."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env=child_environment(tmp_path), timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


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


def compile_ptx(fn, signature: dict, constexprs: dict | None = None, aligned=(), num_warps: int = 4,
                num_stages: int | None = None) -> str:
    """Compile the ``@triton.jit`` function ``fn`` for sm_90 (in a child: the cuda backend); return its PTX.

    Args:
        signature: argument name -> Triton type (``"*fp16"``, ``"i32"``, ``"constexpr"``, ...).
        constexprs: values of the ``constexpr`` arguments.
        aligned: arguments promised 16-byte divisible, as Triton's launcher specializes heap tensors.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {(fn.arg_names.index(arg),): [["tt.divisibility", 16]] for arg in aligned if arg in signature}
    options = {"num_warps": num_warps} | ({} if num_stages is None else {"num_stages": num_stages})
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs or {}, attrs=attrs)
    return triton.compile(source, target=GPUTarget(*TARGET), options=options).asm["ptx"]


def with_ones(signature: dict, constexprs: dict, names) -> tuple[dict, dict]:
    """``(signature, constexprs)`` as Triton specializes them when the integer arguments ``names``
    are 1 (rank 1, world size 1, ...): they become constants, and a kernel must compile that way too."""
    signature, constexprs = dict(signature), dict(constexprs)
    for arg in names:
        if arg in signature:
            signature[arg], constexprs[arg] = "constexpr", 1
    return signature, constexprs
