"""The codebase's shape: one owner for machine facts, and layers that import only below themselves.

These read the source (no ranks, no kernels): they fail when a change decides "am I in the
simulator?" or "how many SMs?" somewhere new, or when a lower layer reaches up.
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "trident"

#: Every package module's layer. A module may import its own layer and those below it.
#: Modules not listed take the layer of their folder.
LAYERS = {
    "errors": 0, "layout": 0, "config": 0, "faults": 0, "torch_private": 0,
    "platform": 1, "topology": 1,
    "backends": 2,
    "device": 3, "kernels": 3,
    "runtime": 4, "calls": 4,
    "trace": 5,
    "ccl": 6,
    "ops": 7,
    "testing": 8, "bench": 8, "torch_ops": 8, "dist_backend": 8, "dist_slots": 8,
    "cli": 9, "__main__": 9, "__init__": 9, "initialize": 9,
}

#: Ways of asking "which backend / what hardware" that belong to trident/platform.py (this rank's device),
#: trident/topology.py (every GPU of the machine and their links), the import-time switch in config.py
#: and the backends, which implement the answers.
MACHINE_FACTS = re.compile(
    r"config\.BACKEND\b|torch\.cuda\.is_available|\.is_cuda\b|device\.type\s*[!=]=|\.backend\s*[!=]=|"
    r"get_device_properties|multi_processor_count|cuda\.device_count\(|BACKEND\s*==")
FACT_OWNERS = {"trident/platform.py", "trident/topology.py", "trident/config.py", "trident/backends"}


def _layer(module: str) -> int:
    """Layer of a dotted module name inside trident (``runtime.context`` -> 4)."""
    parts = module.split(".")
    if len(parts) == 1 and parts[0] not in LAYERS and not (PACKAGE / parts[0]).exists() \
            and not (PACKAGE / f"{parts[0]}.py").exists():
        parts = ["__init__"]  # a name defined in trident/__init__.py (``from trident import __version__``)
    for depth in range(len(parts), 0, -1):
        key = ".".join(parts[:depth])
        if key in LAYERS:
            return LAYERS[key]
    raise KeyError(f"trident.{module} has no layer in tests/test_architecture.py: add it to LAYERS")


def _module_of(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"] or ["__init__"]
    return ".".join(parts)


def _imports(path: pathlib.Path, module: str):
    """``(line, imported trident module)`` for every import of trident code in a file, lazy ones too."""
    package = module.split(".")[:-1] if path.name != "__init__.py" else module.split(".")
    if module == "__init__":
        package = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                target = ".".join(base + ([node.module] if node.module else []))
                names = [target] if node.module else [f"{target}.{a.name}".strip(".") for a in node.names]
            elif node.module and node.module.startswith("trident"):
                target = node.module.removeprefix("trident").lstrip(".")
                names = [target] if target else [a.name for a in node.names]
            else:
                continue
            for name in names:
                yield node.lineno, name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("trident."):
                    yield node.lineno, alias.name.removeprefix("trident.")


def test_every_layer_imports_only_below_itself():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_of(path)
        mine = _layer(module)
        for line, target in _imports(path, module):
            if target and _layer(target) > mine:
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({module}, layer {mine}) imports "
                             f"trident.{target} (layer {_layer(target)})")
    assert not wrong, "lower layers reach up:\n" + "\n".join(wrong)


@pytest.mark.parametrize("folder", ["trident", "examples", "benchmarks"])
def test_machine_facts_have_one_owner(folder):
    """Only trident/platform.py (with config.py and the backends) asks torch or trident.config which
    backend runs and what the hardware is; everything else asks ``ctx.platform``."""
    wrong = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if any(rel == owner or rel.startswith(owner + "/") for owner in FACT_OWNERS):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if MACHINE_FACTS.search(code):
                wrong.append(f"{rel}:{number}: {line.strip()}")
    assert not wrong, "machine facts decided outside trident/platform.py (ask ctx.platform):\n" + "\n".join(wrong)


def test_platform_answers_for_this_machine():
    import torch

    import trident

    p = trident.platform.for_device("cuda" if trident.platform.PROCESS_BACKEND == "cuda" else "cpu", world_size=3)
    assert p.backend == trident.platform.PROCESS_BACKEND and p.world_size == 3
    if p.simulator:
        assert p.sm_count == trident.platform.SIM_SM_COUNT and not p.nccl_usable and not p.performance_figure
        assert p.comm_programs(16) == trident.platform.SIM_COMM_PROGRAMS
        assert p.timing_device == torch.device("cpu")
    else:
        assert p.sm_count > 1 and p.comm_programs(16) == max(1, min(16, p.sm_count // 4))
        assert p.ranks_share_gpus == (p.gpus_visible < 3)


def test_no_module_is_past_its_size():
    """Files stay readable: a module past ~400 lines should be split along its seams."""
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 420]
    assert not long, "split these modules:\n" + "\n".join(long)


def _concrete(module: str) -> str | None:
    """The dotted module a target names if it is a file of its own (not a package's __init__)."""
    path = PACKAGE.joinpath(*module.split("."))
    return module if path.with_suffix(".py").exists() else None


def test_no_import_cycles():
    """Modules import each other in one direction only (lazy imports included): a cycle means two
    modules that cannot be read, tested or changed apart."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        module = _module_of(path)
        graph[module] = {t for _, target in _imports(path, module) if target and (t := _concrete(target))}
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


#: The adapter modules: the only ones in trident/ that read another object's private attributes
#: (``obj._name``, obj not self/cls), one per package whose private API trident needs, each use
#: documented there (why, which versions). Everywhere else reads public names only (issue 29; 63
#: private reads at 33ddd12): trident's modules give each other public names, and a private name of
#: torch's or Triton's is wrapped in its adapter. The number is each adapter's reads now, a ratchet:
#: it may only go down, so a new private need is a decision made in review, not a quiet addition.
PRIVATE_ADAPTERS = {
    # Triton's interpreter, patched for the simulator (3 of them: fix-up 11, _patch_lang and its scope)
    "trident/backends/interpreter_fixups.py": 14,
    "trident/torch_private.py": 8,  # torch's: store, plugins, NCCL timeout, sleep, allocator (2), raw stream (2)
}


def _private_reads(path: pathlib.Path) -> list[str]:
    """``file:line .name`` for every read of another object's private attribute in ``path``."""
    return [f"{path.relative_to(ROOT).as_posix()}:{node.lineno} .{node.attr}"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))]


def test_no_private_reads_outside_the_adapters():
    reads = [read for path in sorted(PACKAGE.rglob("*.py"))
             if path.relative_to(ROOT).as_posix() not in PRIVATE_ADAPTERS for read in _private_reads(path)]
    assert not reads, ("reads of other objects' private attributes: give the owner a public name (a method or "
                       "property with a docstring), or, for torch's or Triton's private API, a function in its "
                       "adapter (PRIVATE_ADAPTERS):\n" + "\n".join(reads))


@pytest.mark.parametrize("adapter", sorted(PRIVATE_ADAPTERS))
def test_adapters_private_reads_do_not_grow(adapter):
    cap, reads = PRIVATE_ADAPTERS[adapter], _private_reads(ROOT / adapter)
    assert len(reads) <= cap, (f"{adapter}: {len(reads)} private reads, at most {cap}; a new one needs a "
                               f"documented reason there and a new cap here:\n" + "\n".join(reads))


#: The widest ``@triton.jit`` signatures: kernels, then helpers (issue 29's caps, reached: 30 and 25
#: before). Kernels group their launch arguments (sizes and strides as tuples, tensors one by one);
#: helpers take the device-side bundles of trident/device/bundles.py (Team, CallSync, Gemm, Output).
JIT_KERNEL_ARGS_MAX, JIT_HELPER_ARGS_MAX = 18, 12


def test_jit_signatures_do_not_widen():
    wide = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
                cap = JIT_KERNEL_ARGS_MAX if node.name.endswith("kernel") else JIT_HELPER_ARGS_MAX
                if len(node.args.args) > cap:
                    wide.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {len(node.args.args)} > {cap}")
    assert not wide, "jit signatures past their cap (bundle arguments instead):\n" + "\n".join(wide)

