"""The window's per-model "Faster 8-bit activations" setting: on by default
(the default "auto": the engine runs 8-bit activations on the quantized tiny
model and the status bar says so); unchecked, the model is opened again with
exact activations (the engine reports it) and the status bar says so; other
models keep the default. Settings written before the default changed ("f32",
the old default saved whether chosen or not, and "q8") load as the default."""
from __future__ import annotations

from app.activations import DEFAULT_ACTIVATIONS, EXACT
from app.store import settings as settings_mod


def test_exact_activations_reopen_the_model_and_show(qtbot, make_window, tiny_chat):
    w = make_window(tiny_chat, max_tokens=3)
    assert w.model_info.info.activations == "q8" and "8-bit activations" in w.model_label.text()
    d = w.models.open_model_settings()
    qtbot.addWidget(d)
    assert d.fast_activations.isChecked() and "On by default" in d.fast_activations.toolTip()
    d.fast_activations.setChecked(False)
    with qtbot.waitSignal(w.model_loaded, timeout=60000) as loaded:
        d.accept()
    assert loaded.args[0].info.activations == "f32"
    assert "exact activations" in w.model_label.text()
    key = w.model_info.path
    assert w.settings.model_settings[key]["activations"] == EXACT and w.settings.activations == DEFAULT_ACTIVATIONS
    assert settings_mod.for_model(w.settings, key + ".other").activations == DEFAULT_ACTIVATIONS


def test_old_settings_files_take_the_new_default():
    for old, now in (("f32", DEFAULT_ACTIVATIONS), ("q8", DEFAULT_ACTIVATIONS), ("bogus", DEFAULT_ACTIVATIONS),
                     (EXACT, EXACT), (DEFAULT_ACTIVATIONS, DEFAULT_ACTIVATIONS)):
        assert settings_mod.Settings(activations=old).validated().activations == now
