"""Contexts by group name: how ``torch.ops.trident.*`` (keyed by a string) find their context.

A context registers itself when it opens, under a name every rank shares (``ctx.group_name``);
only a weak reference is kept, so a dropped context is not kept alive by the registry.
"""

from __future__ import annotations

import weakref

_BY_NAME: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def register(ctx, name: str) -> str:
    """Register ``ctx`` under ``name``; returns ``name``."""
    _BY_NAME[name] = ctx
    return name


def context_for_group(group_name: str):
    """The open context named ``group_name`` in this process; a clear error if there is none.

    Example::

        ctx = context_for_group(ctx.group_name)
    """
    ctx = _BY_NAME.get(group_name) if isinstance(group_name, str) else None
    if ctx is None or ctx._closed:
        known = sorted(name for name, c in _BY_NAME.items() if not c._closed)
        raise ValueError(f"no open trident context is named {group_name!r} in this process (open: {known}); "
                         f"pass ctx.group_name")
    return ctx
