"""The context a session opens with: one rule for every front end (no Qt, no core)."""
from __future__ import annotations

#: The context a session opens with when nobody asked for one (tokens).
DEFAULT_CONTEXT = 4096


def session_context(requested: int | None, max_ctx: int) -> int:
    """The context a session opens with, the one rule of every front end: ``requested`` tokens, 0 the
    model's whole trained context; None (not asked for) DEFAULT_CONTEXT, or the model's trained length
    when that is shorter. A request beyond the model's length is passed on for the engine to refuse
    with its own message (the window clamps its setting instead: it is kept across models)."""
    if requested is None:
        return min(DEFAULT_CONTEXT, max_ctx) if max_ctx > 0 else DEFAULT_CONTEXT
    if requested == 0 and max_ctx > 0:
        return max_ctx
    return requested
