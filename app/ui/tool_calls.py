"""MCP tools in the window: the Settings → Tools page (servers, trusted tools),
the approval bar a call waits at, the calls shown under an answer (name,
arguments, result; each collapsible), and the background thread that connects
to servers and runs calls. The rounds themselves are
``app.controller.tools.ToolSession``'s; the window glues them together."""
from __future__ import annotations

import json
import threading

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QLineEdit, QListWidget, QPushButton, QToolButton,
                               QVBoxLayout, QWidget)

from app.controller.tools import APPROVED, DECLINED_STATUS, DONE, RUNNING, WAITING
from app.tools.mcp import McpError, ToolHub, parse_server

#: How a call's state reads in its header.
STATUS_TEXT = {WAITING: "waiting for your approval", APPROVED: "approved", RUNNING: "running…",
               DECLINED_STATUS: "declined", DONE: "done"}
PREVIEW_CHARS = 4000   #: a longer argument or result is cut in the chat (the model got all of it)


def _pretty(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except (ValueError, TypeError):
        return arguments


def _cut(text: str) -> str:
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + f"\n… ({len(text)} characters)"


class ToolsPage(QWidget):
    """Settings → Tools: the MCP servers (a command run over stdio, or a URL) and the trusted tools."""

    def __init__(self, servers: list[str], trusted: list[str], parent=None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        intro = QLabel("MCP servers give the model tools (read files, search, …). A server is a command Ferry "
                       "runs (stdio), or the URL of one already running (streamable HTTP). Each call is shown "
                       "in the chat and needs your approval unless you trust that tool.")
        intro.setWordWrap(True)
        lay.addWidget(intro)
        self.servers = QListWidget()
        self.servers.setAccessibleName("MCP servers")
        self.servers.addItems(servers)
        lay.addWidget(self.servers)
        self.entry = QLineEdit()
        self.entry.setAccessibleName("MCP server command or URL")
        self.entry.setPlaceholderText("npx -y @modelcontextprotocol/server-filesystem ~/notes   or   "
                                      "http://127.0.0.1:3000/mcp")
        self.entry.returnPressed.connect(self.add_server)
        self.add_btn = QPushButton("Add")
        self.add_btn.setAccessibleName("Add the MCP server")
        self.add_btn.clicked.connect(self.add_server)
        self.remove_btn = QPushButton("Remove")
        self.remove_btn.setAccessibleName("Remove the selected MCP server")
        self.remove_btn.clicked.connect(lambda: self._remove(self.servers))
        row = QHBoxLayout()
        row.addWidget(self.entry, 1)
        row.addWidget(self.add_btn)
        row.addWidget(self.remove_btn)
        lay.addLayout(row)
        self.problem = QLabel("")
        self.problem.setObjectName("mutedLabel")
        self.problem.setWordWrap(True)
        lay.addWidget(self.problem)
        lay.addWidget(QLabel("Trusted tools (they run without asking):"))
        self.trusted = QListWidget()
        self.trusted.setAccessibleName("Trusted tools")
        self.trusted.addItems(trusted)
        self.trusted.setMaximumHeight(90)
        lay.addWidget(self.trusted)
        self.forget_btn = QPushButton("Ask again")
        self.forget_btn.setAccessibleName("Ask again before the selected trusted tool runs")
        self.forget_btn.clicked.connect(lambda: self._remove(self.trusted))
        forget = QHBoxLayout()
        forget.addWidget(self.forget_btn)
        forget.addStretch(1)
        lay.addLayout(forget)
        lay.addStretch(1)

    def add_server(self) -> bool:
        text = self.entry.text().strip()
        try:
            parse_server(text)
        except McpError as exc:
            self.problem.setText(str(exc))
            return False
        if text not in self.server_list():
            self.servers.addItem(text)
        self.entry.clear()
        self.problem.setText("")
        return True

    @staticmethod
    def _remove(widget: QListWidget) -> None:
        for item in widget.selectedItems():
            widget.takeItem(widget.row(item))

    def server_list(self) -> list[str]:
        return [self.servers.item(i).text() for i in range(self.servers.count())]

    def values(self) -> dict:
        """The page's settings (``Settings`` fields)."""
        return {"mcp_servers": self.server_list(),
                "trusted_tools": [self.trusted.item(i).text() for i in range(self.trusted.count())]}


class ToolApproval(QFrame):
    """Above the composer while a call waits: what the model wants to run, and Allow / Always / Deny."""

    decided = Signal(bool, bool)   #: allow, always (for this tool)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("toolApproval")
        self.setAccessibleName("Tool call approval")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        lay = QVBoxLayout(self)
        self.label = QLabel("")
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.label)
        row = QHBoxLayout()
        self.allow_btn = QPushButton("Allow")
        self.allow_btn.setAccessibleName("Allow this tool call")
        self.always_btn = QPushButton("Always allow")
        self.always_btn.setAccessibleName("Always allow this tool")
        self.deny_btn = QPushButton("Deny")
        self.deny_btn.setAccessibleName("Deny this tool call")
        for btn, allow, always in ((self.allow_btn, True, False), (self.always_btn, True, True),
                                   (self.deny_btn, False, False)):
            btn.clicked.connect(lambda _=False, a=allow, w=always: self.decided.emit(a, w))
            row.addWidget(btn)
        row.addStretch(1)
        lay.addLayout(row)
        self.setVisible(False)

    def ask(self, call: dict, trust_key: str) -> None:
        self.label.setText(f"The model wants to run {call['name']} with:\n{_cut(_pretty(call['arguments']))}")
        self.always_btn.setText(f"Always allow {trust_key}")
        self.setVisible(True)
        self.allow_btn.setFocus()


class ToolCallView(QFrame):
    """One call under an answer: a header (name, state) that opens its arguments and result."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setAccessibleName("Tool call")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.header = QToolButton()
        self.header.setCheckable(True)
        self.header.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.header.setArrowType(Qt.ArrowType.RightArrow)
        self.header.toggled.connect(self.set_expanded)
        lay.addWidget(self.header)
        self.body = QLabel("")
        self.body.setObjectName("mutedLabel")
        self.body.setWordWrap(True)
        self.body.setTextFormat(Qt.TextFormat.PlainText)
        self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.body.setVisible(False)
        lay.addWidget(self.body)

    def show_call(self, call: dict) -> None:
        status = call.get("status")
        if status is None:   # an answer whose calls were not run (no tools connected, or the round limit)
            state = "not run"
        else:
            state = STATUS_TEXT.get(status, status)
            if status == DONE and call.get("is_error"):
                state = "failed"
        self.header.setText(f"Tool {call.get('name', '?')} — {state}")
        self.header.setAccessibleName(f"Tool call {call.get('name', '?')}: {state}")
        body = f"Arguments:\n{_cut(_pretty(str(call.get('arguments', ''))))}"
        if call.get("result"):
            body += f"\n\nResult:\n{_cut(str(call['result']))}"
        self.body.setText(body)

    def set_expanded(self, on: bool) -> None:
        self.header.blockSignals(True)
        self.header.setChecked(on)
        self.header.blockSignals(False)
        self.header.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.body.setVisible(on)


class ToolCallsView(QWidget):
    """The calls an answer made (its record's ``tool_calls``), one collapsible row each."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setAccessibleName("Tool calls")
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(0, 0, 0, 0)
        self._lay.setSpacing(2)
        self.rows: list[ToolCallView] = []
        self.setVisible(False)

    def set_calls(self, stats: dict | None) -> None:
        calls = [c for c in (stats or {}).get("tool_calls") or [] if isinstance(c, dict)]
        while len(self.rows) < len(calls):
            row = ToolCallView(self)
            self._lay.addWidget(row)
            self.rows.append(row)
        while len(self.rows) > len(calls):
            self.rows.pop().deleteLater()
        for row, call in zip(self.rows, calls):
            row.show_call(call)
        self.setVisible(bool(calls))


class ToolTasks(QObject):
    """Connecting to servers and running calls, each on its own thread (they may take seconds):
    the answers come back as signals, on the window's thread."""

    connected = Signal(object, object)   #: the ToolHub (None: no servers), its problems (list of str)
    call_done = Signal(int, object)      #: the call's index in the answer, its ToolResult

    def _emit(self, signal, *args) -> None:
        try:
            signal.emit(*args)
        except RuntimeError:   # the window closed meanwhile: nobody is waiting for the answer
            hub = args[0] if args and isinstance(args[0], ToolHub) else None
            if hub is not None:
                hub.close()

    def connect_servers(self, servers: list[str], old: ToolHub | None = None) -> None:
        def work():
            if old is not None:
                old.close()
            if not servers:
                self._emit(self.connected, None, [])
                return
            problems, specs = [], []
            for text in servers:
                try:
                    specs.append(parse_server(text))
                except McpError as exc:
                    problems.append(str(exc))
            hub = ToolHub(specs)
            problems += hub.start()
            self._emit(self.connected, hub, problems)

        threading.Thread(target=work, name="ferry-mcp-connect", daemon=True).start()

    def run_call(self, hub: ToolHub, index: int, name: str, arguments: str) -> None:
        threading.Thread(target=lambda: self._emit(self.call_done, index, hub.call(name, arguments)),
                         name="ferry-mcp-call", daemon=True).start()
