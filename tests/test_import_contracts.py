"""The architecture rules in .importlinter hold (import-linter, run in the suite): Qt only in
app.ui, the window and the command line independent, the server below its callers, the window's
controller below the window. And the runner does catch a broken rule."""
from __future__ import annotations

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
