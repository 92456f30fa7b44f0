"""Kernels that tests/test_compile_sm90.py compiles for sm_90, and the child process that compiles them.

Not a test module: pytest runs in the simulator (Triton's interpreter), where nothing is compiled.
The test runs this file as a script in a child process with ``TRIDENT_BACKEND=cuda`` (so trident
does not turn the interpreter on) and no GPU needed::

    TRIDENT_BACKEND=cuda python tests/sm90_kernels.py SPECS.json RESULTS.json

``SPECS.json`` lists the kernels to build (which ``@triton.jit`` function, its signature, its
constexprs, which arguments are 16-byte aligned, ``num_warps``). ``RESULTS.json`` gets, for each,
either the code part of the PTX or the compile error, plus the ``@triton.jit`` kernels found in
``examples/*.py`` (so the test notices an example kernel it does not build).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

import trident
from tests.sm90_harness import compile_ptx

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------
# Loads, stores, get, put, copy, translate. All move one BLOCK of x into y; `peer` is a runtime
# rank, as in real kernels. mem_ref is the same copy with plain tl.load/tl.store: the reference
# for the vector width the translated versions must keep.


@triton.jit
def mem_ref(x_ptr, y_ptr, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def mem_load(x_ptr, y_ptr, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = trident.load(x_ptr + offs, rank, peer, heap_bases, mask=mask)
    tl.store(y_ptr + offs, x, mask=mask)


@triton.jit
def mem_store(x_ptr, y_ptr, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    trident.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), rank, peer, heap_bases, mask=mask)


@triton.jit
def mem_get(x_ptr, y_ptr, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    trident.get(x_ptr + offs, y_ptr + offs, rank, peer, heap_bases, mask=offs < n)


@triton.jit
def mem_put(x_ptr, y_ptr, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    trident.put(x_ptr + offs, y_ptr + offs, rank, peer, heap_bases, mask=offs < n)


@triton.jit
def mem_copy(x_ptr, y_ptr, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    trident.copy(x_ptr + offs, y_ptr + offs, peer, peer + 1, rank, heap_bases, mask=offs < n)


@triton.jit
def mem_translate(x_ptr, y_ptr, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    src = trident.translate(x_ptr + offs, rank, peer, heap_bases)
    dst = trident.translate(y_ptr + offs, rank, peer + 1, heap_bases)
    tl.store(dst, tl.load(src, mask=mask), mask=mask)


@triton.jit
def mem_load_peers(x_ptr, y_ptr, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    """``peer`` as a block of ranks (one per lane), which the device API also accepts."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    peers = (peer + offs) % 4
    x = trident.load(x_ptr + offs, rank, peers, heap_bases, mask=mask)
    trident.store(y_ptr + offs, x, rank, peers, heap_bases, mask=mask)


# ---------------------------------------------------------------------------------------------
# Atomics. Scalar atomics on a runtime peer, each on its own word, each old value stored, so the
# compiler cannot turn one into a reduction (`red.`) that returns nothing. One kernel holds many
# atomics (compiling is mostly a per-kernel cost), in a fixed order the test relies on.


@triton.jit
def _atomic(OP: tl.constexpr, ptr, val, cmp, rank, peer, heap_bases, SEM: tl.constexpr, SCOPE: tl.constexpr):
    if OP == "add":
        old = trident.atomic_add(ptr, val, rank, peer, heap_bases, sem=SEM, scope=SCOPE)
    elif OP == "sub":
        old = trident.atomic_sub(ptr, val, rank, peer, heap_bases, sem=SEM, scope=SCOPE)
    elif OP == "xchg":
        old = trident.atomic_xchg(ptr, val, rank, peer, heap_bases, sem=SEM, scope=SCOPE)
    elif OP == "and":
        old = trident.atomic_and(ptr, val, rank, peer, heap_bases, sem=SEM, scope=SCOPE)
    elif OP == "or":
        old = trident.atomic_or(ptr, val, rank, peer, heap_bases, sem=SEM, scope=SCOPE)
    elif OP == "xor":
        old = trident.atomic_xor(ptr, val, rank, peer, heap_bases, sem=SEM, scope=SCOPE)
    elif OP == "min":
        old = trident.atomic_min(ptr, val, rank, peer, heap_bases, sem=SEM, scope=SCOPE)
    elif OP == "max":
        old = trident.atomic_max(ptr, val, rank, peer, heap_bases, sem=SEM, scope=SCOPE)
    else:
        tl.static_assert(OP == "cas", "unknown atomic")
        old = trident.atomic_cas(ptr, cmp, val, rank, peer, heap_bases, sem=SEM, scope=SCOPE)
    return old


@triton.jit
def _atomic_defaults(OP: tl.constexpr, ptr, val, cmp, rank, peer, heap_bases):
    """``OP`` without ``sem``/``scope``: trident's defaults."""
    if OP == "add":
        old = trident.atomic_add(ptr, val, rank, peer, heap_bases)
    elif OP == "sub":
        old = trident.atomic_sub(ptr, val, rank, peer, heap_bases)
    elif OP == "xchg":
        old = trident.atomic_xchg(ptr, val, rank, peer, heap_bases)
    elif OP == "and":
        old = trident.atomic_and(ptr, val, rank, peer, heap_bases)
    elif OP == "or":
        old = trident.atomic_or(ptr, val, rank, peer, heap_bases)
    elif OP == "xor":
        old = trident.atomic_xor(ptr, val, rank, peer, heap_bases)
    elif OP == "min":
        old = trident.atomic_min(ptr, val, rank, peer, heap_bases)
    elif OP == "max":
        old = trident.atomic_max(ptr, val, rank, peer, heap_bases)
    else:
        tl.static_assert(OP == "cas", "unknown atomic")
        old = trident.atomic_cas(ptr, cmp, val, rank, peer, heap_bases)
    return old


@triton.jit
def atomic_matrix(x_ptr, args_ptr, out_ptr, rank, peer, heap_bases, OP: tl.constexpr):
    """``OP`` once for every sem x scope, in the order of the test's SEMS x SCOPES (sem outer)."""
    val = tl.load(args_ptr)
    cmp = tl.load(args_ptr + 1)
    tl.store(out_ptr + 0, _atomic(OP, x_ptr + 0, val, cmp, rank, peer, heap_bases, "relaxed", "cta"))
    tl.store(out_ptr + 1, _atomic(OP, x_ptr + 1, val, cmp, rank, peer, heap_bases, "relaxed", "gpu"))
    tl.store(out_ptr + 2, _atomic(OP, x_ptr + 2, val, cmp, rank, peer, heap_bases, "relaxed", "sys"))
    tl.store(out_ptr + 3, _atomic(OP, x_ptr + 3, val, cmp, rank, peer, heap_bases, "acquire", "cta"))
    tl.store(out_ptr + 4, _atomic(OP, x_ptr + 4, val, cmp, rank, peer, heap_bases, "acquire", "gpu"))
    tl.store(out_ptr + 5, _atomic(OP, x_ptr + 5, val, cmp, rank, peer, heap_bases, "acquire", "sys"))
    tl.store(out_ptr + 6, _atomic(OP, x_ptr + 6, val, cmp, rank, peer, heap_bases, "release", "cta"))
    tl.store(out_ptr + 7, _atomic(OP, x_ptr + 7, val, cmp, rank, peer, heap_bases, "release", "gpu"))
    tl.store(out_ptr + 8, _atomic(OP, x_ptr + 8, val, cmp, rank, peer, heap_bases, "release", "sys"))
    tl.store(out_ptr + 9, _atomic(OP, x_ptr + 9, val, cmp, rank, peer, heap_bases, "acq_rel", "cta"))
    tl.store(out_ptr + 10, _atomic(OP, x_ptr + 10, val, cmp, rank, peer, heap_bases, "acq_rel", "gpu"))
    tl.store(out_ptr + 11, _atomic(OP, x_ptr + 11, val, cmp, rank, peer, heap_bases, "acq_rel", "sys"))


@triton.jit
def atomic_defaults(x_ptr, args_ptr, out_ptr, rank, peer, heap_bases, OPS: tl.constexpr):
    """Each op whose bit is set in ``OPS`` (bit i: the test's OPS[i]), with the default sem and scope."""
    val = tl.load(args_ptr)
    cmp = tl.load(args_ptr + 1)
    if OPS & 1:
        tl.store(out_ptr + 0, _atomic_defaults("add", x_ptr + 0, val, cmp, rank, peer, heap_bases))
    if OPS & 2:
        tl.store(out_ptr + 1, _atomic_defaults("sub", x_ptr + 1, val, cmp, rank, peer, heap_bases))
    if OPS & 4:
        tl.store(out_ptr + 2, _atomic_defaults("xchg", x_ptr + 2, val, cmp, rank, peer, heap_bases))
    if OPS & 8:
        tl.store(out_ptr + 3, _atomic_defaults("and", x_ptr + 3, val, cmp, rank, peer, heap_bases))
    if OPS & 16:
        tl.store(out_ptr + 4, _atomic_defaults("or", x_ptr + 4, val, cmp, rank, peer, heap_bases))
    if OPS & 32:
        tl.store(out_ptr + 5, _atomic_defaults("xor", x_ptr + 5, val, cmp, rank, peer, heap_bases))
    if OPS & 64:
        tl.store(out_ptr + 6, _atomic_defaults("min", x_ptr + 6, val, cmp, rank, peer, heap_bases))
    if OPS & 128:
        tl.store(out_ptr + 7, _atomic_defaults("max", x_ptr + 7, val, cmp, rank, peer, heap_bases))
    if OPS & 256:
        tl.store(out_ptr + 8, _atomic_defaults("cas", x_ptr + 8, val, cmp, rank, peer, heap_bases))


@triton.jit
def cas_literals(x_ptr, out_ptr, rank, peer, heap_bases):
    """atomic_cas with Python ints for cmp and val, as in the docstring's lock example."""
    tl.store(out_ptr, trident.atomic_cas(x_ptr, 0, 1, rank, peer, heap_bases, sem="acquire"))


# ---------------------------------------------------------------------------------------------
# signal / wait.


@triton.jit
def signal_scalar(flag_ptr, out_ptr, rank, peer, heap_bases, OP: tl.constexpr):
    old = trident.signal(flag_ptr, rank + 1, rank, peer, heap_bases, op=OP)
    tl.store(out_ptr, old)


@triton.jit
def signal_block(flag_ptr, out_ptr, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    old = trident.signal(flag_ptr + offs, rank + 1, rank, peer, heap_bases, mask=mask)
    tl.store(out_ptr + offs, old, mask=mask)


@triton.jit
def wait_scalar(flag_ptr, out_ptr, rank, peer, heap_bases):
    seen = trident.wait(flag_ptr, 1, rank, peer, heap_bases)
    tl.store(out_ptr, seen)


@triton.jit
def wait_scalar_sem(flag_ptr, out_ptr, rank, peer, heap_bases, SEM: tl.constexpr, SCOPE: tl.constexpr):
    seen = trident.wait(flag_ptr, 1, rank, peer, heap_bases, sem=SEM, scope=SCOPE)
    tl.store(out_ptr, seen)


@triton.jit
def wait_block(flag_ptr, out_ptr, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    seen = trident.wait(flag_ptr + offs, rank + 1, rank, peer, heap_bases, cmp="ge", mask=mask)
    tl.store(out_ptr + offs, seen, mask=mask)


# ---------------------------------------------------------------------------------------------
# The child process.


def _example_modules():
    modules = {}
    for path in sorted((REPO / "examples").glob("[!_]*.py")):
        spec = importlib.util.spec_from_file_location(f"_sm90_example_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)  # examples run main() only under __main__
        modules[path.name] = module
    return modules


def _resolve(kernel, examples):
    """``"file.py:name"`` is an example kernel, ``":name"`` one of this file, ``"package.module:name"`` any other."""
    where, name = kernel.split(":")
    if not where:
        return globals()[name]
    if where.endswith(".py"):
        return getattr(examples[where], name)
    return getattr(importlib.import_module(where), name)


def _code(ptx):
    """The kernel body of the PTX: no debug sections, no .loc/.file lines, no comments."""
    ptx = ptx.split("$L__func_end")[0].split("\t.section")[0]
    lines = []
    for line in ptx.splitlines():
        line = line.split("//")[0].rstrip()
        stripped = line.strip()
        if not stripped or stripped.startswith((".loc", ".file")):
            continue
        if re.fullmatch(r"\$L__(tmp|func_begin)\d+:", stripped):
            continue
        lines.append(line)
    return "\n".join(lines)


@contextlib.contextmanager
def _captured_output():
    """Send this process's stdout and stderr (file descriptors 1 and 2) to a file; yields its lines' reader."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        lines = []
        try:
            yield lambda: lines
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sink.seek(0)
            lines.extend(sink.read().decode(errors="replace").splitlines())


def compile_all(specs):
    examples = _example_modules()
    found = sorted(f"{file}:{name}" for file, module in examples.items() for name, obj in vars(module).items()
                   if isinstance(obj, JITFunction) and obj.fn.__module__ == module.__name__)
    results = {}
    for spec in specs:
        start = time.perf_counter()
        with _captured_output() as captured:
            try:
                fn = _resolve(spec["kernel"], examples)
                ptx = compile_ptx(fn, spec["signature"], spec.get("constexprs", {}), aligned=spec.get("aligned", []),
                                  num_warps=spec.get("num_warps", 4))
                result = {"ok": True, "ptx": _code(ptx)}
            except Exception as exc:  # one kernel's failure must not hide the others
                result = {"ok": False, "error": "".join(traceback.format_exception_only(type(exc), exc)).strip()}
                cause = exc.__cause__ or exc.__context__
                if cause is not None:
                    result["error"] += "\ncaused by: " + "".join(
                        traceback.format_exception_only(type(cause), cause)).strip()
        if not result["ok"]:
            # MLIR prints its diagnostics (the actual reason) instead of raising them.
            diagnostics = [line for line in captured() if re.search(r"\berror\b", line) and "#loc" not in line]
            result["error"] = "\n".join([result["error"][-3000:]] + list(dict.fromkeys(diagnostics))[:10])
        result["seconds"] = round(time.perf_counter() - start, 3)
        results[spec["name"]] = result
    return {"backend": trident.config.BACKEND, "debug": trident.config.DEBUG, "examples": found, "kernels": results}


def main(argv):
    specs_path, out_path = argv
    if trident.config.BACKEND != "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("run with TRIDENT_BACKEND=cuda and without TRITON_INTERPRET: nothing is compiled otherwise")
    specs = json.loads(Path(specs_path).read_text())
    start = time.perf_counter()
    out = compile_all(specs)
    out["seconds"] = round(time.perf_counter() - start, 2)
    Path(out_path).write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
