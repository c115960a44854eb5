"""The architecture rules hold: those in .importlinter (import-linter, run in the suite: Qt only in
app.ui, the window and the command line independent, the server below its callers, the window's
controller below the window, the layers from the front ends down to the engine, the binding the
engine's floor, reaching the engines only through app.api, the store a floor), no import circle
between app's modules nor between its top-level parts, and only app.engine.binding
importing the compiled core (an extension module import-linter's graph cannot see). And each check
does catch a broken rule."""
from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
lint = pytest.importorskip("importlinter.cli").lint_imports


def test_the_import_contracts_hold(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    assert lint(config_filename=str(ROOT / ".importlinter")) == 0, "see lint-imports' report above"


def test_a_qt_import_outside_the_ui_is_caught(tmp_path, monkeypatch):
    pkg = tmp_path / "toyapp"
    (pkg / "ui").mkdir(parents=True)
    (pkg / "engine").mkdir()
    for d in (pkg, pkg / "ui", pkg / "engine"):
        (d / "__init__.py").write_text("")
    (pkg / "ui" / "window.py").write_text("import PySide6\n")
    (pkg / "engine" / "core.py").write_text("from PySide6 import QtCore\n")
    cfg = tmp_path / "contracts.ini"
    cfg.write_text(textwrap.dedent("""\
        [importlinter]
        root_package = toyapp
        include_external_packages = True

        [importlinter:contract:qt]
        name = Qt only in toyapp.ui
        type = forbidden
        source_modules =
            toyapp.engine
        forbidden_modules =
            PySide6
        """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("toyapp", None)
    assert lint(config_filename=str(cfg)) == 1


def import_cycles(package: str) -> list[list[str]]:
    """The import circles between ``package``'s modules (each a strongly connected group of two or
    more modules; an import under ``if TYPE_CHECKING:`` runs nothing and is left out)."""
    import grimp

    graph = grimp.build_graph(package, exclude_type_checking_imports=True)
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:     # Tarjan's algorithm
        order[module] = low[module] = len(order)
        stack.append(module)
        on_stack.add(module)
        for other in graph.find_modules_directly_imported_by(module):
            if other not in graph.modules:
                continue
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            group = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                group.append(other)
                if other == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(graph.modules):
        if module not in order:
            visit(module)
    return cycles


def package_cycles(package: str) -> list[list[str]]:
    """The circles between ``package``'s top-level parts (``app.engine``, ``app.model``...): two parts
    of which each imports the other, directly or through a chain of other parts, even where no two
    modules make a circle. Each is a strongly connected group of the parts' graph, in which a part
    imports another when any of its modules does (``if TYPE_CHECKING:`` imports left out)."""
    import grimp

    graph = grimp.build_graph(package, exclude_type_checking_imports=True)
    depth = package.count(".") + 2

    def part(module: str) -> str:
        return ".".join(module.split(".")[:depth])

    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        if module == package:
            continue
        for other in graph.find_modules_directly_imported_by(module):
            if other in graph.modules and other != package and part(other) != part(module):
                edges.setdefault(part(module), set()).add(part(other))
    reach = {p: set(targets) for p, targets in edges.items()}
    changed = True
    while changed:          # the transitive closure: the graph has a few dozen parts
        changed = False
        for targets in reach.values():
            more = set().union(*(reach.get(t, set()) for t in targets)) - targets
            if more:
                targets |= more
                changed = True
    groups = {frozenset([p] + [q for q in reach[p] if p in reach.get(q, set())]) for p in reach if p in reach[p]}
    return sorted(sorted(g) for g in groups)


def core_importers(root: Path, package: str = "app") -> list[str]:
    """The modules under ``root`` that import the compiled core (``<package>.engine._ferry_c``),
    at any depth of the code, but its binding."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(n == f"{package}.engine._ferry_c" for n in names) and module != f"{package}.engine.binding":
                found.append(module)
    return sorted(set(found))


def test_no_import_circle_in_app(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    assert import_cycles("app") == []


def test_no_two_parts_of_app_import_each_other(monkeypatch):
    """Issue 33: the layers hold package by package, not only module by module (the engine does not
    import the model that sits on it; convert, get, memory and the demo do not go round)."""
    monkeypatch.syspath_prepend(str(ROOT))
    assert package_cycles("app") == []


def test_a_circle_between_parts_is_caught(tmp_path, monkeypatch):
    pkg = tmp_path / "toyparts"
    for d in ("", "engine", "model", "memory", "get"):
        (pkg / d).mkdir(parents=True, exist_ok=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "engine" / "binding.py").write_text("")
    (pkg / "engine" / "service.py").write_text("def f():\n    from toyparts.model import load\n")
    (pkg / "model" / "load.py").write_text("from toyparts.engine import binding\n")
    # a chain of three parts, no module in a circle: memory.plan -> get.speed -> engine.binding, and
    # engine.registry -> memory.units
    (pkg / "memory" / "plan.py").write_text("from toyparts.get import speed\n")
    (pkg / "get" / "speed.py").write_text("from toyparts.engine import binding\n")
    (pkg / "engine" / "registry.py").write_text("from toyparts.memory import units\n")
    (pkg / "memory" / "units.py").write_text("")
    (pkg / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from toyparts import get\n")
    (pkg / "get" / "cli.py").write_text("from toyparts import typed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("toyparts") == []          # no module circle: only the parts go round
    assert package_cycles("toyparts") == [["toyparts.engine", "toyparts.get", "toyparts.memory",
                                           "toyparts.model"]]
    (pkg / "engine" / "service.py").write_text("")
    (pkg / "engine" / "registry.py").write_text("")
    sys.modules.pop("toyparts", None)
    assert package_cycles("toyparts") == []


def test_only_the_binding_imports_the_compiled_core():
    assert core_importers(ROOT / "app") == []


def test_a_circle_and_a_direct_core_import_are_caught(tmp_path, monkeypatch):
    pkg = tmp_path / "toyloop"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from toyloop import b\n")
    (pkg / "b.py").write_text("def f():\n    from toyloop import a\n")     # even inside a function
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from toyloop import a\n")
    (pkg / "engine" / "binding.py").write_text("from toyloop.engine._ferry_c import lib\n")
    (pkg / "engine" / "speed.py").write_text("def g():\n    from toyloop.engine import _ferry_c\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("toyloop") == [["toyloop.a", "toyloop.b"]]
    assert core_importers(pkg, "toyloop") == ["toyloop.engine.speed"]


def test_the_main_window_stays_a_thin_composition():
    """Issue 33: MainWindow composes views and forwards intent; turn logic lives in the Qt-free
    controller (app/controller) and each feature's glue in its own file (model_host, tool_rounds,
    export_dialog...). Its class stays under 400 lines, so a new feature cannot quietly grow it."""
    tree = ast.parse((ROOT / "app" / "ui" / "main_window.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MainWindow")
    assert cls.end_lineno - cls.lineno + 1 < 400, "MainWindow grew: move the new feature's glue into its own file"
