"""The gauges: speed, disk reads, expert cache hits and the RAM bar, each
with a small sparkline. They draw a ``StatsView`` and a ``MemorySplit``."""
from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QScrollArea, QSizePolicy, QVBoxLayout, QWidget

from app.api import ModelLoaded
from app.controller.chat_controller import WINDOW_CLIENT
from app.memory.stats import GaugeValues, MemorySplit, StatsView, memory_split
from app.units import size
from app.ui import theme

NO_EXPERTS = "This model has no experts to stream, so there are no disk reads or cache hits to show."
NOT_REPORTED = "not reported by the server"
#: What a remote engine's gauges say, by what the server reports (app.engine.remote).
REMOTE_FERRY = ("A remote Ferry server: these are its engine's own figures. Its memory is on the server and is "
                "not shown here.")
REMOTE_OTHER = ("A remote engine: answer and prompt speeds are measured here from the stream (they include the "
                "network and any queue). The server does not report disk reads, expert cache hits or memory.")
_TILE_FIGURE = {"decode": "decode_tps", "prompt": "prompt_tps", "disk": "read_mbps", "hit_decode": "hit_decode",
                "hit_prefill": "hit_prefill"}


class Sparkline(QWidget):
    def __init__(self, color: str, parent=None, *, fixed_max: float | None = None):
        super().__init__(parent)
        self.color = QColor(color)
        self.values: list[float] = []
        self.fixed_max = fixed_max
        self.setMinimumHeight(26)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setAccessibleName("History")

    def set_values(self, values) -> None:
        self.values = list(values)
        self.update()

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = QRectF(self.rect()).adjusted(1, 2, -1, -2)
        base = self.palette().color(QPalette.ColorRole.Mid)
        base.setAlpha(90)
        p.setPen(QPen(base, 1))
        p.drawLine(QPointF(r.left(), r.bottom()), QPointF(r.right(), r.bottom()))
        vals = self.values
        if len(vals) < 2:
            return
        top = self.fixed_max or max(max(vals), 1e-9)
        n = len(vals)
        pts = [QPointF(r.left() + r.width() * i / (n - 1), r.bottom() - r.height() * min(v, top) / top)
               for i, v in enumerate(vals)]
        fill = QPainterPath(QPointF(r.left(), r.bottom()))
        for pt in pts:
            fill.lineTo(pt)
        fill.lineTo(QPointF(r.right(), r.bottom()))
        c = QColor(self.color)
        c.setAlpha(50)
        p.fillPath(fill, c)
        line = QPainterPath(pts[0])
        for pt in pts[1:]:
            line.lineTo(pt)
        p.setPen(QPen(self.color, 1.6))
        p.drawPath(line)


class GaugeTile(QFrame):
    """A name, a big value, a line of detail and a sparkline of recent values."""

    def __init__(self, title: str, color: str, parent=None, *, fixed_max: float | None = None):
        super().__init__(parent)
        self.setObjectName("gaugeTile")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 10, 6)
        row.setSpacing(8)
        left = QVBoxLayout()
        left.setSpacing(0)
        self.title = QLabel(title)
        self.title.setObjectName("gaugeTitle")
        self.value = QLabel("—")
        self.value.setObjectName("gaugeValue")
        self.detail = QLabel("")
        self.detail.setObjectName("mutedLabel")
        self.detail.setWordWrap(True)
        for w in (self.title, self.value, self.detail):
            left.addWidget(w)
        left.addStretch(1)
        lw = QWidget()
        lw.setLayout(left)
        lw.setFixedWidth(150)
        left.setContentsMargins(0, 0, 0, 0)
        row.addWidget(lw)
        self.spark = Sparkline(color, self, fixed_max=fixed_max)
        self.spark.setMinimumHeight(40)
        row.addWidget(self.spark, 1)
        self.setAccessibleName(title)

    def set(self, value: str, detail: str = "", history=()) -> None:
        self.value.setText(value)
        self.detail.setText(detail)
        self.detail.setVisible(bool(detail))
        self.spark.set_values(history)
        self.setAccessibleDescription(f"{value} {detail}".strip())


class RamBar(QWidget):
    """Trunk, attention state, expert cache and scratch against usable RAM."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.split: MemorySplit | None = None
        self.setMinimumHeight(22)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setAccessibleName("RAM budget")

    def set_split(self, split: MemorySplit | None) -> None:
        self.split = split
        if split:
            self.setAccessibleDescription(", ".join(f"{n} {size(b)}" for n, b in split.parts)
                                          + f", of {size(split.usable)} usable")
        self.update()

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = QRectF(self.rect()).adjusted(1, 1, -1, -1)
        bg = self.palette().color(QPalette.ColorRole.Mid)
        bg.setAlpha(60)
        path = QPainterPath()
        path.addRoundedRect(r, 5, 5)
        p.fillPath(path, bg)
        s = self.split
        if not s:
            return
        scale = max(s.usable, s.total, 1)
        p.setClipPath(path)
        x = r.left()
        for name, b in s.parts:
            w = r.width() * b / scale
            if b > 0:
                w = max(w, 2.0)
            p.fillRect(QRectF(x, r.top(), w, r.height()), QColor(theme.SERIES[name]))
            x += w
        if s.floor and s.floor < scale:
            fx = r.left() + r.width() * s.floor / scale
            p.setPen(QPen(self.palette().color(QPalette.ColorRole.WindowText), 1, Qt.PenStyle.DashLine))
            p.drawLine(QPointF(fx, r.top()), QPointF(fx, r.bottom()))


class GaugePanel(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("gaugePanel")
        self.setAccessibleName("Gauges")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 10, 10, 10)
        lay.setSpacing(8)
        head = QLabel("<b>Engine</b>")
        lay.addWidget(head)
        self.decode = GaugeTile("Answer speed", "#4f7cff")
        self.prompt = GaugeTile("Prompt speed", "#22a06b")
        self.disk = GaugeTile("Disk reads", "#e8912d")
        self.hit_decode = GaugeTile("Cache hits · answer", "#a15dd8", fixed_max=1.0)
        self.hit_prefill = GaugeTile("Cache hits · prompt", "#d14d72", fixed_max=1.0)
        for t in (self.decode, self.prompt, self.disk, self.hit_decode, self.hit_prefill):
            lay.addWidget(t)
        self.no_experts = QLabel(NO_EXPERTS)
        self.no_experts.setObjectName("mutedLabel")
        self.no_experts.setWordWrap(True)
        self.no_experts.setVisible(False)
        lay.addWidget(self.no_experts)
        self.remote_note = QLabel("")
        self.remote_note.setObjectName("mutedLabel")
        self.remote_note.setWordWrap(True)
        self.remote_note.setVisible(False)
        self.remote_note.setAccessibleName("What the remote engine reports")
        lay.addWidget(self.remote_note)

        self.clients = QLabel("")
        self.clients.setObjectName("mutedLabel")
        self.clients.setWordWrap(True)
        self.clients.setVisible(False)
        self.clients.setAccessibleName("Requests from other clients")
        lay.addWidget(self.clients)

        ram_title = QLabel("<b>Memory</b>")
        lay.addWidget(ram_title)
        self.ram = RamBar()
        lay.addWidget(self.ram)
        self.legend = QLabel("")
        self.legend.setWordWrap(True)
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        lay.addWidget(self.legend)
        self.ram_note = QLabel("")
        self.ram_note.setObjectName("mutedLabel")
        self.ram_note.setWordWrap(True)
        lay.addWidget(self.ram_note)
        lay.addStretch(1)
        self.has_experts = True
        self.remote: ModelLoaded | None = None   #: the loaded model of a remote engine, else None
        self.values = GaugeValues()

    def set_model(self, has_experts: bool, engine: ModelLoaded | None = None) -> None:
        """``engine``: the worker's loaded-model info; without it, the window's
        ``model_info`` says whether the engine is remote."""
        if engine is None:
            engine = getattr(self.window(), "model_info", None)
        self.remote = engine if isinstance(engine, ModelLoaded) and engine.remote else None
        self.has_experts = has_experts
        self.no_experts.setVisible(not has_experts and self.remote is None)
        if self.remote is not None:
            ferry = set(self.remote.provides) >= {"read_mbps", "hit_decode"}
            self.remote_note.setText(REMOTE_FERRY if ferry else REMOTE_OTHER)
        self.remote_note.setVisible(self.remote is not None)
        for name, figure in _TILE_FIGURE.items():
            getattr(self, name).setEnabled(self._provides(figure) and (has_experts or name in ("decode", "prompt")))
        for t in (self.disk, self.hit_decode, self.hit_prefill):   # a dense model: no empty expert gauges, one note
            t.setVisible(has_experts or self.remote is not None)
        self.show_values(StatsView())

    def _provides(self, figure: str) -> bool:
        return self.remote is None or figure in self.remote.provides

    def show_values(self, view: StatsView) -> None:
        v = self.values = view.values
        h = view.history
        measured = self.remote is not None and not self._provides("read_mbps")  # speeds timed here, not by the server
        self.decode.set(_rate(v.decode_tps, "tok/s"), "measured here" if measured else "", h["decode_tps"])
        self.prompt.set(_rate(v.prompt_tps, "tok/s"), "measured here" if measured else "", h["prompt_tps"])
        if measured:
            for t in (self.disk, self.hit_decode, self.hit_prefill):
                t.set("—", NOT_REPORTED, [])
            return
        if not self.has_experts:
            for t in (self.disk, self.hit_decode, self.hit_prefill):
                t.set("—", "no experts", [])
            return
        self.disk.set(_rate(v.read_mbps, "MB/s"),
                      f"{size(v.bytes_read_total)} in {v.expert_reads_total} reads",
                      h["read_mbps"])
        self.hit_decode.set(_pct(v.hit_decode), f"since start {_pct(v.hit_decode_total)}", h["hit_decode"])
        self.hit_prefill.set(_pct(v.hit_prefill), f"since start {_pct(v.hit_prefill_total)}", h["hit_prefill"])

    def show_clients(self, clients: dict | None, own: str = WINDOW_CLIENT) -> None:
        """The requests of clients other than the window (``EngineService.clients``): other Ferry
        processes using this engine, and the window's server's clients."""
        text = clients_summary(clients, own)
        self.clients.setText(text)
        self.clients.setVisible(bool(text))

    def show_model(self, info: ModelLoaded, ram_budget: int = 0) -> MemorySplit:
        """A newly opened model (``ram_budget``: the setting, when the engine reports none): its gauges
        and its memory split, which is returned."""
        split = memory_split(info.plan, info.info, info.info.ram_budget or ram_budget,
                             recommended=info.recommended_budget)
        self.set_model(info.has_experts, engine=info)
        self.show_memory(split)
        return split

    def show_memory(self, split: MemorySplit | None) -> None:
        self.ram.setVisible(self.remote is None)
        if self.remote is not None:
            self.ram.set_split(None)
            self.legend.setText("")
            self.ram_note.setText(f"The model runs on {self.remote.url or 'the server'}: its memory is "
                                  f"{NOT_REPORTED}.")
            return
        self.ram.set_split(split)
        if split is None:
            self.legend.setText("")
            self.ram_note.setText("")
            return
        rows = "".join(f'<tr><td><span style="color:{theme.SERIES[n]};">■</span> {n}</td>'
                       f'<td align="right">&nbsp;&nbsp;{size(b)}</td></tr>' for n, b in split.parts)
        self.legend.setText(f"<table>{rows}</table>")
        budget = "no limit" if split.budget <= 0 else size(split.budget)
        self.ram_note.setText(f"{size(split.total)} planned of {size(split.usable)} usable RAM. "
                              f"Floor {size(split.floor)}, recommended {size(split.recommended)}, "
                              f"budget: {budget}.")


class GaugeDock(QScrollArea):
    """The gauge panel at the window's right, scrolling when the window is short."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.panel = GaugePanel()
        self.setWidget(self.panel)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setMinimumWidth(300)
        self.setMaximumWidth(420)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)


def clients_summary(clients: dict | None, own: str = WINDOW_CLIENT) -> str:
    """"Other clients: 3 answers · answering one now · 2 waiting" ("" when none ever asked)."""
    if not clients:
        return ""
    answered = sum(n for c, n in clients.get("answered", {}).items() if c != own)
    waiting = sum(n for c, n in clients.get("waiting", {}).items() if c != own)
    running = clients.get("running") not in (None, own)
    if not (answered or waiting or running):
        return ""
    parts = [f"{answered} answer{'' if answered == 1 else 's'}"]
    if running:
        parts.append("answering one now")
    if waiting:
        parts.append(f"{waiting} waiting")
    return "Other clients: " + " · ".join(parts)


def _rate(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    return f"{v:,.1f} {unit}" if v < 100 else f"{v:,.0f} {unit}"


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.0f} %"
