"""The release workflow (.github/workflows/release.yml) as far as it can be
checked without a Mac: it parses, runs on an arm64 macOS runner, builds the
wheels with packaging/build_wheels.sh, creates/builds/packages the Briefcase
app, signs ad hoc when no identity secret is set, launches the bundled app
with --screenshot and keeps the PNGs. The bundle's Python must be one where
the PySide6 pin lets in no leaking release (see tests/ui/test_refcount.py)."""
from __future__ import annotations

import tomllib

import pytest
from packaging.requirements import Requirement

from tests.conftest import REPO

yaml = pytest.importorskip("yaml")
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"


@pytest.fixture(scope="module")
def wf() -> dict:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


def _runs(job) -> str:
    return "\n".join(s.get("run", "") for s in job["steps"])


def test_release_workflow_builds_signs_and_screenshots_the_macos_app(wf):
    assert set(wf[True]) >= {"push", "workflow_dispatch"}       # YAML reads the key `on` as True
    job = wf["jobs"]["macos-app"]
    assert job["runs-on"] in ("macos-14", "macos-15", "macos-latest")   # GitHub's arm64 macOS runners
    runs = _runs(job)
    assert "bash packaging/build_wheels.sh" in runs
    order = [runs.index(f"briefcase {verb} macOS app") for verb in ("create", "build", "package")]
    assert order == sorted(order)
    adhoc = [s for s in job["steps"] if "--adhoc-sign" in s.get("run", "")]
    assert adhoc and "MACOS_SIGNING_IDENTITY == ''" in adhoc[0]["if"]
    assert 'APP="$BUILD/build/ferry/macos/app/Ferry.app"' in runs and '"$APP/Contents/MacOS/Ferry" --screenshot' in runs
    uploads = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    assert any("screenshots/*.png" in s["with"]["path"] for s in uploads)
    assert any("dist/*.dmg" in s["with"]["path"] for s in uploads)
    for s in job["steps"]:
        if "uses" in s:
            assert "@" in s["uses"], f"{s['uses']} is not pinned to a version"


def test_the_bundle_python_gets_a_safe_pyside6(wf):
    py = next(s["with"]["python-version"] for s in wf["jobs"]["macos-app"]["steps"]
              if s.get("uses", "").startswith("actions/setup-python"))
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    env = {"python_version": str(py), "python_full_version": f"{py}.0"}
    active = [Requirement(d) for d in deps if Requirement(d).name.lower() == "pyside6-essentials"
              and (Requirement(d).marker is None or Requirement(d).marker.evaluate(env))]
    assert len(active) == 1
    # 3.12+ makes None immortal; below it the pin must exclude the leaking 6.12.0
    assert tuple(map(int, str(py).split("."))) >= (3, 12) or not active[0].specifier.contains("6.12.0")


def test_the_workflow_builds_from_briefcase_toml_with_the_pinned_briefcase(wf):
    """The Mac build uses the same generated configuration as build_linux.sh, the
    Briefcase of the packaging extra, and the demo model as the app's resource."""
    runs = _runs(wf["jobs"]["macos-app"])
    assert "briefcase_config.py --packaging-requirements" in runs        # the pin, not `pip install briefcase`
    assert "pip install --upgrade pip briefcase" not in runs
    assert 'packaging/briefcase_config.py "$BUILD" --gguf' in runs
    assert 'WHEELS="$BUILD/wheels" bash packaging/build_wheels.sh' in runs
    for verb in ("create", "package"):
        step = next(s for s in wf["jobs"]["macos-app"]["steps"] if f"briefcase {verb} macOS app" in s.get("run", ""))
        assert step["working-directory"] == "${{ env.BUILD }}"


def test_the_first_run_smoke_test_answers_from_the_bundled_demo(wf):
    job = wf["jobs"]["macos-app"]
    step = next(s for s in job["steps"] if "--screenshot" in s.get("run", ""))
    assert step["env"]["QT_QPA_PLATFORM"] == "offscreen"                      # headless
    run = step["run"]
    assert 'HOME="$RUNNER_TEMP/home"' in run                                  # an empty home
    assert "resources/SmolLM2-135M-Instruct.Q4_1.gguf" in run                # carried by the bundle
    assert "test ! -d" in run and "app_packages/pip" in run                  # nothing to install with
    assert "Application Support/Ferry/models/smollm2-135m-instruct.ferry/manifest.json" in run
    assert "FERRY_HOME" not in str(job.get("env", {}))                         # platformdirs, as for a user


def test_briefcase_configuration_points_at_what_exists():
    from tests.packaging.test_briefcase_config import bc

    app = bc.tool_briefcase()["app"]["ferry"]
    assert (REPO / bc.LAUNCHER / "__main__.py").exists()
    assert app["macOS"]["universal_build"] is False                     # arm64, as the runner builds
    assert "./wheels" in app["requirement_installer_args"]
    assert (REPO / f"{app['icon']}.icns").exists() or (REPO / f"{app['icon']}.png").exists()
