"""How matrix products treat their input vectors, and what each front end
says about it: THE default every place a model is opened takes (the CLI,
the server, the window, document Q&A, the wizard and `ferry get`). Pure
Python, so settings load without the core.

- ``auto`` (the default): each token's input is rounded to 8 bits (per 32
  values; per 256 for K-quant weights) and quantized weights (q8_0, q4_0,
  q4_1, q4_k, q5_k, q6_k, q3_nl, iq4_xs) are multiplied with integer dot products, as
  llama.cpp does; other weights stay exact, and a model without such weights
  runs the exact path. On the real demo weights this moves the next-token
  distribution by a mean KL of about 0.006, far below what the 4-bit weights
  themselves do (docs/QUANTIZATION.md, "8-bit activations"). On models
  with Kimi Delta Attention layers (Kimi-Linear, K3) ``auto`` takes 8-bit
  activations only on the classes of products whose measured distance from
  exact stayed at most 5 % of the weight formats' own error when switched
  alone (docs/QUANTIZATION.md, "8-bit activations on the Kimi path"):
  Kimi-Linear's routed experts, MLA, KDA's gates and the output head; K3's
  MLA and output head; the rest (KDA's q/k/v and output, the dense and
  shared FFNs, K3's latent projections and experts) run exact. q3_nl
  experts take 8-bit activations too (their grid as int8 levels; on the
  tiny random MoE models with q3_nl experts the default's mean KL from
  exact rose by at most 0.0002, to 0.0001-0.004).
- ``exact`` (alias ``f32``): the stored weights times the exact f32
  activations, for verification and the reference checks.
- ``q8``: as ``auto``, but refused by a kernel set without integer products.

The engine reports which path runs (``ModelInfo.activations``: ``"q8"`` or
``"f32"``); :func:`describe` words it for the user.
"""
from __future__ import annotations

#: What ``--activations`` (and ``Engine(activations=...)``) accepts.
ACTIVATION_CHOICES = ("auto", "exact", "q8", "f32")
#: THE default: 8-bit activations where the weights are quantized.
DEFAULT_ACTIVATIONS = "auto"
#: The exact mode's name (``f32`` is its alias).
EXACT = "exact"


def canonical(name: str | None) -> str:
    """``auto``, ``exact`` or ``q8`` for any accepted name (None or "": the
    default; ``f32``: exact). An unknown name is returned as given, for the
    engine to refuse by name."""
    name = (name or DEFAULT_ACTIVATIONS).strip().lower()
    return EXACT if name == "f32" else name


def is_exact(name: str | None) -> bool:
    return canonical(name) == EXACT


def describe(running: str, asked: str | None = DEFAULT_ACTIVATIONS) -> str:
    """What arithmetic runs, in the user's words: ``running`` is the engine's
    ``ModelInfo.activations`` ("q8" or "f32"), ``asked`` the mode it was
    opened with."""
    asked = canonical(asked)
    if running == "q8":
        how = "default" if asked == DEFAULT_ACTIVATIONS else f"--activations {asked}"
        return f"8-bit activations ({how}; --activations exact for exact)"
    if asked == EXACT:
        return "exact f32 activations (--activations exact)"
    return "exact f32 activations (the default for this model)"
