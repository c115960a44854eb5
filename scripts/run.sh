#!/usr/bin/env bash
# Install everything Ferry needs into .venv and start chatting with the
# built-in demo model (fetched and converted on first use).
source "$(dirname "$0")/common.sh"
make_venv
install_ferry ""
exec "$VENV/bin/ferry" chat demo "$@"
