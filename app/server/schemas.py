"""The request and response bodies of the OpenAI-compatible API, as pydantic
models: they validate requests (strictly: unknown fields and wrong types are
refused, nothing is coerced) and they are the OpenAPI description."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

#: Ceilings that hold whatever the server's own limits are (these bound the schema).
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 256
MAX_TOOLS = 128
#: The reasoning efforts OpenAI clients send; "none" turns thinking off.
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Open(BaseModel):
    """Response bodies: clients must tolerate fields they do not know."""

    model_config = ConfigDict(extra="allow")


# ---------------------------------------------------------------- requests

class TextPart(Strict):
    type: Literal["text"]
    text: str = Field(max_length=1 << 22)


class ImageURL(Strict):
    url: str = Field(max_length=64 << 20)
    detail: Literal["auto", "low", "high"] | None = None   #: accepted; the server's patch budget applies


class ImagePart(Strict):
    """An image (models with a vision tower: Kimi K3): a data: URL; a remote URL is refused and nothing is
    fetched. The image itself is checked when the turn is prepared."""
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[Union[TextPart, ImagePart], Field(discriminator="type")]


class FunctionCall(Strict):
    name: str = Field(min_length=1, max_length=256)
    arguments: str = Field(default="", max_length=1 << 22)


class ToolCall(Strict):
    id: str | None = Field(default=None, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: str | None = Field(default=None, max_length=256)
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_call_id: str | None = Field(default=None, max_length=256)
    reasoning_content: str | None = Field(default=None, max_length=1 << 22)


class FunctionSpec(Strict):
    name: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = Field(default=None, max_length=1 << 16)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(Strict):
    name: str = Field(min_length=1, max_length=256)


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaSpec(Strict):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = Field(default=None, max_length=1 << 16)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Union[JsonSchemaSpec, dict[str, Any], None] = Field(
        default=None, description="{name, schema, ...} as OpenAI has it, or the schema itself")


class StreamOptions(Strict):
    include_usage: bool = False


class ChatCompletionRequest(Strict):
    model: str = Field(max_length=512)
    messages: list[Message] = Field(min_length=1, max_length=4096)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=1 << 20, description="Ferry extension (as vLLM's)")
    min_p: float | None = Field(default=None, ge=0, lt=1, description="Ferry extension (as vLLM's)")
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: Union[str, list[str], None] = None
    seed: int | None = Field(default=None, ge=0, le=1 << 53)
    n: int | None = Field(default=None, ge=1, le=128, description="only 1 is served (one answer per request)")
    user: str | None = Field(default=None, max_length=512, description="accepted; not stored")
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = Field(
        default=None, max_length=1024, description="token id (as a string) -> bias, -100..100")
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    experts_per_token: int | None = Field(default=None, ge=1, le=1024,
                                          description="Ferry extension: experts each token visits (opt-in, "
                                                      "inexact)")
    cache_aware_margin: float | None = Field(default=None, ge=0, le=1000,
                                             description="Ferry extension: prefer cached experts within this "
                                                         "router-score margin (opt-in, inexact)")
    image_patch_budget: int | None = Field(default=None, ge=16, le=65536,
                                           description="Ferry extension: patches each image may have (its cost: "
                                                       "a quarter as many prompt positions); default: the "
                                                       "server's --image-budget")
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    reasoning_effort: Literal[REASONING_EFFORTS] | None = Field(  # type: ignore[valid-type]
        default=None, description="'none' turns thinking off; other values set the effort where the format has one")
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None, description="extra variables for the model's Jinja chat template, e.g. enable_thinking")
    continue_final_message: bool | None = Field(
        default=None, description="the last message is an assistant's unfinished answer: continue it (as vLLM's)")
    add_generation_prompt: bool | None = Field(
        default=None, description="false with continue_final_message (vLLM's pair); a new answer needs true")


# ---------------------------------------------------------------- responses

class ErrorDetail(Open):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(Open):
    error: ErrorDetail


class ModelCard(Open):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    max_model_len: int | None = Field(default=None, description="the context length (as vLLM names it)")
    capabilities: list[str] | None = Field(default=None, description="what the model's chat format can do, as LM "
                                           "Studio lists it: \"tool_use\" when it takes tools")


class ModelList(Open):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class OutFunction(Open):
    name: str
    arguments: str


class OutToolCall(Open):
    id: str
    type: Literal["function"] = "function"
    function: OutFunction


class AssistantMessage(Open):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[OutToolCall] | None = None


class Choice(Open):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: dict[str, Any] | None = None


class Usage(Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None
    completion_tokens_details: dict[str, int] | None = None


class FerryFigures(Open):
    """Ferry's own figures for the answer (the engine's counters)."""

    tok_per_s: float | None = None
    prompt_tok_per_s: float | None = None
    hit_rate: float | None = None
    bytes_read: int = 0
    seconds: float = 0.0
    queue_seconds: float = 0.0


class ChatCompletion(Open):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    ferry: FerryFigures | None = None


class FerryStatus(Open):
    model: str
    activations: str = "f32"   #: the arithmetic that runs: "q8" 8-bit activations (the default's), "f32" exact
    busy: bool
    waiting: int
    served: int
    cancelled: int
