"""Run ``ferry`` with the network made impossible: every socket creation
raises (and is recorded). Prints the command's exit code and what was
attempted as one JSON line on stderr after the command's own output.

    python tests/documents/offline_runner.py docs add COLLECTION PATH...
"""
from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

ATTEMPTS: list[str] = []


class NoNetwork(OSError):
    pass


def _refuse(name):
    def refuse(*args, **kwargs):
        ATTEMPTS.append(f"{name}{args!r}")
        raise NoNetwork(f"network access is disabled in this test ({name})")
    return refuse


socket.socket = _refuse("socket.socket")            # type: ignore[misc]
socket.create_connection = _refuse("socket.create_connection")  # type: ignore[assignment]
socket.socketpair = _refuse("socket.socketpair")    # type: ignore[assignment]
socket.create_server = _refuse("socket.create_server")  # type: ignore[assignment]
socket.getaddrinfo = _refuse("socket.getaddrinfo")  # type: ignore[assignment]


def open_sockets() -> list[str]:
    out = []
    for fd in Path("/proc/self/fd").iterdir() if Path("/proc/self/fd").exists() else []:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:"):
            out.append(target)
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from app.cli import main

    code = main(sys.argv[1:])
    sys.stdout.flush()
    print("OFFLINE-RUNNER " + json.dumps({"code": code, "attempts": ATTEMPTS, "sockets": open_sockets()}),
          file=sys.stderr)
    sys.exit(code)
