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


def config_dir() -> Path:
    root = os.environ.get("FERRY_HOME")
    return Path(root) / "config" if root else Path(platformdirs.user_config_dir(APP, appauthor=False))
