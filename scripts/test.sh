#!/usr/bin/env bash
# Install Ferry with its test dependencies into .venv and run the whole suite.
source "$(dirname "$0")/common.sh"
make_venv
install_ferry "[test]"
ensure_system_packages
cd "$ROOT"
# One pytest worker per core, at most 4 (pytest-xdist; a test file stays in one worker, so its module
# fixtures are made once). FERRY_TEST_WORKERS=N sets the count; 0 runs everything in this process.
WORKERS="${FERRY_TEST_WORKERS:-$("$VENV/bin/python" -c 'import os; print(min(4, os.cpu_count() or 1))')}"
if [ "$WORKERS" = 0 ]; then
    exec "$VENV/bin/python" -m pytest -q "$@"
fi
exec "$VENV/bin/python" -m pytest -q -n "$WORKERS" --dist loadfile "$@"
