"""Every module of app/ imports (a module moved or renamed cannot hide behind a
line no other test reaches — as `ferry plan --config` once did). ``__main__``
modules are left out: importing one runs it."""
from __future__ import annotations

import importlib
import os
import pkgutil

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import app  # noqa: E402

MODULES = sorted(m.name for m in pkgutil.walk_packages(app.__path__, "app.")
                 if not m.name.endswith(".__main__"))


def test_the_walk_finds_the_packages():
    assert {"app.api", "app.ui.main_window", "app.controller.chat_controller", "app.cli"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)
