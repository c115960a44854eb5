#!/usr/bin/env bash
# Build the Ferry wheel (with its compiled C core) and fetch a wheel of every
# dependency into the Briefcase build folder's wheels/ (default
# build/briefcase/wheels; WHEELS=DIR elsewhere), the only place the app bundle
# installs from (packaging/briefcase_config.py gives Briefcase
# requirement_installer_args = --no-index --find-links ./wheels). Run it with
# the same Python that runs Briefcase: the bundle's Python must match the
# wheels' tags.
#
#   bash packaging/build_wheels.sh            # this machine's architecture
#   ARCHFLAGS="-arch arm64 -arch x86_64" bash packaging/build_wheels.sh
#                                             # a universal2 Ferry wheel (macOS,
#                                             # with a universal2 python.org Python)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
OUT="${WHEELS:-$ROOT/build/briefcase/wheels}"
mkdir -p "$OUT"
rm -f "$OUT"/ferry-*.whl
# Build from a clean copy so the checkout gets no build/ or egg-info litter.
SRC="$(mktemp -d)"
trap 'rm -rf "$SRC"' EXIT
cp -R "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/README.md" "$ROOT/app" "$ROOT/core_c" "$SRC/"
find "$SRC" -name '__pycache__' -prune -exec rm -rf {} + -o -name '*.so' -exec rm -f {} +
"$PY" -m pip wheel --quiet --no-deps -w "$OUT" "$SRC"
# Every dependency as a wheel (binary only: Briefcase on macOS cannot build sdists).
"$PY" -m pip wheel --quiet --only-binary=:all: -w "$OUT" "$(ls "$OUT"/ferry-*.whl)"
echo "wheels in $OUT:"
ls -1 "$OUT"
