#!/usr/bin/env bash
# Install everything Ferry needs into .venv, fetch and convert the built-in
# demo model on first use, and open the app on it. Without a display (or with
# --cli) the same model opens in the terminal chat instead.
source "$(dirname "$0")/common.sh"
make_venv
install_ferry ""
DEMO="$("$VENV/bin/ferry" demo)"
if [ "${1:-}" != "--cli" ] && { [ "$(uname)" = Darwin ] || [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]; }; then
    exec "$VENV/bin/python" -m app --model "$DEMO"
fi
echo "ferry: no display here, so chatting in the terminal (ferry chat demo)" >&2
exec "$VENV/bin/ferry" chat demo
