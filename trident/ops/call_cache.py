"""The fused ops' small-call path: what a call decided and launched, kept per key.

A fused op's call first checks its operands, then decides (``auto``'s pattern, the tile config,
the communication programs), then launches through Triton's own launch path, which binds and
specializes every argument again: well over 100 us of Python on the host for a call whose GEMM
may take 10 us on the device. A decode loop calls the op on the same buffers every step, so the
answers never change.

The key of a call holds the operands' addresses, shapes, strides and dtypes and the options, so
every check the first call passed holds again for a call with the same key. Two levels:

* :func:`replay`: the launches (and staging copies) of the first call, recorded through
  :meth:`FusedCall.launch` / :meth:`FusedCall.copy`, run again through the compiled kernels'
  own launchers (:mod:`trident.kernels.prepared`). Only the patterns an op lists as
  ``replayable`` are recorded (their every launch goes through the call), and only while the
  heap buffers they launched on stay where they were: a recording is replayed in the
  generation of the context's resources it was made in (a buffer that grew, or a
  ``heap_scope`` that ended, starts a new one);
* :func:`recall`: the decisions of the first call, bound to this call's tensors, for the other
  patterns (which then launch normally).

Recordings hold addresses, never tensors, so the cache keeps no memory alive (in the simulator a
recorded launch is the interpreter's call again, holding its tensors). Calls with a trace, and
every call in the debug mode, take the full path.

Example::

    key = call_key(ctx, GEMM_ALL_SCATTER, A, B_local, C, pattern, config, comm_programs, trace)
    if replay(ctx, key):
        return C
    call = recall(ctx, key, A, B_local, C)
    if call is None:
        _check_gemm_all_scatter_args(...)
        call = prepare_call(...)
        remember(ctx, key, call)
    run(ctx, key, call)
"""

from __future__ import annotations

import dataclasses

from ..kernels.prepared import Plan, PlanCache, plan_key
from .fused_call import FusedCall

#: The key of the cache (a bounded :class:`~trident.kernels.prepared.PlanCache`) among the context's resources.
RESOURCE_KEY = "ops.calls"


class _Remembered:
    """One key's entry: the decisions (a :class:`FusedCall` without tensors) and, once recorded,
    the launches with the resources' generation they were recorded in."""

    __slots__ = ("call", "plan", "generation")

    def __init__(self, call: FusedCall):
        self.call, self.plan, self.generation = call, None, -1


def call_key(ctx, spec, A, B, C, pattern, config, comm_programs, trace):
    """The key of one call of ``spec`` (None: this call takes the full path: a trace, the debug mode,
    or an argument that is not a tensor where one is expected)."""
    if trace is not None or ctx.debug:
        return None
    return plan_key(spec.name, A, B, C, pattern, config, comm_programs)


def replay(ctx, key) -> bool:
    """Run the launches recorded for ``key`` again, if there are any and the buffers they launched
    on are still in place; True when they ran (the call is done)."""
    if key is None:
        return False
    entry = ctx.resource(RESOURCE_KEY, PlanCache).get(key)
    if entry is None or entry.plan is None or entry.generation != ctx._resources.generation:
        return False
    entry.plan()
    return True


def recall(ctx, key, A, B, C) -> FusedCall | None:
    """The call remembered for ``key``, bound to this call's ``A``, ``B`` and ``C``; None if none."""
    if key is None:
        return None
    entry = ctx.resource(RESOURCE_KEY, PlanCache).get(key)
    return None if entry is None else dataclasses.replace(entry.call, A=A, B=B, C=C)


def remember(ctx, key, call: FusedCall) -> None:
    """Keep ``call``'s decisions for ``key`` (its tensors are not kept)."""
    if key is None:
        return
    cache = ctx.resource(RESOURCE_KEY, PlanCache)
    if cache.get(key) is None:
        cache.put(key, _Remembered(dataclasses.replace(call, A=None, B=None, C=None, plan=None)))


def run(ctx, key, call: FusedCall) -> None:
    """Run ``call``; when its pattern is replayable, record its launches so that the next call with
    ``key`` replays them (:func:`replay`)."""
    entry = None if key is None else ctx.resource(RESOURCE_KEY, PlanCache).get(key)
    if entry is None or call.pattern not in call.spec.replayable:
        call.run()
        return
    plan, generation = Plan(), ctx._resources.generation
    dataclasses.replace(call, plan=plan).run()
    # A run that grew a buffer may have launched on the old one first: the next call records afresh.
    if ctx._resources.generation == generation:
        entry.plan, entry.generation = plan, generation
