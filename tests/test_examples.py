"""The examples: a numbered ladder (``00_heap.py`` ... ), ``demo.py`` and the decoder layer, each run as written.

Every example runs as a user would (``trident run -n 2 examples/NAME.py``) and reports success on
every rank; on a machine without a GPU that is the CPU simulator. Each example checks its own
result against torch and exits non-zero when it is wrong. The examples are scripts, never
imported: these tests read their source and run them.
"""

import ast
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import script_env

REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("[!_]*.py"))  # _name.py: helpers, not examples
SUCCESS = ("ok", "matches")
#: Lines an example must print exactly (besides its success word): ``trident run``'s output of a rank's line
#: as the script wrote it (what tests/test_host_api.py checked with a run of its own).
EXACT = {"01_load_store.py": ["rank 0: load/store ok (y = 0.0)", "rank 1: load/store ok (y = 2.0)"]}
#: What examples may import from trident: the public API and the tile helpers. The ops' kernels
#: are internals that change; an example copying or importing them would drift from the library.
PUBLIC = {"trident", "trident.ops", "trident.ops.gemm.tiles", "trident.ccl", "trident.ccl.device"}


def _source(name: str) -> ast.Module:
    return ast.parse((REPO / "examples" / name).read_text())


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_on_two_ranks(name):
    env = script_env()  # this checkout's trident, whatever is installed
    proc = subprocess.run([sys.executable, "-m", "trident", "run", "-n", "2", f"examples/{name}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for rank in range(2):
        lines = [line for line in proc.stdout.splitlines() if line.startswith(f"rank {rank}")]
        assert any(word in line for line in lines for word in SUCCESS), proc.stdout[-2000:]
    for line in EXACT.get(name, []):
        assert line in proc.stdout.splitlines(), proc.stdout[-2000:]


def test_moe_layer_runs_with_the_masked_layout():
    """The same layer, its grouped GEMM unchanged, on the decode path's masked dispatch layout."""
    proc = subprocess.run([sys.executable, "-m", "trident", "run", "-n", "2", "examples/moe_layer.py", "8", "masked"],
                          cwd=REPO, env=script_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for rank in range(2):
        assert f"rank {rank}: MoE layer (masked)" in proc.stdout and "matches" in proc.stdout, proc.stdout[-2000:]


def test_examples_form_a_numbered_ladder():
    """``NN_topic.py`` from 00 up without gaps, so a newcomer reads them in order; demo.py besides."""
    numbered = [name for name in EXAMPLES if name[:2].isdigit()]
    assert [int(name[:2]) for name in numbered] == list(range(len(numbered))), numbered
    assert len(numbered) >= 8 and "demo.py" in EXAMPLES, EXAMPLES


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_says_what_it_teaches_and_how_to_run_it(name):
    doc = ast.get_docstring(_source(name)) or ""
    assert len(doc.splitlines()) >= 3, f"examples/{name}: a module docstring says what it teaches"
    assert "trident run -n" in doc and f"examples/{name}" in doc, f"examples/{name}: the docstring shows its command"


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_uses_only_public_api(name):
    imported = set()
    for node in ast.walk(_source(name)):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    private = sorted(m for m in imported if m.split(".")[0] == "trident" and m not in PUBLIC)
    assert not private, f"examples/{name} imports trident internals {private}; use only {sorted(PUBLIC)}"
    # Examples run from any directory, so they import nothing from examples/ itself.
    helpers = {p.stem for p in (REPO / "examples").glob("*.py")} & imported
    assert not helpers, f"examples/{name} imports {sorted(helpers)}: each example stands alone"


def test_readme_first_kernel_runs_as_written_and_says_ok(tmp_path):
    """The README's first kernel, copied as a user would, on four ranks as the README runs it: it used
    to print nothing when it succeeded."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## A first kernel", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    ring = tmp_path / "ring.py"
    ring.write_text(code)
    proc = subprocess.run([sys.executable, "-m", "trident", "run", "-n", "4", str(ring)], cwd=tmp_path,
                          env=script_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert sorted(proc.stdout.splitlines()) == [f"rank {r}: ok, got {float((r - 1) % 4)} from rank {(r - 1) % 4}"
                                                for r in range(4)], proc.stdout
