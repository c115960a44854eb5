"""The window's MCP tool rounds: connects to the servers of the settings (in
the background), and between two parts of an answer asks the user about each
call (the approval bar), runs the approved ones (``ToolTasks``) and asks the
model again with their results. The rounds' state is the controller's
(``app.controller.tools.ToolSession``); the widgets are in
``app.ui.tool_calls``. ``MainWindow`` owns one and forwards to it."""
from __future__ import annotations

from PySide6.QtCore import QObject

from app.ui.tool_calls import ToolApproval, ToolTasks


class ToolRounds(QObject):
    def __init__(self, window, page):
        super().__init__(window)
        self.w = window
        self.approval = ToolApproval()   # above the composer while a tool call waits for the user
        self.approval.decided.connect(self._on_decision)
        page.layout().insertWidget(page.layout().indexOf(page.composer), self.approval)
        self.tasks = ToolTasks(window)
        self.tasks.connected.connect(self._on_connected)
        self.tasks.call_done.connect(self._on_result)
        self.servers: list[str] = []

    @property
    def session(self):
        return self.w.controller.tools

    def connect_servers(self) -> None:
        """(Re)connect to the MCP servers of the settings, in the background."""
        self.servers = list(self.w.settings.mcp_servers)
        self.session.trusted = set(self.w.settings.trusted_tools)
        old, self.session.hub = self.session.hub, None
        if self.servers or old is not None:
            self.tasks.connect_servers(self.servers, old)

    def settings_changed(self, new) -> None:
        self.session.trusted = set(new.trusted_tools)
        if new.mcp_servers != self.servers:
            self.connect_servers()

    def _on_connected(self, hub, problems: list) -> None:
        if self.w.settings.mcp_servers != self.servers:   # the settings changed meanwhile: a newer connect runs
            if hub is not None:
                hub.close()
            return
        self.session.hub, self.session.problems = hub, list(problems)
        if problems:
            self.w.statusBar().showMessage("Tools: " + "; ".join(problems))
        elif hub is not None:
            self.w.statusBar().showMessage(f"Tools ready: {', '.join(t.name for t in hub.tools) or 'none'}", 5000)

    def finished(self, reason: str) -> bool:
        """An answer part ended: True when its tool calls start a round (the answer goes on after them)."""
        done = self.w.controller.turn.done
        if reason != "stop" or not self.session.can_continue(done):
            return False
        self.session.begin_round(done)
        self.step()
        return True

    def stop(self) -> bool:
        """Stop between two rounds (nothing runs on the engine): True when that is what was stopped."""
        if not (self.w.busy and self.session.in_round):
            return False
        self.approval.setVisible(False)
        return True

    def step(self) -> None:
        """The next step of a tool round: ask about a call, run one, or ask the model again."""
        w, tools = self.w, self.session
        w.controller.show_tool_calls()
        w.chat_view.refresh_streaming()
        if (i := tools.next_to_ask()) is not None:
            w.composer_bar.start_reading(f"Waiting for your approval to run {tools.calls[i]['name']}…")
            self.approval.ask(tools.calls[i], tools.trust_key(tools.calls[i]["name"]))
            return
        self.approval.setVisible(False)
        if (i := tools.next_to_run()) is not None:
            call = tools.running(i)
            w.controller.show_tool_calls()
            w.chat_view.refresh_streaming()
            w.composer_bar.start_reading(f"Running the tool {call['name']}…")
            self.tasks.run_call(tools.hub, i, call["name"], call["arguments"])
            return
        if tools.round_over() and tools.in_round:
            w.composer_bar.start_reading("Reading the tool results…")
            w.controller.started(w.worker.generate(w.controller.tool_request()))

    def _on_decision(self, allow: bool, always: bool) -> None:
        i = self.session.next_to_ask()
        if i is None or not self.w.busy:
            return
        key = self.session.decide(i, allow, always)
        settings = self.w.settings
        if key is not None and key not in settings.trusted_tools:   # remembered: Settings → Tools lists it
            settings.trusted_tools = sorted({*settings.trusted_tools, key})
            self.w._save_settings()
        self.step()

    def _on_result(self, index: int, result) -> None:
        if self.w.busy and self.session.in_round:
            self.session.ran(index, result)
            self.step()

    def close(self) -> None:
        if self.session.hub is not None:
            self.session.hub.close()
            self.session.hub = None
