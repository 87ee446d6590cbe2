"""OpenAI chat-completions wire format: requests to LangChain messages and call options, messages back to
completions and chunks. Pydantic models (they make the OpenAPI description) and pure functions only."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.ai import UsageMetadata
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError, field_validator, model_validator

from agent_gravity._config import GravityConfig

_FORBID = ConfigDict(extra="forbid")


class WireError(ValueError):
    """A request the proxy cannot serve; ``param`` names the field at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


# -- request ---------------------------------------------------------------------------------------


class TextPart(BaseModel):
    model_config = _FORBID
    type: Literal["text"]
    text: str


def _text_parts_only(content: Any) -> Any:
    """Refuse image, audio and file parts with a message that says so (the model reads text only)."""
    if isinstance(content, list):
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise ValueError(f"content parts of type {kind!r} are not supported; send text parts only")
    return content


class _Message(BaseModel):
    model_config = _FORBID
    name: str | None = None
    """Accepted and ignored (the model sees no participant names)."""

    @field_validator("content", mode="before", check_fields=False)
    @classmethod
    def _only_text(cls, value: Any) -> Any:
        return _text_parts_only(value)


class SystemMessageIn(_Message):
    role: Literal["system", "developer"]
    content: str | list[TextPart]


class UserMessageIn(_Message):
    role: Literal["user"]
    content: str | list[TextPart]


class FunctionCallIn(BaseModel):
    model_config = _FORBID
    name: str
    arguments: str
    """The call's arguments as a JSON object, encoded as a string (OpenAI's form)."""

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str) -> str:
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"arguments must be a JSON object encoded as a string, got invalid JSON ({exc})") from None
        if not isinstance(parsed, dict):
            raise ValueError("arguments must be a JSON object encoded as a string")
        return value


class ToolCallIn(BaseModel):
    model_config = _FORBID
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class AssistantMessageIn(_Message):
    role: Literal["assistant"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    # Clients send a completion's message back as it came: these are accepted and not shown to the model.
    reasoning_content: str | None = None
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: None = None
    function_call: None = None


class ToolMessageIn(_Message):
    role: Literal["tool"]
    content: str | list[TextPart]
    tool_call_id: str


Message = Annotated[SystemMessageIn | UserMessageIn | AssistantMessageIn | ToolMessageIn, Field(discriminator="role")]


class FunctionDef(BaseModel):
    model_config = _FORBID
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON schema object; the engine's grammar holds each call's arguments to it."""
    strict: bool | None = None
    """Accepted; calls are always held to the schema."""


class ToolDef(BaseModel):
    model_config = _FORBID
    type: Literal["function"]
    function: FunctionDef


class _ToolName(BaseModel):
    model_config = _FORBID
    name: str


class NamedToolChoice(BaseModel):
    model_config = _FORBID
    type: Literal["function"]
    function: _ToolName


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    """The JSON schema the answer is held to; None: any JSON object."""
    strict: bool | None = None
    """Accepted; the grammar is always strict."""


class TextFormat(BaseModel):
    model_config = _FORBID
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    model_config = _FORBID
    type: Literal["json_object"]


class JsonSchemaFormat(BaseModel):
    model_config = _FORBID
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class StreamOptions(BaseModel):
    model_config = _FORBID
    include_usage: bool | None = None
    """Send one more chunk, with empty ``choices``, holding the usage of the whole request."""
    include_obfuscation: bool | None = None
    """Accepted and ignored: chunks are never padded."""


def _gravity_patch(value: Any) -> dict[str, Any] | None:
    if value is not None and not isinstance(value, dict):
        raise ValueError("gravity must be an object of GravityConfig fields")
    return value


def _zero(name: str) -> Any:
    def check(value: float | None) -> float | None:
        if value:
            raise ValueError(f"{name} is not supported by the gravity proxy; send 0 or leave it out")
        return value
    return PlainValidator(check, json_schema_input_type=float | None)


class ChatCompletionRequest(BaseModel):
    """A chat completion request: OpenAI's fields, plus the extensions ``gravity``, ``task`` and
    ``conversation_id``. Fields OpenAI has and this proxy cannot honour are refused, never ignored in silence."""

    model_config = _FORBID

    messages: list[Message] = Field(min_length=1)
    model: str | None = None
    """The served model's name (see ``GET /v1/models``); optional here."""
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    max_tokens: int | None = Field(None, ge=1)
    """Cap on every generated token, reasoning and answer together (deprecated by OpenAI: use
    ``max_completion_tokens``)."""
    max_completion_tokens: int | None = Field(None, ge=1)
    """Cap on every generated token, reasoning and answer together."""
    stop: str | list[str] | None = None
    n: int | None = Field(None, description="Only 1: one choice per request.")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    """Accepted; under ``auto`` the model may write several calls, a forced call is one call."""
    response_format: ResponseFormat | None = None
    logprobs: bool | None = Field(None, description="Only false: log-probabilities are not returned.")
    top_logprobs: int | None = Field(None, description="Only null: log-probabilities are not returned.")
    frequency_penalty: Annotated[float | None, _zero("frequency_penalty")] = None
    presence_penalty: Annotated[float | None, _zero("presence_penalty")] = None
    user: str | None = None
    """Accepted and ignored, like ``metadata``, ``store`` and ``service_tier``."""
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    gravity: Annotated[dict[str, Any] | None, PlainValidator(
        _gravity_patch, json_schema_input_type=GravityConfig | None)] = None
    """Extension: GravityConfig fields for this call. Each field given replaces the server's value; the
    rest keep the server's configuration."""
    task: str | None = None
    """Extension: the kind of work (e.g. ``legal``); kinds in ``gravity.excluded_tasks`` never end early."""
    conversation_id: str | None = None
    """Extension: keep this conversation's KV cache across calls, on backends with session caches."""

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError(f"n={value} is not supported: the gravity proxy returns one choice per request; "
                             "send n=1 or leave it out")
        return value

    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _no_logprobs(cls, value: Any, info: Any) -> Any:
        if value:
            raise ValueError(f"{info.field_name} is not supported: the gravity proxy returns no log-probabilities "
                             "(the response's gravity field has the entropy of every token)")
        return value

    @model_validator(mode="after")
    def _one_budget(self) -> ChatCompletionRequest:
        if None not in (self.max_tokens, self.max_completion_tokens) and self.max_tokens != self.max_completion_tokens:
            raise ValueError("max_tokens and max_completion_tokens differ; send only max_completion_tokens")
        return self


# -- request to LangChain ----------------------------------------------------------------------------


def _text(content: str | list[TextPart] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part.text for part in content)


def to_message(message: SystemMessageIn | UserMessageIn | AssistantMessageIn | ToolMessageIn) -> BaseMessage:
    """The LangChain message of one wire message (``developer`` is a system message)."""
    text = _text(message.content)
    if isinstance(message, SystemMessageIn):
        return SystemMessage(text)
    if isinstance(message, UserMessageIn):
        return HumanMessage(text)
    if isinstance(message, ToolMessageIn):
        return ToolMessage(text, tool_call_id=message.tool_call_id)
    calls = [{"name": c.function.name, "args": json.loads(c.function.arguments), "id": c.id}
             for c in message.tool_calls or ()]
    return AIMessage(text, tool_calls=calls)


CLIENT_SETTINGS = frozenset({"enabled", "max_reasoning_tokens", "max_answer_tokens"})
"""The GravityConfig fields a client may send in ``gravity`` unless the operator allows others."""
_BUDGETS = ("max_reasoning_tokens", "max_answer_tokens")


def checked_client_settings(names: Iterable[str]) -> frozenset[str]:
    """The operator's allowlist of client settings, each a GravityConfig field; ValueError naming one that is not."""
    allowed = frozenset(names)
    unknown = sorted(allowed - set(GravityConfig.model_fields))
    if unknown:
        raise ValueError(f"client settings {unknown} are not GravityConfig fields; choose from "
                         f"{', '.join(GravityConfig.model_fields)}")
    return allowed


def client_gravity(server: GravityConfig, patch: dict[str, Any], allowed: frozenset[str]) -> GravityConfig:
    """The configuration for a call whose client sent ``patch``: only fields the operator ``allowed``, and budgets
    no higher than the server's own; WireError naming the field otherwise."""
    for name in patch:
        if name not in allowed:
            raise WireError(f"gravity.{name} is not a setting clients may change on this server; send only "
                            f"{', '.join(sorted(allowed)) or 'no gravity settings'} (its operator can allow more)",
                            f"gravity.{name}")
    config = gravity_config(server, patch)
    for name in _BUDGETS:
        if getattr(config, name) > getattr(server, name):
            raise WireError(f"gravity.{name} may not exceed this server's {getattr(server, name)}; send a lower "
                            "budget or leave it out", f"gravity.{name}")
    return config


def gravity_config(base: GravityConfig, patch: dict[str, Any]) -> GravityConfig:
    """``base`` with the fields of ``patch`` replaced, validated as a whole."""
    try:
        return GravityConfig.model_validate({**base.model_dump(), **patch})
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = ".".join(str(p) for p in error["loc"])
        raise WireError(f"gravity{'.' + loc if loc else ''}: {error['msg']}",
                        f"gravity.{loc}" if loc else "gravity") from None


def _grammar(fmt: TextFormat | JsonObjectFormat | JsonSchemaFormat | None) -> dict[str, Any] | None:
    if isinstance(fmt, JsonSchemaFormat) and fmt.json_schema.schema_ is not None:
        return fmt.json_schema.schema_
    return {"type": "object"} if isinstance(fmt, JsonObjectFormat | JsonSchemaFormat) else None


def call_options(request: ChatCompletionRequest, gravity: GravityConfig,
                 client_settings: frozenset[str] = CLIENT_SETTINGS) -> dict[str, Any]:
    """ChatGravity's per-call options for ``request``, on a server whose gravity configuration is ``gravity`` and
    whose clients may change ``client_settings`` of it (see ``client_gravity``).

    The request's ``model`` is never passed on: a client must not make the server load another model.
    """
    options: dict[str, Any] = {
        "temperature": request.temperature, "top_p": request.top_p, "seed": request.seed,
        "max_tokens": request.max_completion_tokens or request.max_tokens, "task": request.task,
        "conversation_id": request.conversation_id, "response_format": _grammar(request.response_format),
    }
    options = {k: v for k, v in options.items() if v is not None}
    if request.gravity is not None:
        options["gravity"] = client_gravity(gravity, request.gravity, client_settings)
    if request.tools is not None:
        options["tools"] = [t.model_dump(exclude_none=True) for t in request.tools]
    if request.tool_choice is not None:
        choice = request.tool_choice
        options["tool_choice"] = choice.model_dump() if isinstance(choice, NamedToolChoice) else choice
    return options


def stop_sequences(request: ChatCompletionRequest) -> list[str] | None:
    """The request's stop sequences as a list."""
    return [request.stop] if isinstance(request.stop, str) else request.stop


# -- responses -------------------------------------------------------------------------------------


class FunctionCallOut(BaseModel):
    name: str
    arguments: str
    """JSON object as a string; a call that did not parse has its raw text here."""


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    """The answer; null when the message holds only tool calls."""
    reasoning_content: str | None = None
    """Extension: the reasoning the model wrote before its answer (present when there is some)."""
    tool_calls: list[ToolCallOut] | None = None
    refusal: None = None


FinishReason = Literal["stop", "length", "tool_calls"]


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessageOut
    finish_reason: FinishReason
    logprobs: None = None


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: CompletionTokensDetails | None = None


class GravityReport(BaseModel):
    """What gravity saw and did during the call (``response_metadata["gravity"]`` of ChatGravity)."""

    model_config = ConfigDict(extra="allow")

    enabled: bool
    """Whether any early exit could fire for this call."""
    terminated_early: bool
    """Gravity closed the reasoning before the model did, or a loop was stopped."""
    reason: str | None = None
    """``gravity``, ``loop``, ``model_ended`` or ``reasoning_budget``."""
    detail: str | None = None
    lock_step: int | None = None
    reasoning_tokens: int
    answer_tokens: int
    answer_complete: bool
    """False when the answer ran out of its budget or a loop in it was cut."""
    tokens_saved_upper_bound: int | None = None
    entropy: list[float | None]
    """Entropy (nats) of the distribution each generated token came from (null where none was seen)."""
    entropy_mean: float | None = None
    route: dict[str, Any] | None = None
    """How the call was routed (adaptive thinking or a cascade of ``--upstream-tier`` servers): which tier
    answered, the entropy score it was judged by, and the tiers tried before it."""


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None
    gravity: GravityReport | None = None
    """Extension: what gravity saw and did during the call."""


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta | None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    """Extension: reasoning as it is written."""
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    """Only on the extra last chunk asked for with ``stream_options.include_usage``."""
    gravity: GravityReport | None = None
    """Extension: on the chunk that carries the finish reason."""


def usage(metadata: UsageMetadata | None) -> Usage | None:
    """OpenAI usage of LangChain usage metadata (reasoning tokens when the metadata counts them)."""
    if metadata is None:
        return None
    reasoning = (metadata.get("output_token_details") or {}).get("reasoning")
    return Usage(prompt_tokens=metadata["input_tokens"], completion_tokens=metadata["output_tokens"],
                 total_tokens=metadata["total_tokens"],
                 completion_tokens_details=None if reasoning is None else CompletionTokensDetails(
                     reasoning_tokens=reasoning))


def finish_reason(message: AIMessage, has_calls: bool) -> FinishReason:
    """``length`` when the budget cut the output, else ``tool_calls`` when it holds calls, else ``stop``."""
    if message.response_metadata.get("finish_reason") == "length":
        return "length"
    return "tool_calls" if has_calls else "stop"


def _gravity(message: AIMessage) -> GravityReport | None:
    report = message.response_metadata.get("gravity")
    return GravityReport.model_validate(report) if report is not None else None


def _tool_calls(message: AIMessage) -> list[ToolCallOut]:
    valid = [(c["id"], c["name"], json.dumps(c["args"], ensure_ascii=False)) for c in message.tool_calls]
    invalid = [(c["id"], c["name"], c["args"]) for c in message.invalid_tool_calls]
    return [ToolCallOut(id=i or "", function=FunctionCallOut(name=n or "", arguments=a or ""))
            for i, n, a in valid + invalid]


def completion(message: AIMessage, *, id: str, created: int, model: str) -> ChatCompletion:
    """The ChatCompletion of a ChatGravity message; invalid tool calls go out with their raw text."""
    calls = _tool_calls(message)
    reasoning = message.additional_kwargs.get("reasoning_content") or None
    out = AssistantMessageOut(content=None if calls and not message.text else message.text,
                              reasoning_content=reasoning, tool_calls=calls or None)
    return ChatCompletion(id=id, created=created, model=model, usage=usage(message.usage_metadata),
                          choices=[Choice(message=out, finish_reason=finish_reason(message, bool(calls)))],
                          gravity=_gravity(message))


def first_chunk(*, id: str, created: int, model: str) -> ChatCompletionChunk:
    """The chunk that opens every stream: the role, no text yet."""
    return ChatCompletionChunk(id=id, created=created, model=model,
                               choices=[ChunkChoice(delta=Delta(role="assistant", content=""))])


def _arguments(args: str | None) -> str:
    """A streamed call's arguments: ChatGravity sends a call that did not parse as a JSON string of its text."""
    try:
        decoded = json.loads(args or "")
    except json.JSONDecodeError:
        return args or ""
    return decoded if isinstance(decoded, str) else args


def chunks(message: AIMessageChunk, *, id: str, created: int, model: str,
           include_usage: bool) -> list[ChatCompletionChunk]:
    """The wire chunks of one ChatGravity stream chunk: none for an empty one; the last one carries the finish
    reason and ``gravity`` (and is followed by a usage chunk when ``include_usage``)."""
    last = message.chunk_position == "last"
    reasoning = message.additional_kwargs.get("reasoning_content") or None
    calls = [ToolCallDelta(index=c["index"] if c["index"] is not None else i, id=c["id"], type="function",
                           function=FunctionCallDelta(name=c["name"] or "", arguments=_arguments(c["args"])))
             for i, c in enumerate(message.tool_call_chunks)]
    delta = Delta(content=message.text or None, reasoning_content=reasoning, tool_calls=calls or None)

    def chunk(**fields: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=id, created=created, model=model, **fields)

    if not last:
        return [chunk(choices=[ChunkChoice(delta=delta)])] if delta.content or delta.reasoning_content else []
    out = [chunk(gravity=_gravity(message),
                 choices=[ChunkChoice(delta=delta, finish_reason=finish_reason(message, bool(calls)))])]
    if include_usage:
        out.append(chunk(choices=[], usage=usage(message.usage_metadata)))
    return out


# -- other endpoints -------------------------------------------------------------------------------


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "agent-gravity"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class ErrorDetail(BaseModel):
    message: str
    """What went wrong and what to change."""
    type: str
    """``invalid_request_error`` (4xx), ``upstream_error`` (502), ``timeout_error`` (504) or ``server_error`` (500,
    503)."""
    param: str | None = None
    code: str | None = None
    request_id: str | None = None
    """The ``x-request-id`` of the request; the server's log has the detail of a failure under it."""


class ErrorResponse(BaseModel):
    """OpenAI's error body; a stream that fails after it began sends it as its last event."""

    error: ErrorDetail
