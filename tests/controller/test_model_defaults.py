"""Sensible per-model defaults (issue 34): a small model gets the measured
sampling defaults (greedy, presence penalty 0.3; bench/factual_defaults.py)
as its own values the first time it opens — once, so the user's reset or
change sticks, and never over general sampling the user chose."""
from __future__ import annotations

from app.store.settings import SMALL_MODEL_BYTES, SMALL_MODEL_DEFAULTS, Settings, first_open, for_model, \
    set_model_values

KEY = "/models/smollm2.ferry"


def test_a_small_model_gets_the_measured_defaults_once():
    s = first_open(Settings(), KEY, 90 << 20)
    eff = for_model(s, KEY)
    assert (eff.temperature, eff.presence_penalty) == (0.0, 0.3) == tuple(SMALL_MODEL_DEFAULTS.values())
    assert set(s.model_settings[KEY]) == set(SMALL_MODEL_DEFAULTS)        # the system prompt stays general
    assert for_model(s, "/models/other.ferry").temperature == Settings().temperature
    reset = set_model_values(s, KEY, None)                                # Model → Reset to defaults
    assert first_open(reset, KEY, 90 << 20).model_settings.get(KEY) is None   # not given again


def test_large_models_user_values_and_user_sampling_are_left_alone():
    big = first_open(Settings(), KEY, SMALL_MODEL_BYTES * 4)
    assert KEY not in big.model_settings and KEY in big.models_defaulted
    own = first_open(set_model_values(Settings(), KEY, {"temperature": 0.9}), KEY, 90 << 20)
    assert own.model_settings[KEY]["temperature"] == 0.9 and own.model_settings[KEY]["presence_penalty"] == 0.3
    chosen = Settings(temperature=0.2)
    assert first_open(chosen, KEY, 90 << 20) is chosen
