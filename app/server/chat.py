"""From an OpenAI chat request to a ``TurnRequest`` of the one turn pipeline
(``app.chat.turn``), and from its events to OpenAI's answer shapes. No HTTP
here, and no prompt building or stream parsing: ``ChatFormat`` and
``AnswerBuilder`` do that for every front end.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from app.api import ChatFormat, Prepared, SamplingParams, TurnError, TurnRequest, check_routing
from app.server.errors import APIError, invalid
from app.server.schemas import ChatCompletionRequest

@dataclass(frozen=True)
class Limits:
    max_tokens: int = 2048              #: the most tokens one answer may ask for
    max_request_bytes: int = 4 << 20    #: the largest request body
    max_waiting: int = 32               #: requests that may wait for the engine
    experts_per_token: int | None = None  #: routing for requests that do not set it (`serve --experts-per-token`)
    cache_aware_margin: float = 0.0       #: likewise (`serve --cache-aware`)
    image_patch_budget: int | None = None  #: patches an image may have (`serve --image-budget`; None: the default)


def client_id(keyed: bool, peer: tuple[str, int] | None) -> str:
    """Who is asking, for prefix reuse. A server with an API key has one
    principal: whoever holds the key. Without a key, every TCP connection is
    its own client (a bearer token is then unchecked, so it proves nothing)."""
    if keyed:
        return "key"
    return "conn:" + (f"{peer[0]}:{peer[1]}" if peer else "?")


def turn_request(req: ChatCompletionRequest, *, limits: Limits, client: str = "local") -> TurnRequest:
    """The turn an OpenAI request asks for; refuses what cannot be honoured."""
    max_tokens = req.max_completion_tokens or req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise invalid(f"{param} is {max_tokens}, but this server allows at most {limits.max_tokens}.", param)
    if req.n is not None and req.n != 1:
        raise invalid(f"n is {req.n}, but this server writes one answer per request (n must be 1); send "
                      f"{req.n} requests instead, with different seeds.", "n", "unsupported_value")
    if req.top_logprobs is not None and not req.logprobs:
        raise invalid("top_logprobs needs logprobs set to true.", "top_logprobs")
    if req.add_generation_prompt is False and not req.continue_final_message:
        raise invalid("add_generation_prompt false is only for continue_final_message.", "add_generation_prompt")
    if req.continue_final_message and req.add_generation_prompt:
        raise invalid("continue_final_message continues the last answer: add_generation_prompt must not be true.",
                      "add_generation_prompt")
    bias: list[tuple[int, float]] = []
    for key, value in (req.logit_bias or {}).items():
        if not re.fullmatch(r"[0-9]{1,10}", key.strip()):   # the vocabulary is checked by ChatFormat.prepare
            raise invalid(f"logit_bias keys are token ids; got {key[:40]!r}.", "logit_bias")
        bias.append((int(key), float(value)))
    try:
        params = SamplingParams(temperature=1.0 if req.temperature is None else req.temperature,
                                top_p=1.0 if req.top_p is None else req.top_p, top_k=req.top_k or 0,
                                min_p=req.min_p or 0.0, seed=req.seed,
                                frequency_penalty=req.frequency_penalty or 0.0,
                                presence_penalty=req.presence_penalty or 0.0, logit_bias=tuple(bias))
    except ValueError as exc:
        raise invalid(str(exc), "temperature") from None
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    return TurnRequest(
        messages=[m.model_dump(exclude_none=True) for m in req.messages], sampling=params,
        max_tokens=max_tokens or limits.max_tokens, thinking=req.reasoning_effort != "none",
        reasoning_effort=req.reasoning_effort,
        tools=[t.model_dump(exclude_none=True, by_alias=True) for t in req.tools] if req.tools else None,
        tool_choice=(req.tool_choice if isinstance(req.tool_choice, str) or req.tool_choice is None
                     else req.tool_choice.model_dump()),
        parallel_tool_calls=req.parallel_tool_calls is not False,
        response_format=(req.response_format.model_dump(exclude_none=True, by_alias=True)
                         if req.response_format is not None else None),
        chat_template_kwargs=req.chat_template_kwargs, stop=stops, continue_final=bool(req.continue_final_message),
        top_logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        experts_per_token=req.experts_per_token if req.experts_per_token is not None else limits.experts_per_token,
        cache_aware_margin=(req.cache_aware_margin if req.cache_aware_margin is not None
                            else limits.cache_aware_margin),
        image_patch_budget=(req.image_patch_budget if req.image_patch_budget is not None
                            else limits.image_patch_budget), client=client)


class ChatFormatter:
    """The server's face of ``ChatFormat``: OpenAI requests in, OpenAI errors out."""

    def __init__(self, model):
        self.format = ChatFormat(model)
        self.model = model

    @property
    def kind(self) -> str:
        return self.format.kind

    def prepare(self, req: ChatCompletionRequest, *, limits: Limits, n_ctx: int, client: str = "local",
                session=None, thinking_budget: int | None = None) -> Prepared:
        """``session``: the engine's, to refuse routing options its build lacks; ``thinking_budget``: the
        most tokens the answer may think (Anthropic's ``thinking.budget_tokens``)."""
        turn = turn_request(req, limits=limits, client=client)
        turn.thinking_budget = thinking_budget
        try:
            prepared = self.format.prepare(turn, n_ctx=n_ctx, max_tokens_limit=limits.max_tokens)
            if session is not None:
                check_routing(session, prepared)
            return prepared
        except TurnError as exc:
            raise APIError(400, exc.message, param=exc.param, code=exc.code) from None


def figures(counters: dict[str, float]) -> dict[str, Any]:
    """Ferry's figures for one answer, from the engine counters it moved."""
    hits, misses = counters.get("hits", 0), counters.get("misses", 0)
    dec_s, pre_s = counters.get("decode_seconds", 0), counters.get("prompt_seconds", 0)
    return {
        "tok_per_s": round(counters.get("decode_tokens", 0) / dec_s, 3) if dec_s > 0 else None,
        "prompt_tok_per_s": round(counters.get("prompt_tokens", 0) / pre_s, 3) if pre_s > 0 else None,
        "hit_rate": round(hits / (hits + misses), 6) if hits + misses else None,
        "bytes_read": int(counters.get("bytes_read", 0)),
        "counters": counters,
    }
