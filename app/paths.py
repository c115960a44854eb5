"""Where Ferry keeps things, per platform (platformdirs). FERRY_HOME overrides
the data directory (tests and portable installs use it)."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "Ferry"


def data_dir() -> Path:
    root = os.environ.get("FERRY_HOME")
    return Path(root) if root else Path(platformdirs.user_data_dir(APP, appauthor=False))


def models_dir() -> Path:
    return data_dir() / "models"


def private_models_dir() -> Path:
    """The models folder, created 0700 (and the data folder too when new), or narrowed to 0700 when an
    older version left it 0755: it names the user's models (docs/SECURITY.md, "Private files")."""
    from app.store.private import private_dir

    if data_dir().is_dir():
        private_dir(data_dir())
    return private_dir(models_dir())


def config_dir() -> Path:
    root = os.environ.get("FERRY_HOME")
    return Path(root) / "config" if root else Path(platformdirs.user_config_dir(APP, appauthor=False))
