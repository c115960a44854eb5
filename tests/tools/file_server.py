"""A small MCP server for the tests, written with the official SDK's server
side: it reads text files from ONE folder (its first argument) and refuses
any path that leaves it. Run as ``python tests/tools/file_server.py FOLDER``
(stdio), or ``... FOLDER --http PORT`` (streamable HTTP on 127.0.0.1).
``sleep`` lets a test see a call time out; ``fail`` raises inside a tool."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError


def build(root: Path) -> MCPServer:
    root = root.resolve()
    server = MCPServer("files")

    def inside(name: str) -> Path:
        path = (root / name).resolve()
        if path != root and root not in path.parents:
            raise ToolError(f"{name!r} is outside the shared folder")
        if not path.is_file():
            raise ToolError(f"there is no file {name!r} in the shared folder")
        return path

    @server.tool()
    def read_file(path: str) -> str:
        """Read a text file from the shared folder (a path relative to it)."""
        return inside(path).read_text(encoding="utf-8")

    @server.tool()
    def list_files() -> str:
        """The names of the files in the shared folder, one a line."""
        return "\n".join(sorted(p.name for p in root.iterdir() if p.is_file()))

    @server.tool()
    def sleep(seconds: float) -> str:
        """Wait, then say so."""
        time.sleep(seconds)
        return f"slept {seconds}"

    @server.tool()
    def fail() -> str:
        """Always fails."""
        raise RuntimeError("this tool always fails")

    return server


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    if "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        build(folder).run("streamable-http", host="127.0.0.1", port=port)
    else:
        build(folder).run()
