"""Small fixes to Triton's CPU interpreter, applied only when the simulator runs.

1. Triton 3.6's interpreter cannot run ``for p in range(world)`` (nor ``tl.range``) when
   ``world`` is a kernel argument: it turns scalar arguments into one-element numpy arrays, and
   its ``tensor.__index__`` calls ``int()`` on them, which numpy 2 refuses for arrays with a
   dimension. Kernels that loop over peers are the bread and butter of multi-GPU code, so the
   simulator makes ``__index__`` take the array's single item (only where the bug is present).
2. The interpreter's atomics lack some types GPUs have (bf16 ``atomic_add``, fp32
   ``atomic_xchg``: "Unsupported data type"), and it adds fp16 under a lock private to one
   process, which is no atomic across ranks. The simulator runs those three as compare-and-swap
   loops on the raw bits, which are real atomics across rank processes.
3. Casts between bf16 and anything but fp32 (``x.to(tl.bfloat16)`` of an int, a Python scalar
   given to a bf16 atomic) reinterpret the number as raw bf16 bits, and fp32 to bf16 truncates
   where GPUs round to nearest even; the simulator goes through fp32 and rounds to nearest even.
4. ``import triton`` before ``import trident`` leaves Triton's own ``@jit`` helpers (``tl.min``,
   ``tl.cdiv``, ...) compiled-mode functions, since ``TRITON_INTERPRET`` was not yet set; called
   from a kernel the simulator runs, they would raise "Cannot call @triton.jit'd outside of the
   scope of a kernel". The simulator runs them as the interpreter runs its own functions.
5. ``tl.dot`` of bf16 blocks multiplies their raw bits (numpy has no bf16: the interpreter keeps
   them as uint16), which gives garbage (Triton 3.6 to 3.9). The simulator widens bf16 operands
   to fp32 first, which is exact, and what the tensor cores compute: bf16 products summed in fp32.
6. The interpreter wraps every exception raised inside a kernel in ``InterpreterError(repr(e))``,
   once per device-function level, so a wait that gives up in the simulator surfaced as an
   ``InterpreterError`` nested four deep with escaped text, which ``except trident.RankTimeoutError``
   does not catch. The simulator's launches re-raise the trident error inside, as it was raised.
7. A comparison's result is labelled with its operands' type (int32, say) although it holds bools,
   so broadcasting a scalar comparison (``mask = block_mask & (tl.load(p) <= n)``) makes an int32
   array, and the ``&`` gives an int32 mask. Triton 3.6's loads and atomics accept it; 3.9's refuse
   it ("mask has unsupported dtype"), and bf16 comparisons would be cast as bf16 bits. The
   simulator labels comparison results int1, as their type says.
8. The interpreter patches ``triton.language`` process-wide for the length of a launch and puts it
   back afterwards, so two threads launching at once (two groups' collectives side by side)
   undid each other's patches: "Did you forget to add @triton.jit?" inside an ``InterpreterError``
   five deep. A kernel waits on peers, so serializing the threads could deadlock across ranks;
   the simulator refuses a launch while another thread's runs, with a ``TridentError`` saying so.
9. A launch copies its arguments through a recursive local function that refers to itself, a
   reference cycle holding a dict of every argument's storage: the heap stayed mapped after
   ``ctx.close()`` until the garbage collector ran. The simulator copies them without the cycle.
10. Casts to fp8 (``x.to(tl.float8e4nv)``, ``tl.float8e5``) round without carrying into the
   exponent (124.5 became 64 where GPUs give 128: Triton 3.6 to 3.9) and wrap past the largest
   value, and casts from fp8 read NaN and Inf codes as numbers. The simulator converts as GPUs do
   (round to nearest even, saturating to the largest finite value, NaN kept), through torch's own
   fp8 types, so a kernel that quantizes gets the bits it gets on a GPU.
11. Every call of a ``@triton.jit`` helper inside a kernel patches ``triton.language`` again
   (``inspect.getmembers`` over ``tl``, ``tl.tensor`` and ``tl.math``), although the launch already
   did and nothing undoes it before the launch ends: 45% of a MoE dispatch's time in the simulator.
   The simulator patches each language module once per launch, with the patches Triton makes.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

_applied = False
#: The thread whose kernel the interpreter runs now (fix-up 8), or None.
_running: list = [None]
_running_lock = threading.Lock()


def _needs_index_fix() -> bool:
    from triton.runtime import interpreter

    fake = type("T", (), {})()
    fake.handle = type("H", (), {"data": np.array([3], dtype=np.int32)})()
    scope = interpreter._LangPatchScope()
    probe = type("Probe", (), {})
    interpreter._patch_lang_tensor(probe, scope)
    try:
        probe.__index__(fake)
        return False
    except TypeError:
        return True
    finally:
        scope.restore()


def apply_in_simulator() -> None:
    """:func:`apply` when this process runs the simulator (``import trident`` calls it, before any
    kernel runs in the interpreter, with or without a context)."""
    from .. import config

    if config.BACKEND == "sim":
        apply()


def apply() -> None:
    """Install the fixes this Triton needs (idempotent)."""
    global _applied
    if _applied:
        return
    _applied = True
    from triton.runtime import interpreter

    _run_compiled_mode_functions_interpreted(interpreter)
    with contextlib.suppress(AttributeError):  # a launcher laid out differently: errors stay wrapped
        _raise_trident_errors_unwrapped(interpreter)
    with contextlib.suppress(AttributeError, TypeError):  # a dot laid out differently: leave it alone
        _widen_bf16_dot_operands(interpreter)
    with contextlib.suppress(AttributeError):
        _label_comparisons_int1(interpreter)
    with contextlib.suppress(AttributeError):  # argument copies laid out differently: leave them alone
        _copy_arguments_without_cycles(interpreter)
    with contextlib.suppress(AttributeError):  # casts laid out differently: leave them alone
        _convert_fp8_as_gpus_do(interpreter)
    with contextlib.suppress(AttributeError):  # patching laid out differently: patch as Triton does
        _patch_language_once_per_launch(interpreter)
    try:
        _install_atomic_fallbacks(interpreter)
        needed = _needs_index_fix()
    except AttributeError:  # a Triton whose interpreter is laid out differently: leave it alone
        return
    if not needed:
        return
    original = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).item()))

    interpreter._patch_lang_tensor = patch_lang_tensor


def _raise_trident_errors_unwrapped(interpreter) -> None:
    """Fix-up 6: a kernel launch re-raises the trident error (wait timeout, device fault) it wraps."""
    from ..errors import TridentError

    original = interpreter.GridExecutor.__call__

    def launch(self, *args, **kwargs):
        me = threading.get_ident()
        with _running_lock:
            other, mine = _running[0], _running[0] == me  # mine: a launch inside this thread's own
            if other is not None and not mine:
                raise TridentError(
                    f"the simulator cannot run kernels from two threads of one process at once (thread {me} "
                    f"launched {getattr(self.fn, '__name__', self.fn)} while thread {other} runs one): Triton's "
                    f"interpreter patches triton.language process-wide during a launch. Launch from one thread "
                    f"at a time in the simulator (on a GPU, streams may overlap)")
            _running[0] = me
        try:
            return original(self, *args, **kwargs)
        except Exception as exc:
            cause = exc
            while cause is not None and not isinstance(cause, TridentError):
                cause = cause.__cause__
            if cause is None:
                raise
            raise cause.with_traceback(cause.__traceback__) from None
        finally:
            if not mine:
                _running[0] = None

    interpreter.GridExecutor.__call__ = launch


def _label_comparisons_int1(interpreter) -> None:
    """Fix-up 7: every ``create_icmp*``/``create_fcmp*`` returns bools labelled int1."""
    import triton.language as tl

    builder = interpreter.InterpreterBuilder

    def labelled(original):
        def compare(self, lhs, rhs):
            out = original(self, lhs, rhs)
            return interpreter.TensorHandle(np.asarray(out.data).astype(np.bool_, copy=False), tl.int1)
        return compare

    for name in [n for n in vars(builder) if n.startswith(("create_icmp", "create_fcmp"))]:
        setattr(builder, name, labelled(getattr(builder, name)))
def _copy_arguments_without_cycles(interpreter) -> None:
    """Fix-up 9: ``GridExecutor._init_args_hst`` / ``_restore_args_dev`` as in Triton 3.6, with the
    storages passed down explicitly instead of through a self-referencing closure."""
    executor, descriptor = interpreter.GridExecutor, interpreter.TensorDescriptor
    tuple_create, unwrap, rewrap = interpreter._tuple_create, interpreter._unwrap_tensor, interpreter._rewrap_tensor
    executor._init_args_hst, executor._restore_args_dev  # noqa: B018 (both exist, or AttributeError: left alone)

    def to_cpu(arg, storages):
        if isinstance(arg, tuple):
            return tuple_create(arg, [to_cpu(a, storages) for a in arg])
        if isinstance(arg, descriptor):
            return descriptor(to_cpu(arg.base, storages), arg.shape, arg.strides, arg.block_shape, arg.padding)
        if not hasattr(arg, "data_ptr"):
            return arg
        t = unwrap(arg)
        key = t.untyped_storage().data_ptr()
        if key not in storages:
            storages[key] = t.untyped_storage().cpu()
        cpu = t.new_empty(0, device="cpu")
        cpu.set_(storages[key], t.storage_offset(), t.size(), t.stride())
        return rewrap(cpu, original_tensor=arg)

    def from_cpu(dev, hst, storages):
        if hasattr(dev, "data_ptr"):
            dev, hst = unwrap(dev), unwrap(hst)
            storages[dev.untyped_storage().data_ptr()] = (dev.untyped_storage(), hst.untyped_storage())
        elif isinstance(dev, tuple):
            for d, h in zip(dev, hst, strict=False):
                from_cpu(d, h, storages)
        elif isinstance(dev, descriptor):
            from_cpu(dev.base, hst.base, storages)

    def init_args_hst(self, args_dev, kwargs):
        storages = {}
        return [to_cpu(a, storages) for a in args_dev], {k: to_cpu(v, storages) for k, v in kwargs.items()}

    def restore_args_dev(self, args_dev, args_hst, kwargs, kwargs_hst):
        storages = {}
        for dev, hst in zip(args_dev, args_hst, strict=False):
            from_cpu(dev, hst, storages)
        for key, dev in kwargs.items():
            from_cpu(dev, kwargs_hst[key], storages)
        for dev, hst in storages.values():
            dev.copy_(hst)

    executor._init_args_hst, executor._restore_args_dev = init_args_hst, restore_args_dev


def _run_compiled_mode_functions_interpreted(interpreter) -> None:
    from triton.runtime.jit import JITFunction

    interpreted = {}

    def call(self, *args, **kwargs):
        if self.fn not in interpreted:
            interpreted[self.fn] = interpreter.InterpretedFunction(self.fn)
        return interpreted[self.fn](*args, **kwargs)

    JITFunction.__call__ = call


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(values: np.ndarray) -> np.ndarray:
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def _cas_loop_rmw(ptrs, vals, mask, sem, combine, bits_dtype):
    """Atomic read-modify-write of each masked lane as a CAS retry loop; returns the old values."""
    from triton._C.libtriton import interpreter as native

    pending = np.array(mask, dtype=bool, copy=True)
    old = np.zeros_like(vals)
    current = native.load(ptrs, pending, np.zeros_like(vals), vals.dtype)
    while pending.any():
        lanes = np.nonzero(pending)[0]
        expected = current[lanes]
        desired = combine(expected, vals[lanes])
        seen = native.atomic_cas(ptrs[lanes], expected.view(bits_dtype), desired.view(bits_dtype), sem)
        seen = seen.view(vals.dtype)
        won = seen.view(bits_dtype) == expected.view(bits_dtype)
        old[lanes[won]] = seen[won]
        pending[lanes[won]] = False
        current[lanes[~won]] = seen[~won]
    return old


def _install_atomic_fallbacks(interpreter) -> None:
    import triton.language as tl
    from triton._C.libtriton import interpreter as native

    builder = interpreter.InterpreterBuilder
    original = builder.create_atomic_rmw

    def create_atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope):
        op = self.ir_rmw_op_to_interpreter_rmw_op.get(rmwOp)
        scalar = val.dtype.scalar
        if scalar == tl.bfloat16 and op == native.RMW_OP.FADD:
            combine = lambda old, v: _f32_to_bf16(_bf16_to_f32(old) + _bf16_to_f32(v))  # noqa: E731
            bits = np.uint16
        elif scalar == tl.float16 and op == native.RMW_OP.FADD:
            combine, bits = (lambda old, v: (old + v).astype(np.float16)), np.uint16
        elif scalar == tl.float32 and op == native.RMW_OP.XCHG:
            combine, bits = (lambda old, v: v), np.uint32
        else:
            return original(self, rmwOp, ptr, val, mask, sem, scope)
        flat = [np.ravel(a) for a in (ptr.data, val.data, mask.data)]
        old = _cas_loop_rmw(*flat, self.ir_sem_to_interpreter_sem[sem], combine, bits)
        return interpreter.TensorHandle(old.reshape(np.shape(val.data)), scalar)

    builder.create_atomic_rmw = create_atomic_rmw
    original_cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        if dst_ty == tl.bfloat16 and src_ty != tl.bfloat16:
            return interpreter.TensorHandle(_f32_to_bf16(np.asarray(src.data).astype(np.float32)), dst_ty)
        if src_ty == tl.bfloat16 and dst_ty not in (tl.bfloat16, tl.float32):
            values = _bf16_to_f32(np.asarray(src.data))
            return original_cast(self, interpreter.TensorHandle(values, tl.float32), dst_type)
        return original_cast(self, src, dst_type)

    builder.cast_impl = cast_impl


def _bf16_dot_is_wrong(interpreter) -> bool:
    """Whether the interpreter's ``tl.dot`` gets ``[[1.0]] @ [[1.0]]`` in bf16 wrong."""
    import triton.language as tl

    one = interpreter.TensorHandle(np.array([[0x3F80]], dtype=np.uint16), tl.bfloat16)  # 1.0 in bf16
    acc = interpreter.TensorHandle(np.zeros((1, 1), dtype=np.float32), tl.float32)
    got = interpreter.InterpreterBuilder().create_dot(one, one, acc, None, None)
    return float(np.asarray(got.data).item()) != 1.0


def _widen_bf16_dot_operands(interpreter) -> None:
    import triton.language as tl

    if not _bf16_dot_is_wrong(interpreter):
        return
    builder = interpreter.InterpreterBuilder
    original = builder.create_dot

    def wide(handle):
        if handle.dtype.scalar == tl.bfloat16:
            return interpreter.TensorHandle(_bf16_to_f32(np.asarray(handle.data)), tl.float32)
        return handle

    def create_dot(self, a, b, *rest, **kwargs):
        return original(self, wide(a), wide(b), *rest, **kwargs)

    builder.create_dot = create_dot


def _convert_fp8_as_gpus_do(interpreter) -> None:
    """Fix-up 10: float <-> fp8 casts through torch's fp8 types, saturating as ``cvt.rn.satfinite`` does."""
    import triton.language as tl

    fp8 = {tl.float8e4nv: ("float8_e4m3fn", 448.0), tl.float8e5: ("float8_e5m2", 57344.0)}  # torch's type, max
    floats = (tl.float32, tl.float16, tl.bfloat16)
    builder = interpreter.InterpreterBuilder
    original = builder.create_fp_to_fp

    def as_f32(handle) -> np.ndarray:
        data = np.asarray(handle.data)
        return _bf16_to_f32(data) if handle.dtype.scalar == tl.bfloat16 else data.astype(np.float32)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        nearest = rounding_mode is None or getattr(rounding_mode, "name", "") == "RTNE"  # not an explicit RTZ
        if dst_ty in fp8 and src_ty in floats and nearest:
            import torch  # here, on an fp8 cast: `import trident` without a GPU stays torch-free (trident run)

            name, top = fp8[dst_ty]
            kind = getattr(torch, name)
            values = torch.from_numpy(np.clip(as_f32(src), -top, top))  # NaN stays NaN
            return interpreter.TensorHandle(values.to(kind).view(torch.uint8).numpy(), dst_ty)
        if src_ty in fp8 and dst_ty in floats:
            import torch

            kind = getattr(torch, fp8[src_ty][0])
            values = torch.from_numpy(np.ascontiguousarray(src.data).view(np.uint8)).view(kind).float().numpy()
            if dst_ty == tl.bfloat16:
                return interpreter.TensorHandle(_f32_to_bf16(values), dst_ty)
            return interpreter.TensorHandle(values.astype(np.float16 if dst_ty == tl.float16 else np.float32), dst_ty)
        return original(self, src, dst_type, rounding_mode)

    builder.create_fp_to_fp = create_fp_to_fp


def _patch_language_once_per_launch(interpreter) -> None:
    """Fix-up 11: inside a launch, ``_patch_lang`` patches only language modules the launch has not
    patched yet; the launch's own patch (the first) is undone at its end as before."""
    import triton.language as tl

    original_patch, original_launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    languages = (tl, tl.core)
    patched: list = [None]  # ids of the language modules the running launch has patched; None outside one

    def patch_lang(fn):
        visible = {id(v) for v in fn.__globals__.values() if any(v is lang for lang in languages)}
        if patched[0] is not None and visible and visible <= patched[0]:
            return interpreter._LangPatchScope()  # nothing new to patch: restoring it undoes nothing
        scope = original_patch(fn)
        if patched[0] is not None:
            patched[0] |= visible
        return scope

    def launch(self, *args, **kwargs):
        outer, patched[0] = patched[0], set()
        try:
            return original_launch(self, *args, **kwargs)
        finally:
            patched[0] = outer

    interpreter._patch_lang = patch_lang
    interpreter.GridExecutor.__call__ = launch
