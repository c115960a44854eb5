"""The seed and token-probability settings: clamped, and kept across a restart (no Qt)."""
from __future__ import annotations

from app.store import settings as settings_mod
from app.store.settings import Settings


def test_seed_and_token_probabilities_are_clamped():
    s = Settings(seed=-3, token_alternatives=99).validated()
    assert s.seed is None and s.token_alternatives == 20 and not s.token_probabilities
    s = Settings(seed="12", token_probabilities=1, token_alternatives=-1).validated()
    assert s.seed == 12 and s.token_probabilities is True and s.token_alternatives == 0
    assert Settings(seed=1 << 70).validated().seed == settings_mod.MAX_SEED
    assert Settings(seed=0).validated().seed == 0          # 0 is a seed, not "random"


def test_seed_and_token_probabilities_persist(tmp_path):
    path = tmp_path / "settings.json"
    settings_mod.save(Settings(seed=1234, token_probabilities=True, token_alternatives=3), path)
    back = settings_mod.load(path)
    assert (back.seed, back.token_probabilities, back.token_alternatives) == (1234, True, 3)
    settings_mod.save(Settings(), path)
    assert settings_mod.load(path).seed is None


def test_stop_sequences_are_typed_one_a_line_with_escapes():
    typed = "###\n\\n\\nUser:\nC:\\\\path\n\nend\\t"
    stops = settings_mod.parse_stops(typed)
    assert stops == ["###", "\n\nUser:", "C:\\path", "end\t"]
    assert settings_mod.parse_stops(settings_mod.format_stops(stops)) == stops
    assert settings_mod.parse_stops("a\\qb") == ["a\\qb"]          # an unknown escape is kept as typed
    s = Settings(stop=["a", "", "b" * 300, "c", "d", "e"]).validated()
    assert s.stop == ["a", "b" * 256, "c", "d"]
    assert Settings(stop="not a list").validated().stop == []


def test_stop_sequences_are_never_written_in_the_clear(tmp_path):
    from app.store.crypto import Cipher

    path = tmp_path / "settings.json"
    cipher = Cipher(bytes(range(32)))
    settings_mod.save(Settings(stop=["SECRET-STOP"]), path, cipher=cipher)
    assert "SECRET-STOP" not in path.read_text()
    assert settings_mod.load(path, cipher=cipher).stop == ["SECRET-STOP"]
    assert settings_mod.load(path).stop == []
