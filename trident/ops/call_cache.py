"""The fused ops' small-call path: what a call decided, kept per key.

A fused op's call first checks its operands, then decides (``auto``'s pattern, the tile config,
the communication programs): about 40 us of Python on the host, on every call. A decode loop
calls the op on the same buffers every step, so the answers never change. :func:`recall` returns
the decisions of an earlier call with the same key (the operands' addresses, shapes, strides and
dtypes, and the options, so every check the first call passed holds again), bound to this call's
tensors; :func:`remember` keeps a call's decisions once it has passed every check. Only decisions
are kept, never tensors, so the cache holds no memory alive. Calls with a trace, and every call
in the debug mode, take the full path.

Example::

    key = call_key(ctx, GEMM_ALL_SCATTER, A, B_local, C, pattern, config, comm_programs, trace)
    call = recall(ctx, key, A, B_local, C)
    if call is None:
        _check_gemm_all_scatter_args(...)
        call = prepare_call(...)
        remember(ctx, key, call)
    call.run()
"""

from __future__ import annotations

import dataclasses

from ..kernels.prepared import PlanCache, plan_key
from .fused_call import FusedCall

#: The key of the cache (a bounded :class:`~trident.kernels.prepared.PlanCache`) among the context's resources.
RESOURCE_KEY = "ops.calls"


def call_key(ctx, spec, A, B, C, pattern, config, comm_programs, trace):
    """The key of one call of ``spec`` (None: this call takes the full path: a trace, the debug mode,
    or an argument that is not a tensor where one is expected)."""
    if trace is not None or ctx.debug:
        return None
    return plan_key(spec.name, A, B, C, pattern, config, comm_programs)


def recall(ctx, key, A, B, C) -> FusedCall | None:
    """The call remembered for ``key``, bound to this call's ``A``, ``B`` and ``C``; None if none."""
    if key is None:
        return None
    template = ctx.resource(RESOURCE_KEY, PlanCache).get(key)
    return None if template is None else dataclasses.replace(template, A=A, B=B, C=C)


def remember(ctx, key, call: FusedCall) -> None:
    """Keep ``call``'s decisions for ``key`` (its tensors are not kept)."""
    if key is None:
        return
    ctx.resource(RESOURCE_KEY, PlanCache).put(key, dataclasses.replace(call, A=None, B=None, C=None))
