"""The import graph: no cycle, and no import from a lower layer to a higher one.

The stages are the folders of ``layoutc/`` (front, algebra, lang, verify, lower, runtime, convert,
equiv, cli), layered below. The graph is read from the source (every ``import`` and ``from ... import``, including the lazy
ones inside functions), so a cycle hidden behind a function-level import is found too. A module whose stage
is in no layer fails the test.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "layoutc"

#: The stages, lowest first: a module may import modules of its own folder or of a lower one. A folder of
#: ``layoutc/`` is a stage; the few top-level modules are placed by name. docs/design.md §0 draws this.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_version", "limits"),                # foundations: no layoutc imports
    ("algebra",),                          # expressions, index maps, element types, instances
    ("runtime",),                          # what every converter carries (copied whole into it)
    ("front",),                            # text, grammar, syntax tree, diagnostics
    ("lang",),                             # families, the checked program, expansion, ops, typed chains
    ("verify",),                           # the static verifier, coverage
    ("lower",),                            # plans, emitters, the generated module
    ("api", "shipped", "registry", "guard", "trust"),  # the public Python API
    ("convert", "equiv", "reference", "testing"),  # checkpoints, equivalence and probes, the oracles
    ("cli", "__main__"),                   # the command line and the review tools
)


def stage_of(module: str) -> str:
    """The stage a module belongs to: its folder, or its own name for a top-level module."""
    return module.split(".")[0] if module else ""


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    """Module -> the layoutc modules it imports (names relative to the package; "" is the package)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".") if package else []
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                elif (node.module or "").startswith("layoutc"):
                    target = node.module.removeprefix("layoutc").lstrip(".")
                else:
                    continue
                for alias in node.names:  # `from . import expr` imports the module expr
                    sub = f"{target}.{alias.name}" if target else alias.name
                    targets.append(sub if sub in mods else target)
            elif isinstance(node, ast.Import):
                targets = [a.name.removeprefix("layoutc").lstrip(".") for a in node.names
                           if a.name == "layoutc" or a.name.startswith("layoutc.")]
            graph[name].update(t for t in targets if t in mods and t != name)
    return graph


def layer_of(module: str) -> int:
    stage = stage_of(module)
    for i, layer in enumerate(LAYERS):
        if stage in layer:
            return i
    raise AssertionError(f"layoutc.{module}: its stage {stage!r} is in no layer of LAYERS")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycle():
    assert cycles(import_graph()) == []


def test_no_module_imports_from_a_higher_layer():
    graph = import_graph()
    upward = [f"{m or 'layoutc'} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})"
              for m, targets in graph.items() if m for t in targets if layer_of(t) > layer_of(m)]
    assert upward == []


def test_the_checker_sees_a_cycle_and_an_upward_import():
    # the two checks above can fail: a made-up graph with both faults
    graph = {"algebra.expr": {"lang.compiler"}, "lang.compiler": {"algebra.expr"}, "front.ast": set()}
    assert cycles(graph) == [["algebra.expr", "lang.compiler"]]
    assert layer_of("algebra.expr") < layer_of("lang.compiler") < layer_of("cli.main")


def test_every_stage_is_a_folder_and_every_module_has_a_stage():
    stages = {s for layer in LAYERS for s in layer}
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert folders | top == stages
    assert all(layer_of(m) >= 0 for m in _modules() if m)



def test_every_module_imports_on_its_own_in_layer_order():
    # a fresh interpreter per check would be slow; one interpreter importing bottom-up finds a module
    # that only imports because something above happened to be imported first
    order = sorted((m for m in _modules() if m), key=lambda m: (layer_of(m), m))
    code = "import importlib\nfor m in %r:\n    importlib.import_module('layoutc.' + m)\n" % (order,)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120)


#: Test folders that are not one stage: suites across stages (each backend end to end, hostile input,
#: other libraries' layouts) and the recorded goldens.
CROSS_STAGE_TESTS = {"backends", "security", "library", "goldens"}
#: Tests of the project as a whole, kept at the top of tests/.
PROJECT_TESTS = {"test_architecture.py", "test_docs.py", "test_makefile.py", "test_newcomer.py",
                 "test_packaging.py", "test_hypothesis_profile.py"}


def test_tests_mirror_the_package():
    """tests/ has a folder per stage of layoutc/ it tests (and a few suites across stages), so the test of a
    module is found where the module is; nothing else sits at the top."""
    tests = Path(__file__).resolve().parent
    stages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders - stages - CROSS_STAGE_TESTS == set(), "test folders that are no stage of layoutc/"
    loose = {p.name for p in tests.glob("test_*.py")}
    assert loose <= PROJECT_TESTS, f"tests at the top of tests/ that belong in a stage folder: {loose - PROJECT_TESTS}"
    for folder in folders - {"goldens"}:
        assert (tests / folder / "__init__.py").exists(), f"tests/{folder} is not a package (module names collide)"


#: One concept per module: a module past this many lines holds more than one and is split by concept.
MAX_MODULE_LINES = 700


def test_no_module_is_over_700_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concept): {long}"
