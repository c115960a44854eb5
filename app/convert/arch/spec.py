"""What every family's mapping shares: the :class:`ModelSpec` a source becomes,
the expert parts, and the context length a config states."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.convert.errors import SourceError

EXPERT_PARTS = ("gate", "up", "down")


@dataclass
class ModelSpec:
    """The manifest's ``model`` section and the source names of every tensor."""

    model: dict[str, Any]
    #: canonical trunk name -> source tensor name
    trunk: dict[str, str] = field(default_factory=dict)
    #: layer -> expert -> part ("gate"/"up"/"down") -> source tensor name
    experts: dict[int, list[dict[str, str]]] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return int(self.model["n_layers"])


def _require(cfg: dict, key: str, where: str = "config.json"):
    if key not in cfg or cfg[key] is None:
        raise SourceError(where, f"{where} has no '{key}'")
    return cfg[key]


def _first(cfg: dict, *keys, default=None):
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


#: Keys a config.json states its trained context length under, in order of
#: preference (the Kimi-Linear release states only ``model_max_length``).
CONTEXT_KEYS = ("max_position_embeddings", "model_max_length", "max_sequence_length", "seq_length")
#: The context a converted model gets when its config states none of those:
#: the engine's default session length, which every supported family runs.
DEFAULT_CONTEXT = 4096


def stated_context(cfg: dict) -> int:
    """The trained context length the config states, else DEFAULT_CONTEXT."""
    value = _first(cfg, *CONTEXT_KEYS)
    if value is None:
        return DEFAULT_CONTEXT
    try:
        ctx = int(value)
    except (TypeError, ValueError):
        raise SourceError("config.json", f"config.json states a context length of {value!r}, not a number")
    if ctx < 1:
        raise SourceError("config.json", f"config.json states a context length of {ctx}")
    return ctx


def _context(cfg: dict) -> int:
    ctx = stated_context(cfg)
    window = cfg.get("sliding_window")
    if window and (cfg.get("use_sliding_window", True)) and int(window) < ctx:
        # Exact inside the window; beyond it the model would need windowed attention.
        ctx = int(window)
    return ctx
