#!/usr/bin/env bash
# Install Ferry with its test dependencies into .venv and run the whole suite.
source "$(dirname "$0")/common.sh"
make_venv
install_ferry "[test]"
ensure_system_packages
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q "$@"
