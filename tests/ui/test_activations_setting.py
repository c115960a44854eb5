"""The window's per-model "Faster 8-bit activations" setting: off by default;
checked, the model is opened again with activations "q8" (the engine reports
it) and the status bar says so; other models keep the exact default."""
from __future__ import annotations

from app.store import settings as settings_mod


def test_fast_activations_reopen_the_model_and_show(qtbot, make_window, tiny_chat):
    w = make_window(tiny_chat, max_tokens=3)
    assert w.model_info.info.activations == "f32" and "8-bit" not in w.model_label.text()
    d = w.models.open_model_settings()
    qtbot.addWidget(d)
    assert not d.fast_activations.isChecked() and "answers change slightly" in d.fast_activations.toolTip()
    d.fast_activations.setChecked(True)
    with qtbot.waitSignal(w.model_loaded, timeout=60000) as loaded:
        d.accept()
    assert loaded.args[0].info.activations == "q8"
    assert "8-bit activations" in w.model_label.text()
    key = w.model_info.path
    assert w.settings.model_settings[key]["activations"] == "q8" and w.settings.activations == "f32"
    assert settings_mod.for_model(w.settings, key + ".other").activations == "f32"
