"""Per-model settings (Model → Settings for this model…): the system prompt,
temperature, context, thinking, experts per token and the cache-aware routing
margin of one model, "Reset to defaults" (back to the global settings), and
presets that can be applied and saved. It edits values; the window stores them
through ``app.store.settings``."""
from __future__ import annotations

from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout,
                               QHBoxLayout, QInputDialog, QLabel, QPlainTextEdit, QPushButton, QSpinBox, QVBoxLayout)

from app.activations import DEFAULT_ACTIVATIONS, EXACT
from app.store import settings as settings_mod
from app.store.settings import PER_MODEL, Settings


class ModelSettingsDialog(QDialog):
    def __init__(self, settings: Settings, model_key: str, model_name: str, parent=None):
        super().__init__(parent)
        self.settings = settings
        self.model_key = model_key
        self.reset_requested = False
        self.setWindowTitle(f"Settings for {model_name}")
        self.setAccessibleName(f"Settings for {model_name}")
        self.resize(520, 460)
        lay = QVBoxLayout(self)
        own = model_key in settings.model_settings
        self.origin = QLabel("")
        self.origin.setObjectName("mutedLabel")
        self.origin.setWordWrap(True)
        lay.addWidget(self.origin)
        prow = QHBoxLayout()
        prow.addWidget(QLabel("Preset"))
        self.preset = QComboBox()
        self.preset.setAccessibleName("Preset")
        self._fill_presets()
        self.preset.activated.connect(lambda _i: self.apply_preset(self.preset.currentData()))
        prow.addWidget(self.preset, 1)
        self.save_preset_btn = QPushButton("Save as preset…")
        self.save_preset_btn.setAccessibleName("Save these values as a preset")
        self.save_preset_btn.clicked.connect(lambda: self.save_preset())
        prow.addWidget(self.save_preset_btn)
        lay.addLayout(prow)

        self.form = form = QFormLayout()
        self.system = QPlainTextEdit()
        self.system.setAccessibleName("System prompt")
        self.system.setFixedHeight(90)
        form.addRow("System prompt", self.system)
        self.temperature = QDoubleSpinBox()
        self.temperature.setAccessibleName("Temperature")
        self.temperature.setRange(0.0, 5.0)
        self.temperature.setSingleStep(0.05)
        form.addRow("Temperature", self.temperature)
        self.presence = QDoubleSpinBox()
        self.presence.setAccessibleName("Presence penalty")
        self.presence.setRange(-2.0, 2.0)
        self.presence.setSingleStep(0.1)
        self.presence.setToolTip("Above 0, a word already written is less likely again: long answers loop less.")
        form.addRow("Presence penalty", self.presence)
        self.context = QSpinBox()
        self.context.setAccessibleName("Context length in tokens")
        self.context.setRange(256, 1 << 20)
        self.context.setSingleStep(1024)
        self.context.setSuffix(" tokens")
        form.addRow("Context", self.context)
        self.thinking = QCheckBox("Let the model think before answering")
        self.thinking.setAccessibleName("Thinking")
        form.addRow("Thinking", self.thinking)
        self.experts = QSpinBox()
        self.experts.setAccessibleName("Experts per token")
        self.experts.setRange(0, 64)
        self.experts.setSpecialValueText("The model's own")
        form.addRow("Experts per token", self.experts)
        self.margin = QDoubleSpinBox()
        self.margin.setAccessibleName("Cache-aware routing margin")
        self.margin.setRange(0.0, 10.0)
        self.margin.setDecimals(3)
        self.margin.setSingleStep(0.01)
        self.margin.setSpecialValueText("Exact routing")
        form.addRow("Cache-aware margin", self.margin)
        self.fast_activations = QCheckBox("Faster 8-bit activations")
        self.fast_activations.setAccessibleName("Faster 8-bit activations")
        self.fast_activations.setToolTip("Rounds each layer's input to 8 bits and multiplies quantized weights "
                                         "with integer arithmetic, as llama.cpp does: faster, and the answers "
                                         "change far less than the weights' own quantization changes them. On by "
                                         "default; off: exact arithmetic.")
        form.addRow("Activations", self.fast_activations)
        note = QLabel("Fewer experts per token and a cache-aware margin above 0 answer faster but not exactly as "
                      "the model would: both are off by default. 8-bit activations are on by default; turn them off "
                      "for exact arithmetic. A new context or activation mode reopens the model.")
        note.setObjectName("mutedLabel")
        note.setWordWrap(True)
        form.addRow("", note)
        lay.addLayout(form)

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.reset_btn = buttons.addButton("Reset to defaults", QDialogButtonBox.ButtonRole.ResetRole)
        self.reset_btn.setAccessibleName("Reset this model's settings to the defaults")
        self.reset_btn.clicked.connect(self.reset)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        self.show_values(settings_mod.model_values(settings, model_key))
        self._origin(own)

    def show_expert_options(self, shown: bool) -> None:
        """Experts per token and the cache-aware margin: only for a model that has experts."""
        for w in (self.experts, self.margin):
            self.form.setRowVisible(w, shown)

    def _origin(self, own: bool) -> None:
        self.origin.setText("This model has its own settings." if own else
                            "This model uses the general settings; what you change here applies to it only.")

    def _fill_presets(self) -> None:
        self.preset.clear()
        self.preset.addItem("Choose a preset…", None)
        for name in sorted(self.settings.presets):
            self.preset.addItem(name, name)

    def show_values(self, v: dict) -> None:
        self.system.setPlainText(v["system_prompt"])
        self.temperature.setValue(v["temperature"])
        self.presence.setValue(v["presence_penalty"])
        self.context.setValue(v["context_length"])
        self.thinking.setChecked(v["thinking"])
        self.experts.setValue(v["experts_per_token"] or 0)
        self.margin.setValue(v["cache_aware_margin"])
        self.fast_activations.setChecked(v["activations"] != EXACT)

    def values(self) -> dict:
        v = {"system_prompt": self.system.toPlainText(), "temperature": self.temperature.value(),
             "context_length": self.context.value(), "thinking": self.thinking.isChecked(),
             "experts_per_token": self.experts.value() or None, "cache_aware_margin": self.margin.value(),
             "activations": DEFAULT_ACTIVATIONS if self.fast_activations.isChecked() else EXACT,
             "presence_penalty": self.presence.value()}
        assert set(v) == set(PER_MODEL)
        return v

    def apply_preset(self, name: str | None) -> None:
        if name and name in self.settings.presets:
            self.show_values({**self.values(), **self.settings.presets[name]})

    def save_preset(self, name: str | None = None) -> None:
        if name is None:
            name, ok = QInputDialog.getText(self, "Save as preset", "Preset name:")
            if not ok:
                return
        try:
            self.settings = settings_mod.save_preset(self.settings, name, self.values())
        except ValueError:
            return
        self._fill_presets()
        self.preset.setCurrentIndex(self.preset.findData(name.strip()))

    def reset(self) -> None:
        """Back to the general settings (applied on OK)."""
        self.reset_requested = True
        general = settings_mod.set_model_values(self.settings, self.model_key, None)
        self.show_values(settings_mod.model_values(general, self.model_key))
        self._origin(False)

    def result_settings(self) -> Settings:
        """The settings with this model's values (or none, after a reset with nothing changed since)."""
        general = settings_mod.set_model_values(self.settings, self.model_key, None)
        values = self.values()
        if self.reset_requested and values == settings_mod.model_values(general, self.model_key):
            return general
        return settings_mod.set_model_values(self.settings, self.model_key, values)
