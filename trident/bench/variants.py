"""Edited copies of trident's kernel modules, for the anatomy benchmarks' A/B variants.

An anatomy benchmark (``benchmarks/fused_anatomy.py``, ``benchmarks/moe_decode_anatomy.py``) times a
kernel as it is and with one part changed. Each variant is a copy of the kernel's module with text
edits, written into a scratch folder and imported under a name of its own, never into trident: the
edits must apply to the current source (:func:`edited_module` raises when one no longer does, so a
test catches a kernel change that breaks a variant before a GPU run does).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Mapping, Sequence

#: trident's package folder.
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RELATIVE = re.compile(r"^(\s*)from (\.+)([\w.]*) import ", re.MULTILINE)


def absolute_imports(source: str, module: str) -> str:
    """``source`` of the module named ``module`` (``"trident.ops.moe.kernels"``) with every relative
    import made absolute, so a copy imports the same objects from anywhere.

    Example::

        absolute_imports("from ..fused.sync import claim_work", "trident.ops.moe.kernels")
        # -> "from trident.ops.fused.sync import claim_work"
    """
    package = module.split(".")[:-1]

    def resolve(match: re.Match) -> str:
        indent, dots, rest = match.groups()
        base = package[:len(package) - (len(dots) - 1)]
        target = ".".join(base + ([rest] if rest else []))
        return f"{indent}from {target} import "

    return _RELATIVE.sub(resolve, source)


def edited_module(relative: str, edits: Sequence[tuple[str, str]], name: str, folder: str,
                  imports: Mapping[str, str] | None = None):
    """Import a copy of trident's module ``relative`` (a path under ``trident/``) with ``edits`` applied.

    Args:
        relative: the module's file, e.g. ``"ops/moe/kernels.py"``.
        edits: ``(old, new)`` text pairs, each replaced everywhere; ``old`` must occur in the source.
        name: the copy's module name (unique per copy: it is imported under it).
        folder: where the copy is written (a scratch folder).
        imports: absolute module names the copy imports in place of trident's, e.g.
            ``{"trident.ops.fused.sync": "my_sync_copy"}`` (another edited copy).

    Returns:
        The imported copy.

    Example::

        sync = edited_module("ops/fused/sync.py", [('scope="gpu"', 'scope="sys"')], "sync_sys", tmp)
        kernels = edited_module("ops/moe/kernels.py", [], "kernels_sys", tmp, {"trident.ops.fused.sync": "sync_sys"})
    """
    module = "trident." + relative[:-len(".py")].replace("/", ".")
    with open(os.path.join(PACKAGE, relative)) as f:
        text = absolute_imports(f.read(), module)
    for old, new in edits:
        if old not in text:
            raise ValueError(f"{name}: {relative} no longer holds {old!r}")
        text = text.replace(old, new)
    for original, replacement in (imports or {}).items():
        text = text.replace(f"from {original} import ", f"from {replacement} import ")
    with open(os.path.join(folder, name + ".py"), "w") as f:
        f.write(text)
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(folder)
