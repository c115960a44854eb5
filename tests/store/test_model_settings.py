"""Per-model settings and presets (issue 16), kept through app/store/settings.py."""
from __future__ import annotations

import json
import os

from app.store import settings as settings_mod
from app.store.crypto import KEY_BYTES, Cipher
from app.store.settings import PER_MODEL, Settings


def test_per_model_values_override_the_general_ones_and_round_trip(tmp_path):
    s = Settings(temperature=0.7, system_prompt="general")
    s = settings_mod.set_model_values(s, "/models/a", {"temperature": 0.2, "system_prompt": "be brief",
                                                       "experts_per_token": 4, "cache_aware_margin": 0.1,
                                                       "ram_budget": 1, "nonsense": 3})
    assert s.model_settings["/models/a"] == {"temperature": 0.2, "system_prompt": "be brief",
                                             "experts_per_token": 4, "cache_aware_margin": 0.1}
    a, b = settings_mod.for_model(s, "/models/a"), settings_mod.for_model(s, "/models/b")
    assert (a.temperature, a.system_prompt, a.experts_per_token) == (0.2, "be brief", 4)
    assert (b.temperature, b.system_prompt, b.experts_per_token, b.cache_aware_margin) == (0.7, "general", None, 0.0)
    s = settings_mod.save_preset(s, " Precise ", {"temperature": 0.0, "thinking": False})
    cipher = Cipher(os.urandom(KEY_BYTES))
    p = settings_mod.save(s, tmp_path / "settings.json", cipher=cipher)
    assert "be brief" not in p.read_text() and "Precise" not in p.read_text()   # sealed like the system prompt
    assert settings_mod.load(p).model_settings == {}                            # nothing without the key
    back = settings_mod.load(p, cipher=cipher)
    assert back == s and back.presets == {"Precise": {"temperature": 0.0, "thinking": False}}
    assert set(settings_mod.model_values(back, "/models/a")) == set(PER_MODEL)
    reset = settings_mod.set_model_values(back, "/models/a", None)
    assert "/models/a" not in reset.model_settings and settings_mod.for_model(reset, "/models/a").temperature == 0.7


def test_bad_values_are_clamped_or_dropped(tmp_path):
    p = tmp_path / "settings.json"
    p.write_text(json.dumps({"temperature": 0.5, "enter_sends": 0, "experts_per_token": -3,
                             "cache_aware_margin": -1,
                             "model_settings": {"/m": {"temperature": 99, "context_length": 5}, "/n": "junk"},
                             "presets": {"": {"temperature": 1}, "Hot": {"temperature": 9}}}))
    s = settings_mod.load(p, cipher=Cipher(os.urandom(KEY_BYTES)))   # a file from before they were sealed
    assert s.enter_sends is False and s.experts_per_token is None and s.cache_aware_margin == 0.0
    assert s.model_settings == {"/m": {"temperature": 5.0, "context_length": 256}}
    assert s.presets == {"Hot": {"temperature": 5.0}}
