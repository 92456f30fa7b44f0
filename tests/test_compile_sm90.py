"""The device API compiles for a real GPU target (sm_90), and the PTX says what trident promises.

CI has no GPU, so every other test runs trident's device functions in Triton's interpreter, which
never compiles them. Triton can still compile for an NVIDIA target without a GPU, so this test
builds kernels using every device function for sm_90 (``GPUTarget("cuda", 90, 32)``) and reads
the PTX. The compiling happens in child processes (tests/sm90_kernels.py) started with
``TRIDENT_BACKEND=cuda``: this pytest process already runs in interpreter mode, and trident picks
the mode once, at import. One child builds everything normally and one with ``TRIDENT_DEBUG=1``
(bounds checks on every translated access); they run side by side with a fresh Triton cache.

What the PTX must show:

* translated load/store/get/put/copy/translate of fp16 (BLOCK=1024, num_warps=4) keep the same
  16-byte vector accesses (``ld.global.v4.b32`` / ``st.global.v4.b32``) as a plain tl.load/tl.store
  copy compiled the same way, and no 2-byte ones;
* every atomic carries the requested ``sem`` and ``scope`` (PTX spells them ``.relaxed``,
  ``.acquire``, ``.release``, ``.acq_rel`` and ``.cta``, ``.gpu``, ``.sys``; Triton 3.6 writes
  ``atom.global.<scope>.<sem>.<op>`` but ``atom.global.<sem>.<scope>.cas``, so order is not
  checked), the right operation and the element width; the defaults are acq_rel and sys;
* signal starts with a CTA barrier (``bar.sync``) and is a release/sys exchange (or add); wait
  spins in a loop that reads ``%globaltimer`` and whose global loads are all volatile or ordered
  (the flag poll, and the host's abort word with a volatile load), and reads the flag with the
  requested sem/scope (acquire/sys by default); the device barrier does both;
* the debug build has more instructions than the normal one (the bounds check, and the atomic that
  records a fault), while a kernel without trident calls compiles the same either way.

Element types: Triton 3.6 (through trident's wrappers, sm_90) accepts
  add, sub:                 int32, int64, uint32, uint64, fp16, bf16, fp32, fp64
  xchg, and, or, xor:       int32, int64, uint32, uint64, fp32, fp64 (and/or/xor act on the bits)
  min, max:                 int32, int64, uint32, uint64, fp32, fp64 (floats become a signed
                            max/min plus an unsigned min/max atomic on the bits)
  cas:                      int16, uint16, fp16, bf16, int32, int64, uint32, uint64, fp32, fp64
and rejects at compile time (CompilationError from ValueError "atomic_<op> does not support <type>"): fp16 and bf16 for
xchg/and/or/xor/min/max; int16 and uint16 for everything but cas; int8, uint8, int1 and fp8 for
everything, cas included ("atomic_cas only supports elements with width {16, 32, 64}").
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.sm90_harness import child_environment

REPO = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "sm90_kernels.py"
MODES = ("normal", "debug")
CHILD_TIMEOUT_S = 300

SEMS = ("relaxed", "acquire", "release", "acq_rel")
SCOPES = ("cta", "gpu", "sys")
OPS = ("add", "sub", "xchg", "and", "or", "xor", "min", "max", "cas")
BITS = {"i16": 16, "u16": 16, "fp16": 16, "bf16": 16, "i32": 32, "u32": 32, "fp32": 32,
        "i64": 64, "u64": 64, "fp64": 64}
_WORDS = ("i32", "i64", "u32", "u64", "fp32", "fp64")
# What Triton 3.6 accepts (see the module docstring for what it rejects).
ACCEPTED = {
    "add": _WORDS + ("fp16", "bf16"),
    "sub": _WORDS + ("fp16", "bf16"),
    "xchg": _WORDS, "and": _WORDS, "or": _WORDS, "xor": _WORDS, "min": _WORDS, "max": _WORDS,
    "cas": _WORDS + ("i16", "u16", "fp16", "bf16"),
}
# Built for every sem x scope; every accepted type is also built once with the defaults.
FULL_MATRIX = {op: ("i32", "i64") for op in OPS}
FULL_MATRIX["add"] = ("i32", "i64", "fp32", "fp16", "bf16")
FULL_MATRIX["xchg"] = ("i32", "i64", "fp32")
# The PTX operation each trident atomic becomes (sub adds the negated value).
PTX_OP = {"add": "add", "sub": "add", "xchg": "exch", "and": "and", "or": "or", "xor": "xor",
          "min": "min", "max": "max", "cas": "cas"}


def _ptx_ops(op, dtype):
    """The PTX atomics one trident atomic becomes: float min/max are a max/min pair on the bits."""
    if op in ("min", "max") and dtype.startswith("fp"):
        return ("min", "max")
    return (PTX_OP[op],)


# Kernels that do not compile because of a trident bug: (text of the error, why). Their tests xfail
# while the error is this one, and fail once they compile, so the entry gets removed with the fix.
KNOWN_BUGS: dict = {}  # kernel name -> (error text, why): expected to fail until fixed

MEM_OPS = ("load", "store", "get", "put", "copy", "translate", "load_peers")
MEM_SIG = {"x_ptr": "*fp16", "y_ptr": "*fp16", "n": "i32", "rank": "i32", "peer": "i32",
           "heap_bases": "*i64", "BLOCK": "constexpr"}
# As Triton's launcher would specialize them: tensors from the heap are 16-byte aligned, n % 16 == 0.
MEM_ALIGNED = ["x_ptr", "y_ptr", "n", "heap_bases"]

#: Example kernels that call nothing of trident's (the debug mode leaves them as they are).
PLAIN_EXAMPLES = ("moe_layer.py:grouped_gemm_kernel",)

# Every @triton.jit kernel in examples/*.py, with a signature to build it with.
EXAMPLES = {
    "03_atomics.py:count_kernel": ({"counter_ptr": "*i32", "max_ptr": "*i32", "rank": "i32", "heap_bases": "*i64"},
                                   {}),
    "03_atomics.py:ticket_kernel": ({"next_ptr": "*i64", "ticket_ptr": "*i64", "rank": "i32", "heap_bases": "*i64"},
                                    {}),
    "demo.py:all_gather_then_sum_kernel": (
        {"block_ptr": "*fp32", "full_ptr": "*fp32", "flags_ptr": "*i32", "sums_ptr": "*fp32", "rows": "i32",
         "cols": "i32", "rank": "i32", "world_size": "i32", "heap_bases": "*i64", "BLOCK_R": "constexpr",
         "BLOCK_C": "constexpr"},
        {"BLOCK_R": 32, "BLOCK_C": 64}),
    "05_fused_allreduce_rmsnorm.py:allreduce_add_rmsnorm_kernel": (
        {"partial_ptr": "*fp32", "residual_ptr": "*fp32", "weight_ptr": "*fp32", "out_ptr": "*fp32", "tokens": "i32",
         "hidden": "i32", "eps": "fp32", "slots_ptr": "*i64", "epochs_ptr": "*i64", "rank": "i32",
         "world_size": "i32", "heap_bases": "*i64", "BLOCK": "constexpr", "WORLD_BLOCK": "constexpr"},
        {"BLOCK": 256, "WORLD_BLOCK": 8}),
    "06_gemm_all_scatter.py:gemm_all_scatter_kernel": (
        {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32",
         "stride_ak": "i32", "stride_bk": "i32", "stride_bn": "i32", "stride_cm": "i32", "rank": "i32",
         "world_size": "i32", "heap_bases": "*i64", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
         "BLOCK_K": "constexpr", "GROUP_M": "constexpr"},
        {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}),
    "01_load_store.py:shift_right_kernel": (
        {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "rank": "i32", "world_size": "i32", "heap_bases": "*i64",
         "BLOCK": "constexpr"},
        {"BLOCK": 256}),
    "04_message_passing.py:ring_kernel": (
        {"data_ptr": "*fp32", "inbox_ptr": "*fp32", "flag_ptr": "*i32", "out_ptr": "*fp32", "n": "i32",
         "rank": "i32", "world_size": "i32", "heap_bases": "*i64", "BLOCK": "constexpr"},
        {"BLOCK": 128}),
    "04_message_passing.py:to_root_kernel": (
        {"data_ptr": "*fp32", "slots_ptr": "*fp32", "count_ptr": "*i32", "n": "i32", "rank": "i32",
         "world_size": "i32", "heap_bases": "*i64", "BLOCK": "constexpr"},
        {"BLOCK": 128}),
    "02_put_get.py:gather_kernel": (
        {"src_ptr": "*fp32", "dst_ptr": "*fp32", "n": "i32", "rank": "i32", "heap_bases": "*i64",
         "BLOCK": "constexpr"},
        {"BLOCK": 128}),
    "02_put_get.py:scatter_kernel": (
        {"src_ptr": "*fp32", "total": "i32", "rank": "i32", "heap_bases": "*i64", "BLOCK": "constexpr"},
        {"BLOCK": 128}),
    "moe_layer.py:grouped_gemm_kernel": (
        {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "offsets_ptr": "*i32", "counts_ptr": "*i32",
         "K": "i32", "N": "i32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"},
        {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32}),
}


def _build_specs():
    """Every kernel the children build, by name. ``meta`` is what the assertions need."""
    specs = {}

    def add(name, kernel, signature, constexprs=None, aligned=(), num_warps=4, **meta):
        assert name not in specs, name
        specs[name] = {"name": name, "kernel": kernel, "signature": signature, "constexprs": constexprs or {},
                       "aligned": list(aligned), "num_warps": num_warps, "meta": meta}

    for op in ("ref",) + MEM_OPS:
        add(f"mem-{op}", f":mem_{op}", MEM_SIG, {"BLOCK": 1024}, MEM_ALIGNED, kind="mem")

    def atomic_sig(dtype, constexpr):
        return {"x_ptr": f"*{dtype}", "args_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "rank": "i32",
                "peer": "i32", "heap_bases": "*i64", constexpr: "constexpr"}

    # One kernel per op and type with all 12 sem x scope combinations, in SEMS x SCOPES order.
    for op in OPS:
        for dtype in FULL_MATRIX[op]:
            groups = [[(sem, scope, ptx_op) for ptx_op in _ptx_ops(op, dtype)] for sem in SEMS for scope in SCOPES]
            add(f"atomic-{op}-{dtype}", ":atomic_matrix", atomic_sig(dtype, "OP"), {"OP": op}, num_warps=1,
                kind="atomic", dtype=dtype, groups=groups)
    # One kernel per type with every op Triton accepts for it, sem and scope left to trident's defaults.
    for dtype in BITS:
        ops = [op for op in OPS if dtype in ACCEPTED[op]]
        groups = [[("acq_rel", "sys", ptx_op) for ptx_op in _ptx_ops(op, dtype)] for op in ops]
        add(f"atomic-defaults-{dtype}", ":atomic_defaults", atomic_sig(dtype, "OPS"),
            {"OPS": sum(1 << OPS.index(op) for op in ops)}, num_warps=1, kind="atomic", dtype=dtype, groups=groups)
    for dtype in ("i32", "i64"):
        add(f"cas-literals-{dtype}", ":cas_literals",
            {"x_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "rank": "i32", "peer": "i32", "heap_bases": "*i64"},
            num_warps=1, kind="atomic", dtype=dtype, groups=[[("acquire", "sys", "cas")]])

    flag_sig = {"flag_ptr": None, "out_ptr": None, "rank": "i32", "peer": "i32", "heap_bases": "*i64"}
    block_sig = {"flag_ptr": None, "out_ptr": None, "n": "i32", "rank": "i32", "peer": "i32", "heap_bases": "*i64",
                 "BLOCK": "constexpr"}
    for dtype in ("i32", "i64"):
        def sig(base, **extra):
            return {**{k: (v or f"*{dtype}") for k, v in base.items()}, **extra}

        for op in ("set", "add"):
            add(f"signal-scalar-{op}-{dtype}", ":signal_scalar", sig(flag_sig, OP="constexpr"),
                {"OP": op}, kind="signal", op=op, dtype=dtype, count=1)
        add(f"signal-block-{dtype}", ":signal_block", sig(block_sig), {"BLOCK": 64},
            kind="signal", op="set", dtype=dtype, count=None)
        add(f"wait-scalar-{dtype}", ":wait_scalar", sig(flag_sig), kind="wait", dtype=dtype,
            sem="acquire", scope="sys")
        add(f"wait-scalar-acq_rel-gpu-{dtype}", ":wait_scalar_sem",
            sig(flag_sig, SEM="constexpr", SCOPE="constexpr"), {"SEM": "acq_rel", "SCOPE": "gpu"}, kind="wait",
            dtype=dtype, sem="acq_rel", scope="gpu")
        add(f"wait-block-ge-{dtype}", ":wait_block", sig(block_sig), {"BLOCK": 64}, kind="wait",
            dtype=dtype, sem="acquire", scope="sys")

    add("device_barrier_kernel", "trident.kernels.barrier:device_barrier_kernel",
        {"rank": "i32", "world_size": "i32", "heap_bases": "*i64", "WORLD_BLOCK": "constexpr"}, {"WORLD_BLOCK": 8},
        kind="barrier")
    add("group_barrier_kernel", "trident.kernels.barrier:group_barrier_kernel",
        {"words_ptr": "*i64", "rank": "i32", "world_size": "i32", "heap_bases": "*i64", "WORLD_BLOCK": "constexpr"},
        {"WORLD_BLOCK": 8}, kind="barrier")
    for kernel, (signature, constexprs) in EXAMPLES.items():
        add(f"example-{kernel.replace('.py:', '-')}", kernel, signature, constexprs, kind="example",
            plain=kernel in PLAIN_EXAMPLES)
    return specs


SPECS = _build_specs()
NAMES = sorted(SPECS)


def _names(kind):
    return [name for name in NAMES if SPECS[name]["meta"]["kind"] == kind]


# ---------------------------------------------------------------------------------------------
# Reading PTX.

_ATOM = re.compile(r"\b(atom|red)\.global\.([\w.:]+)\s")
_ORDERED_READ = re.compile(r"\b(atom|ld)\.global\.([\w.:]+)\s")
_VEC_LD = re.compile(r"\bld\.global(?:\.[\w:]+)*?\.v4\.[bfsu]32\b")
_VEC_ST = re.compile(r"\bst\.global(?:\.[\w:]+)*?\.v4\.[bfsu]32\b")
_NARROW = re.compile(r"\b(?:ld|st)\.global(?:\.[\w:]+)*?\.[bfsu]16\b")
# A global load with its qualifiers: ld.global.b32, ld.volatile.global.b32, ld.global.gpu.relaxed.b32, ...
_GLOBAL_LOAD = re.compile(r"\bld\.((?:[\w:]+\.)*global(?:\.[\w:]+)*)\s")
_PTX_OPS = {"add", "exch", "and", "or", "xor", "min", "max", "cas", "inc", "dec"}
# The atomic with which a debug-mode bounds check records the first fault (memory.record_fault).
FAULT_RECORD = ("atom", "relaxed", "gpu", "add", 64)


def width(quals):
    """Element width from a PTX type qualifier (``u32``, ``b64``, ``f16``, ``bf16``...), else None."""
    match = re.fullmatch(r"(?:b|s|u|f|bf)(\d+)", quals[-1])
    return int(match.group(1)) if match else None


def _summary(kind, quals):
    quals = quals.split(".")

    def pick(names):
        return next((q for q in quals if q in names), None)

    return (kind, pick(SEMS), pick(SCOPES), pick(_PTX_OPS), width(quals))


def atomics(ptx):
    """Every global atomic/reduction, in PTX order, as (``"atom"``/``"red"``, sem, scope, op, width)."""
    return [_summary(kind, quals) for kind, quals in _ATOM.findall(ptx)]


def instructions(ptx):
    return [line.strip() for line in ptx.splitlines()
            if line.strip().endswith(";") and not line.strip().startswith((".", "{", "}"))]


def loop_bodies(ptx):
    """The text from each branch target to every later branch back to it."""
    lines = ptx.splitlines()
    labels, bodies = {}, []
    for i, line in enumerate(lines):
        match = re.match(r"\s*(\$L__BB\w+):", line)
        if match:
            labels[match.group(1)] = i
        match = re.search(r"\bbra(?:\.uni)?\s+(\$L__BB\w+);", line)
        if match and match.group(1) in labels:
            bodies.append("\n".join(lines[labels[match.group(1)]:i + 1]))
    return bodies


def describe(ptx, pattern=r"\b(atom|red|ld|st)\.global"):
    return "\n".join(line for line in instructions(ptx) if re.search(pattern, line)) or "(none)"


# ---------------------------------------------------------------------------------------------
# The children.


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Compile every kernel in SPECS twice (normal and debug), in two child processes at once."""
    tmp = tmp_path_factory.mktemp("sm90")
    specs_path = tmp / "specs.json"
    specs_path.write_text(json.dumps([{k: v for k, v in spec.items() if k != "meta"} for spec in SPECS.values()]))
    # One fresh cache: everything is really compiled, and the two modes cannot share a stale entry.
    base_env = child_environment(tmp)
    procs = {}
    start = time.perf_counter()
    for mode in MODES:
        env = {**base_env, "TRIDENT_DEBUG": "1" if mode == "debug" else "0"}
        procs[mode] = subprocess.Popen([sys.executable, str(CHILD), str(specs_path), str(tmp / f"{mode}.json")],
                                       env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    results, failures = {}, []
    for mode, proc in procs.items():
        try:
            output, _ = proc.communicate(timeout=max(1.0, CHILD_TIMEOUT_S - (time.perf_counter() - start)))
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
            failures.append(f"{mode} child timed out after {CHILD_TIMEOUT_S} s:\n{output[-3000:]}")
            continue
        if proc.returncode != 0:
            failures.append(f"{mode} child exited with {proc.returncode}:\n{output[-5000:]}")
            continue
        results[mode] = json.loads((tmp / f"{mode}.json").read_text())
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)
    return results


def _ptx(builds, mode, name):
    result = builds[mode]["kernels"][name]
    bug = KNOWN_BUGS.get(name)
    if bug and not result["ok"] and bug[0] in result["error"]:
        pytest.xfail(bug[1])
    if bug and result["ok"]:
        pytest.fail(f"{name} ({mode}) compiles now: remove it from KNOWN_BUGS", pytrace=False)
    if not result["ok"]:
        pytest.fail(f"{name} ({mode}) does not compile for sm_90:\n{result['error']}", pytrace=False)
    return result["ptx"]


# ---------------------------------------------------------------------------------------------
# The tests.


def test_children_compiled_in_the_right_mode(builds):
    for mode in MODES:
        assert builds[mode]["backend"] == "cuda"
        assert builds[mode]["debug"] is (mode == "debug")
        assert set(builds[mode]["kernels"]) == set(SPECS)


def test_every_example_kernel_is_built(builds):
    built = {spec["kernel"] for spec in SPECS.values() if spec["meta"]["kind"] == "example"}
    assert set(builds["normal"]["examples"]) == built, "add new example kernels to EXAMPLES"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", NAMES)
def test_compiles_for_sm90(builds, mode, name):
    assert instructions(_ptx(builds, mode, name))


@pytest.mark.parametrize("op", [op for op in MEM_OPS if op != "load_peers"])  # one peer per lane: no promise
def test_translated_accesses_keep_16_byte_vectors(builds, op):
    ref = _ptx(builds, "normal", "mem-ref")
    ptx = _ptx(builds, "normal", f"mem-{op}")
    ref_ld, ref_st = len(_VEC_LD.findall(ref)), len(_VEC_ST.findall(ref))
    assert ref_ld > 0 and ref_st > 0 and not _NARROW.search(ref), f"the reference copy is not vectorized:\n{ref}"
    got = (len(_VEC_LD.findall(ptx)), len(_VEC_ST.findall(ptx)))
    assert got == (ref_ld, ref_st) and not _NARROW.search(ptx), (
        f"trident.{op} of fp16 lost its 16-byte accesses: {got[0]} ld.global.v4 and {got[1]} st.global.v4 "
        f"(plain tl.load/tl.store: {ref_ld} and {ref_st}); its global accesses:\n{describe(ptx)}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", _names("atomic"))
def test_atomic_carries_sem_and_scope(builds, mode, name):
    """Each trident atomic of the kernel is its PTX atomic(s) with the sem, scope and width asked for."""
    meta = SPECS[name]["meta"]
    ptx = _ptx(builds, mode, name)
    bits = BITS[meta["dtype"]]
    groups = [[("atom", sem, scope, op, bits) for sem, scope, op in group] for group in meta["groups"]]
    expected = Counter(a for group in groups for a in group)
    found = atomics(ptx)
    if mode == "debug":
        # Every trident atomic first checks its address; it records a fault with one more atomic.
        expected[FAULT_RECORD] += len(groups)
    assert Counter(found) == expected, (
        f"{name} ({mode}): atomics differ from what was asked for.\nmissing: {dict(expected - Counter(found))}\n"
        f"unexpected: {dict(Counter(found) - expected)}\nPTX atomics:\n{describe(ptx, _ATOM.pattern)}")
    if mode == "normal":  # and in program order: pins which call got which sem/scope
        at = 0
        for group in groups:
            assert Counter(found[at:at + len(group)]) == Counter(group), (
                f"{name}: atomics {at}.. are {found[at:at + len(group)]}, expected {group} (program order)")
            at += len(group)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", _names("signal"))
def test_signal_is_a_barrier_then_a_release_sys_atomic(builds, mode, name):
    meta = SPECS[name]["meta"]
    ptx = _ptx(builds, mode, name)
    found = atomics(ptx)
    if mode == "debug":
        assert FAULT_RECORD in found, f"no fault-recording atomic in the debug build:\n{describe(ptx)}"
        found = [a for a in found if a != FAULT_RECORD]
    want = ("atom", "release", "sys", "exch" if meta["op"] == "set" else "add", BITS[meta["dtype"]])
    assert found and set(found) == {want}, f"expected only {want}, got {found}:\n{describe(ptx, _ATOM.pattern)}"
    if meta["count"] is not None:
        assert len(found) == meta["count"], describe(ptx, _ATOM.pattern)
    if mode == "debug":
        return  # the bounds check before the atomic has barriers of its own: the check below would prove nothing
    # The atomic is issued by one thread per flag: a CTA barrier before it orders every thread's stores.
    body = instructions(ptx)
    first = next(i for i, line in enumerate(body) if re.search(r"\batom\.global\.", line) and ".release." in line)
    assert any(line.startswith("bar.sync") for line in body[:first]), f"no CTA barrier before the release:\n{ptx}"


def _check_wait(ptx, sem, scope, bits):
    """The spin loop reads the clock, polls with volatile/ordered accesses only, and the flag is acquired."""
    spins = [body for body in loop_bodies(ptx) if "%globaltimer" in body]
    assert spins, f"no loop that reads %globaltimer (the wait's timeout clock):\n{ptx}"
    spin = spins[0]
    loads = [m.group(1).split(".") for m in _GLOBAL_LOAD.finditer(spin)]
    plain = [".".join(quals) for quals in loads if not {"volatile", "relaxed", "acquire"} & set(quals)]
    assert not plain, f"a plain (cacheable, hoistable) global load in the wait loop: {plain}\n{spin}"
    assert any({"volatile", "relaxed"} & set(quals) for quals in loads), f"no volatile/relaxed load in:\n{spin}"
    # Every pass reads the flag and the host's abort word (int64): loads as above, or atomics.
    reads = Counter([width(quals) for quals in loads] + [a[4] for a in atomics(spin)])
    assert not Counter([bits, 64]) - reads, f"the wait loop does not poll a {bits}-bit flag and the abort word:\n{spin}"
    ordered = [m.group(0) for m in _ORDERED_READ.finditer(ptx)
               if _summary(m.group(1), m.group(2))[1:3] == (sem, scope) and width(m.group(2).split(".")) == bits]
    assert ordered, f"no {sem}/{scope} read of the {bits}-bit flag:\n{describe(ptx)}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", _names("wait"))
def test_wait_spins_on_a_volatile_load_with_a_timeout(builds, mode, name):
    meta = SPECS[name]["meta"]
    _check_wait(_ptx(builds, mode, name), meta["sem"], meta["scope"], BITS[meta["dtype"]])


@pytest.mark.parametrize("kernel", ["device_barrier_kernel", "group_barrier_kernel"])
@pytest.mark.parametrize("mode", MODES)
def test_device_barrier(builds, mode, kernel):
    ptx = _ptx(builds, mode, kernel)
    releases = [a for a in atomics(ptx) if a[3] == "exch"]
    assert releases and set(releases) == {("atom", "release", "sys", "exch", 64)}, describe(ptx, _ATOM.pattern)
    _check_wait(ptx, "acquire", "sys", 64)


@pytest.mark.parametrize("name", [name for name in NAMES if name != "mem-ref" and not SPECS[name]["meta"].get("plain")])
def test_debug_build_adds_bounds_checks(builds, name):
    normal, debug = _ptx(builds, "normal", name), _ptx(builds, "debug", name)
    n_normal, n_debug = len(instructions(normal)), len(instructions(debug))
    assert n_debug > n_normal, f"TRIDENT_DEBUG=1 build of {name} has {n_debug} instructions, normal {n_normal}"
    if SPECS[name]["meta"]["kind"] in ("mem", "atomic"):
        # The bounds check's fault record is the difference: the normal build has no such atomic.
        assert atomics(debug).count(FAULT_RECORD) > atomics(normal).count(FAULT_RECORD)


def test_debug_mode_changes_only_trident_code(builds):
    """The control: a kernel without trident calls compiles the same with and without TRIDENT_DEBUG."""
    for name in ["mem-ref"] + [n for n in NAMES if SPECS[n]["meta"].get("plain")]:
        assert instructions(_ptx(builds, "normal", name)) == instructions(_ptx(builds, "debug", name)), name
