"""How every collective and fused op call runs: one pipeline, each op declaring only its own facts.

An op is an :class:`Op` record: its name, its argument check, the facts ranks must agree on in
the debug mode, what it does (``run``, launching through a :class:`~trident.calls.recording.Recording`),
and what it does across nodes (or None: it refuses). :func:`run_call` does the rest, in one place:

1. across nodes: the check, then the op's hierarchical version (or a clear refusal);
2. the cache (:mod:`trident.calls.cache`): a call whose layout was seen before replays the
   recording of that call on this call's tensors, and is done;
3. otherwise the full path: check, agree (debug mode), run while recording, keep the recording
   if the buffers it launched on did not move meanwhile.

The debug mode caches nothing (every call checked in full and agreed on).

Example::

    ALL_GATHER = Op("all_gather", check=_check_all_gather, run=_run_all_gather,
                    facts=lambda t, o: (tuple(t[1].shape), t[1].dtype), across_nodes=hierarchical.all_gather)

    def all_gather(ctx, out, inp, group=None):
        run_call(team(ctx, group), ALL_GATHER, (out, inp))
        return out
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

from ..errors import TopologyError
from ..runtime.device_loss import raise_explained
from ..runtime.resources import note_call
from ..runtime.team import Team
from .recording import Recording


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation as :func:`run_call` runs it.

    Attributes:
        name: the op's name (errors, cache keys, debug agreement).
        check: ``check(team, tensors, options)``: raise a clear error for bad arguments, before
            anything runs (tensors are the operands in the op's order, outputs included).
        run: ``run(team, rec, tensors, options)``: do the work, every launch and copy through
            ``rec`` (or ``rec.rerun_with(...)`` where the work cannot be recorded).
        facts: ``facts(tensors, options)``: what every rank must pass alike (checked in the debug
            mode), or None.
        across_nodes: ``across_nodes(team, tensors, options)`` when the team spans nodes (after the
            check), or None: the op refuses, before any check.
        refusal: ``refusal(team)``: the error an op without ``across_nodes`` raises (None: a
            generic :class:`TopologyError`).
        cacheable: ``cacheable(options)``: whether a call may be kept (False e.g. with a trace), or
            None (always).
        key_options: ``key_options(options)``: the part of the options a kept call is looked up by,
            or None (all of them). Options left out (all_to_all_v's split sizes) must reach the
            replay only through the recording's :meth:`~trident.calls.recording.Recording.per_call` steps.
    """

    name: str
    check: Callable
    run: Callable
    facts: Callable | None = None
    across_nodes: Callable | None = None
    cacheable: Callable | None = None
    refusal: Callable | None = None
    key_options: Callable | None = None


def run_call(team: Team, op: Op, tensors: tuple, options: tuple = ()):
    """Run one call of ``op`` on ``team`` (a context or a group) with ``tensors`` and ``options``.

    Returns:
        What ``op.across_nodes`` returned when the team spans nodes, else the call's
        :class:`Recording` (replayed or new; its ``memo`` holds what the op's run noted for its
        entry, e.g. the workspace views it returns).

    Example::

        run_call(team(ctx, group), ALL_REDUCE, (tensor, tensor), (op, algorithm))
    """
    if team.spans_nodes:
        if op.across_nodes is None:
            if op.refusal is not None:
                raise op.refusal(team)
            world = cast(Any, team)  # only the world (a Context) spans nodes: a group lives in one node
            raise TopologyError(
                f"{team.who()}: trident {op.name} does not run across nodes (this job: "
                f"{world.topology.describe()}): run it inside a node, with group=ctx.new_group(ranks) for the "
                f"ranks of one node (docs/multi-node.md)")
        _check(team, op, tensors, options)
        return op.across_nodes(team, tensors, options)
    note_call(team, op.name)  # inside CUDA-graph capture: the buffers it may replay on are kept
    cache = team.call_cache
    key = None
    if not team.debug and (op.cacheable is None or op.cacheable(options)):
        entry, found = cache.lookup(op.name, options if op.key_options is None else op.key_options(options),
                                    tensors, team.heap_range)
        if entry is not None:
            try:
                entry.replay(tensors, options, ptrs=found)
            except RuntimeError as error:
                raise_explained(team, error)
            return entry
        key = found
    _check(team, op, tensors, options)
    rec = Recording(tensors, team.heap_range, on_gpu=not team.platform.simulator,
                    generation=lambda: cache.generation)
    rec.own(team.heap_bases)  # the team's, alive as long as it is
    try:
        op.run(team, rec, tensors, options)
    except RuntimeError as error:
        raise_explained(team, error)
    # Kept only if every step launched on the buffers as they are now (none moved after a step).
    if key is not None and rec.kept and rec.generations <= {cache.generation}:
        cache.put(key, rec, tensors, team.heap_range)
    return rec


def _check(team: Team, op: Op, tensors: tuple, options: tuple) -> None:
    """The op's check, then (debug mode) the ranks' agreement on its facts."""
    op.check(team, tensors, options)
    if op.facts is not None:
        team.agree_in_debug(op.name, *op.facts(tensors, options))
