"""Surface: ChatGravity, a LangChain chat model whose every call is steered by gravity."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolCallChunk
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult, Generation
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr, model_validator

from agent_gravity import _model_store
from agent_gravity._cascade import Cascade
from agent_gravity._compaction import compact_history
from agent_gravity._config import (
    NATIVE_THINK,
    ComputeConfig,
    GravityConfig,
    KVConfig,
    ReasoningFormat,
    RouteConfig,
    TelemetryConfig,
    Tier,
)
from agent_gravity._errors import ContextLengthError, InvalidCallOptionError
from agent_gravity._messages import gravity_metadata, to_chat_dicts, usage_metadata
from agent_gravity._profile import load_profile, profile_path
from agent_gravity._reasoning import ReasoningSplitter, scaffold, split_reasoning
from agent_gravity._route import DirectGate
from agent_gravity._steering import ReasoningIds, SteeringSpec
from agent_gravity.telemetry._call import ChatTelemetry, chat_telemetry
from agent_gravity.telemetry._content import output_messages
from agent_gravity.telemetry._trace_file import zone_of
from agent_gravity._tools import (
    OPEN,
    ToolSet,
    ToolStreamSplitter,
    auto_grammar,
    convert_tools,
    forced_grammar,
    parse_output,
    with_tools,
)
from agent_gravity._tools import tool_choice as _tool_choice
from agent_gravity.backends._compute import ComputeSpec
from agent_gravity.backends._layer_skip import SkipSpec
from agent_gravity.backends.base import (
    Backend,
    GenerationDelta,
    GenerationRequest,
    GenerationResult,
    SamplingSettings,
    StreamItem,
    adrain,
    drain,
)

_OVERRIDES = ("gravity", "temperature", "top_p", "seed", "task", "max_tokens", "timeout", "model", "conversation_id",
              "compute", "route")
_PER_CALL_ONLY = ("response_format", "ls_structured_output_format", "tools", "tool_choice")


@dataclass
class _Call:
    """One prepared model call: what goes to the backend and how to read what comes back."""

    backend: Backend
    request: GenerationRequest
    fmt: ReasoningFormat | None
    params: dict[str, Any]
    config: GravityConfig
    task: str | None = None
    tools: ToolSet | None = None
    from_profile: bool = False
    direct: GenerationRequest | None = None
    """The same call answered with an empty reasoning (adaptive thinking); None when the call always reasons."""
    direct_below: float | None = None
    route: dict[str, Any] | None = None
    """How the call was routed, for ``response_metadata["gravity"]["route"]``; None when it was not."""

    direct_tokens: int = 0
    carried: str = ""
    """Reasoning a lower tier wrote that this call continues (its prompt ends with it): the start of the output."""

    def routed(self, gate: DirectGate) -> _Call:
        """This call as the gate routed it: its direct answer (no reasoning phase to split off), or reasoning."""
        route = gate.record(self.direct_below)
        if gate.verdict:
            return dataclasses.replace(self, request=self.direct, fmt=None, direct=None, route=route)
        return dataclasses.replace(self, direct=None, route=route)


# Scanning the vocabulary costs milliseconds: once per backend (and marker), not once per call.
@functools.lru_cache(maxsize=32)
def _line_break_ids(backend: Backend) -> tuple[int, ...]:
    """Vocabulary ids whose text ends with a line break."""
    return tuple(i for i, t in enumerate(backend.token_texts) if t.endswith("\n"))


@functools.lru_cache(maxsize=32)
def _bracket_deltas(backend: Backend) -> tuple[tuple[int, int], ...]:
    """``(id, opened minus closed)`` for vocabulary ids that open or close a JSON bracket."""
    deltas = ((i, t.count("{") + t.count("[") - t.count("}") - t.count("]")) for i, t in enumerate(backend.token_texts))
    return tuple((i, d) for i, d in deltas if d)


@functools.lru_cache(maxsize=32)
def _ids_spelling(backend: Backend, text: str) -> tuple[int, ...]:
    """Vocabulary ids whose text, stripped of surrounding white space, is ``text``."""
    return tuple(i for i, t in enumerate(backend.token_texts) if text and t.strip() == text)


def reasoning_ids(backend: Backend, fmt: ReasoningFormat, config: GravityConfig) -> ReasoningIds:
    """Token ids the engine needs to close reasoning in ``fmt``."""
    end_ids = tuple(backend.encode(fmt.end))
    first_piece = backend.decode(end_ids[:1]).strip()
    return ReasoningIds(
        end_ids=end_ids,
        end_start_ids=tuple(sorted({end_ids[0], *_ids_spelling(backend, first_piece)})),
        answer_prefix_ids=tuple(backend.encode(fmt.answer_prefix)),
        line_break_ids=_line_break_ids(backend),
        newline_ids=tuple(backend.encode("\n")),
        max_reasoning_tokens=config.max_reasoning_tokens,
    )


@functools.lru_cache(maxsize=32)
def _tool_guard_ids(backend: Backend) -> tuple[int, ...]:
    """Vocabulary ids that may begin a ``<tool_call>`` tag (their text holds a ``<``)."""
    return tuple(i for i, t in enumerate(backend.token_texts) if "<" in t)


def steering_spec(backend: Backend, config: GravityConfig, task: str | None,
                  ids: ReasoningIds | None, structured: bool = False, tools: bool = False) -> SteeringSpec:
    """What the engine runs for one call: the policies only when early exits may fire for ``task``."""
    active = config.active_for(task)
    return SteeringSpec(
        key=uuid.uuid4().hex, eos_ids=tuple(backend.eos_ids),
        policy=config.policy if active else None, loop=config.loop if active else None,
        probe=config.probe.spec() if active and config.probe else None,
        min_tokens=config.min_tokens, reasoning=ids, brackets=_bracket_deltas(backend), structured=structured,
        guard_ids=_tool_guard_ids(backend) if tools else (),
    )


async def _achain(held: Sequence[StreamItem], rest: AsyncIterator[StreamItem]) -> AsyncIterator[StreamItem]:
    """``held`` items, then the rest of an async stream."""
    for item in held:
        yield item
    async for item in rest:
        yield item


class _RefusesCut:
    """Mixed into LangChain's JSON parsers: an output the token budget cut is refused, not closed by the parser
    into a value the model never finished (OpenAI's client refuses it the same way). Partial values still stream;
    the stream ends with the refusal."""

    def parse_result(self, result: list[Generation], *, partial: bool = False) -> Any:
        message = getattr(result[0], "message", None) if result else None
        if message is not None and message.response_metadata.get("finish_reason") == "length":
            tokens = (message.usage_metadata or {}).get("output_tokens")
            raise OutputParserException(
                f"the structured output was cut by the token budget after {tokens} tokens, so it is not whole "
                "JSON; raise max_tokens (or GravityConfig.max_answer_tokens) or ask for a shorter value",
                llm_output=message.text)
        return super().parse_result(result, partial=partial)  # type: ignore[misc]


class _WholeJsonParser(_RefusesCut, JsonOutputParser):
    """JsonOutputParser that refuses a cut output."""


class _WholePydanticParser(_RefusesCut, PydanticOutputParser):
    """PydanticOutputParser that refuses a cut output."""


def local_backend(model: str | None = None, **settings: Any) -> Backend:
    """Start (or join) the local vLLM engine for a model folder, or the embedded default (None or its name).

    The engine knows the scaffold's reasoning markers, so vLLM's own ``thinking_token_budget`` works on it (the
    baseline the benches compare against) and every chat model and bench on one model shares one engine.
    """
    from agent_gravity.backends.local_vllm import EngineSettings, shared_backend

    if model is None or model == _model_store.DEFAULT_MODEL.name:
        folder, name = _model_store.pull(), _model_store.DEFAULT_MODEL.name
    else:
        folder, name = Path(model).expanduser().resolve(), None
    settings.setdefault("reasoning_markers", ReasoningFormat().engine_markers())
    return shared_backend(EngineSettings(str(folder), **settings), name)


def _compute_spec(compute: ComputeConfig | None, backend: Backend) -> ComputeSpec | None:
    """The backend's zone-compute settings for ``compute``; InvalidCallOptionError when the backend cannot act in
    its decode loop."""
    if compute is None:
        return None
    if not getattr(backend, "zone_compute", False):
        raise InvalidCallOptionError(
            f"ComputeConfig needs a backend that acts inside gravity zones in its own decode loop "
            f"(TransformersBackend); the {backend.provider} backend cannot change compute per request. vLLM's own "
            "options are engine-wide (`--kv-cache-dtype fp8` for every entry), and its speculative decoding "
            "(`--speculative-config`) refuses custom logits processors, gravity's included; pass compute=None here")
    try:
        profile = load_profile(backend.model_name) if "profile" in (
            compute.speculate and compute.speculate.layers, compute.skip and compute.skip.layers) else None
        spec = compute.calibrated(profile.layers if profile else None, backend.model_name).spec()
    except ValueError as exc:
        raise InvalidCallOptionError(f"ComputeConfig: {exc}") from exc
    draft_layers = SkipSpec(layers=spec.draft.layers) if spec.draft and spec.draft.layers else None
    for name, layers in (("skip", spec.skip), ("speculate.layers", draft_layers)):
        if layers is not None:
            try:
                backend.skip_layers(layers)
            except ValueError as exc:
                raise InvalidCallOptionError(f"ComputeConfig.{name}: {exc}") from exc
    return spec


class ChatGravity(BaseChatModel):
    """Chat model that watches next-token entropy and ends reasoning once it has locked in.

    ``ChatGravity()`` runs the embedded SmolLM2-135M-Instruct on the local vLLM backend;
    ``model`` names any local Hugging Face model folder instead. With ``base_url`` it runs on
    OpenAI-compatible servers (vLLM with our plugin decides exits in-engine; others are steered from here).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    model: str | None = None
    """A local model folder; None (or the name ``SmolLM2-135M-Instruct``) uses the embedded default,
    fetched and converted on first use."""
    gravity: GravityConfig = Field(default_factory=GravityConfig)
    temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    task: str | None = None
    """The kind of work (e.g. ``legal``); kinds in ``gravity.excluded_tasks`` never end early."""
    max_tokens: int | None = Field(None, ge=1)
    """Cap on every generated token, reasoning and answer together; None: the GravityConfig budgets.
    An answer cut by it has ``answer_complete`` false."""
    stop: list[str] | None = None
    """Stop sequences for every call, added to those a call passes."""
    timeout: float | None = Field(None, gt=0)
    """Seconds a call may take; past it the request is aborted and EngineTimeoutError raised."""
    max_retries: int = Field(2, ge=0)
    """Times a failed request is sent again, on servers (``base_url``); it goes on from the tokens already
    received. The local engine has no transient failures worth retrying, so it has no effect there."""
    base_url: str | list[str] | None = None
    """OpenAI-compatible server(s) serving ``model`` (its served name; None: their only model). Several URLs
    serving the same model share the requests, each to the least busy."""
    api_key: SecretStr | None = None
    """The servers' API key (sent as a bearer token)."""
    kv: KVConfig | None = None
    """Trim each conversation's KV cache as it grows (needs a backend with session caches: transformers)."""
    compute: ComputeConfig | None = None
    """Make the tokens inside gravity zones cheaper (needs a backend that drafts: transformers); also a per-call
    option."""
    conversation_id: str | None = None
    """Keep this conversation's KV cache across calls on a backend that has sessions (transformers), so an
    unchanged history is never prefilled again; also a per-call option. The vLLM backend reuses unchanged
    prefixes by itself (prefix caching)."""
    streaming: bool = False
    """``invoke`` streams under the hood (LangChain's convention); the result is the same message."""
    max_model_len: int = Field(4096, ge=16)
    route: RouteConfig | None = None
    """Route by entropy: answer without reasoning when a direct answer is sure (``think="adaptive"``), and with
    ``tiers``, when a cheaper tier's answer stands; also a per-call option."""
    tiers: list[Tier] | None = None
    """A cascade, cheapest first: each call starts on the first tier and goes up while ``route`` says the output
    is unsure (see RouteConfig); the last tier's answer always stands. A call's ``gravity`` option applies to the
    tiers that do not set their own."""
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    """Spans (own, enrich the caller's, off), opt-in message content, and the entropy trace file."""
    backend: Any = Field(default=None, exclude=True)
    """A ready Backend to use instead of starting the local vLLM engine."""

    _backend: Backend | None = PrivateAttr(default=None)
    _profile: str | None = PrivateAttr(default=None)
    _risk: dict[str, Any] | None = PrivateAttr(default=None)
    _tiers: Cascade | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _load_gravity_profile(self) -> ChatGravity:
        """Without an explicit ``gravity``, use the model's calibrated profile when there is one."""
        if "gravity" not in self.model_fields_set:
            name = self.profile_key()
            profile = load_profile(name)
            if profile is not None and profile.gravity is not None:
                self.gravity, self._profile = profile.gravity, str(profile_path(name))
                self._risk = profile.calibration.risk(self._profile) if profile.calibration else None
        return self

    @model_validator(mode="after")
    def _build_tiers(self) -> ChatGravity:
        """Each tier is a chat model of its own: this one's settings, with the tier's in place of them."""
        if self.tiers is None:
            return self
        names = [t.name for t in self.tiers]
        if len(names) < 2 or len(set(names)) != len(names):
            raise ValueError(f"tiers needs at least two tiers with distinct names, cheapest first; got {names}")
        route = self.route or RouteConfig()
        if unknown := sorted(set(route.tasks.values()) - set(names)):
            raise ValueError(f"route.tasks names tiers {unknown} that are not among the tiers {names}")
        inherited = {k: getattr(self, k) for k in self.model_fields_set - {"tiers"}}
        models = []
        for tier in self.tiers:
            own = tier.overrides()
            base = {k: v for k, v in inherited.items() if not (own.keys() & Tier.ENGINE_FIELDS and
                                                                 k in Tier.ENGINE_FIELDS)}
            models.append(type(self)(**{**base, **own}))
        self._tiers = Cascade(tuple(names), tuple(models), route, self.task,
                              tuple(t.gravity is not None for t in self.tiers))
        return self

    def _cascade(self) -> Cascade:
        assert self._tiers is not None
        return self._tiers

    def profile_key(self) -> str:
        """The model name profiles are saved and found under (the backend's ``model_name``; the last tier's)."""
        if self._tiers is not None:
            return self._tiers.models[-1].profile_key()
        if self.backend is not None:
            return self.backend.model_name
        if self.model is None:
            return _model_store.DEFAULT_MODEL.name
        return self.model if self.base_url is not None else Path(self.model).expanduser().resolve().name

    @property
    def _llm_type(self) -> str:
        return "agent-gravity"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model or _model_store.DEFAULT_MODEL.name, "gravity": self.gravity.model_dump(),
                "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
                "max_tokens": self.max_tokens, "stop": self.stop}

    def get_backend(self) -> Backend:
        """The backend this model runs on, starting (or joining) the local vLLM engine on first use."""
        if self._tiers is not None:
            return self._tiers.models[-1].get_backend()
        if self._backend is None:
            self._backend = self.backend or self._start_local_backend()
        return self._backend

    def _start_local_backend(self) -> Backend:
        if self.base_url is not None:
            from agent_gravity.backends.openai_compatible import OpenAICompatibleBackend

            return OpenAICompatibleBackend(self.base_url, api_key=self.api_key, model=self.model,
                                           max_retries=self.max_retries)
        return local_backend(self.model, max_model_len=self.max_model_len)

    def _backend_for(self, model: str | None) -> Backend:
        """This model's backend, or the local engine of another model folder named per call."""
        if model == self.model:
            return self.get_backend()
        if self.backend is not None or self.base_url is not None:
            raise InvalidCallOptionError(f"model={model!r} was passed per call, but this chat model runs on a "
                                         "fixed backend that serves one model; create a ChatGravity for that model")
        return local_backend(model, max_model_len=self.max_model_len)

    def with_structured_output(self, schema: dict[str, Any] | type, *, include_raw: bool = False,
                               method: str = "json_schema", strict: bool | None = None,
                               **kwargs: Any) -> Runnable:
        """Answer as JSON that the engine's grammar holds to ``schema`` (JSON schema, pydantic or TypedDict).

        ``json_schema`` and ``function_calling`` both run the schema's grammar (there is no separate
        tool channel); ``json_mode`` holds the output to any JSON object and parses it with the
        schema. The grammar is always strict, whatever ``strict`` says. Structured calls run
        without a reasoning phase, and gravity never cuts them (it still records the trace); an
        output the token budget cut raises OutputParserException. With ``include_raw`` the result
        is ``{"raw", "parsed", "parsing_error"}``.
        """
        if kwargs:
            raise InvalidCallOptionError(f"unsupported with_structured_output options {sorted(kwargs)}; "
                                         "take schema, include_raw, method and strict")
        if method not in ("json_schema", "function_calling", "json_mode"):
            raise InvalidCallOptionError(f"unknown structured-output method {method!r}; "
                                         "use json_schema, function_calling or json_mode")
        try:
            json_schema = convert_to_json_schema(schema)
        except (TypeError, ValueError) as exc:
            raise InvalidCallOptionError(f"cannot use {schema!r} as a structured-output schema ({exc}); pass a "
                                         "JSON schema dict, a pydantic model class or a TypedDict") from exc
        is_model = isinstance(schema, type) and is_basemodel_subclass(schema)  # pydantic v2 or v1
        parser = _WholePydanticParser(pydantic_object=schema) if is_model else _WholeJsonParser()
        grammar = {"type": "object"} if method == "json_mode" else json_schema
        llm = self.bind(response_format=grammar, ls_structured_output_format={"schema": json_schema})
        if not include_raw:
            return llm | parser
        parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
        failed = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parsed.with_fallbacks([failed], exception_key="parsing_error")

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None,
                   **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        """Offer ``tools`` to the model; the engine's grammar holds every call to its tool's schema.

        ``tool_choice``: None or ``auto`` (the model decides), ``any`` / ``required`` / True (it must
        call one), ``none`` / False, or a tool's name. A forced call is one call, written with no
        text around it. Calls come back in ``AIMessage.tool_calls``; one that does not parse is in
        ``invalid_tool_calls``. Tool-enabled calls have no reasoning phase, and gravity never cuts
        an output once a tool call may have begun.
        """
        converted = convert_tools(tools)
        names = [t["function"]["name"] for t in converted]
        return self.bind(tools=list(converted), tool_choice=_tool_choice(tool_choice, names), **kwargs)

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        """Standard tracing parameters; a per-call ``model`` is reported as the model."""
        params = LangSmithParams(ls_provider="agent_gravity", ls_model_type="chat",
                                 ls_model_name=kwargs.get("model") or self.model or _model_store.DEFAULT_MODEL.name,
                                 ls_temperature=kwargs.get("temperature", self.temperature))
        if (max_tokens := kwargs.get("max_tokens", self.max_tokens)) is not None:
            params["ls_max_tokens"] = max_tokens
        if stop or self.stop:
            params["ls_stop"] = [*(self.stop or ()), *(stop or ())]
        return params

    # -- one call, sync and async share everything but the transport --------------------------

    def _prepare(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> _Call:
        unknown = set(kwargs) - set(_OVERRIDES) - set(_PER_CALL_ONLY)
        if unknown:
            raise InvalidCallOptionError(f"unsupported call options {sorted(unknown)}; "
                                         f"supported: {', '.join(_OVERRIDES + _PER_CALL_ONLY)}")
        schema = kwargs.pop("response_format", None)
        kwargs.pop("ls_structured_output_format", None)  # tracing metadata LangChain reads, not an option
        tools = self._tool_set(kwargs.pop("tools", None), kwargs.pop("tool_choice", None), schema)
        opts = {k: kwargs.get(k, getattr(self, k)) for k in _OVERRIDES}
        if kwargs:  # per-call options get the constructor's validation, field by field
            checked = type(self).model_validate(opts)
            opts = {k: getattr(checked, k) for k in _OVERRIDES}
        config: GravityConfig = opts["gravity"]
        from_profile = self._profile is not None and config is self.gravity
        if schema is not None or tools:  # the grammar covers the output: no reasoning phase under it
            config = config.model_copy(update={"reasoning": None})
        chat = to_chat_dicts(messages)
        if self.kv is not None and self.kv.compact_tool_outputs is not None:
            chat = compact_history(chat, self.kv.compact_tool_outputs)
        chat = with_tools(chat, tools.offered if tools else ())
        backend = self._backend_for(opts["model"])
        compute = _compute_spec(opts["compute"], backend)
        fmt = self._format(backend, config)
        prefill, ids = "", None
        if fmt is not None:
            chat, prefill = scaffold(chat, fmt)
            ids = reasoning_ids(backend, fmt, config)
        if tools and tools.forced:
            prefill += f"{OPEN}\n"
        prompt = backend.render(chat, prefill)
        marker = len(ids.newline_ids + ids.end_ids + ids.answer_prefix_ids) if ids else 0
        budget = config.max_answer_tokens + (config.max_reasoning_tokens + marker if ids else 0)
        if opts["max_tokens"] is not None:
            budget = min(budget, opts["max_tokens"])
        if len(prompt) + budget > backend.max_context:
            raise ContextLengthError(
                f"the prompt has {len(prompt)} tokens and generation may add {budget} "
                f"(max_reasoning_tokens + max_answer_tokens, or max_tokens), but the context holds {backend.max_context}; "
                "shorten the conversation, lower the budgets in GravityConfig, or raise max_model_len"
            )
        forced = bool(tools and tools.forced)
        spec = steering_spec(backend, config, opts["task"], ids, structured=schema is not None or forced,
                             tools=bool(tools))
        if forced:
            schema = forced_grammar(tools.offered)
        sampling = SamplingSettings(
            max_tokens=budget, temperature=opts["temperature"], top_p=opts["top_p"], seed=opts["seed"],
            stop=(*(self.stop or ()), *(stop or ())), json_schema=schema,
            structural_tag=auto_grammar(tools.offered) if tools and not forced else None)
        params = {"temperature": opts["temperature"], "top_p": opts["top_p"], "max_tokens": budget,
                  "seed": opts["seed"]}
        if self.kv is not None and self.kv.trim and not hasattr(backend, "trim"):
            raise InvalidCallOptionError(
                f"kv trimming needs a backend with session KV caches (TransformersBackend); the {backend.provider} "
                "backend reuses unchanged history through its prefix cache instead; use KVConfig(trim=False, "
                "compact_tool_outputs=1) there, or change backend")
        request = GenerationRequest(prompt, sampling, spec, timeout=opts["timeout"], session=opts["conversation_id"],
                                    compute=compute)
        call = _Call(backend, request, fmt, params, config, opts["task"], tools, from_profile)
        route: RouteConfig | None = opts["route"]
        if route is not None and route.think == "adaptive" and fmt is not None and config.active_for(opts["task"]):
            self._adapt(call, route, chat)
        return call

    def _adapt(self, call: _Call, route: RouteConfig, chat: list[dict[str, str]]) -> None:
        """Give ``call`` its direct-answer request (the answer prefix after an empty reasoning), or record why it
        always reasons."""
        below = route.direct_below
        if below == "profile":
            profile = load_profile(call.backend.model_name)
            if profile is None or profile.route is None:
                raise InvalidCallOptionError(
                    f"RouteConfig(direct_below='profile') but {call.backend.model_name} has no route calibration: run "
                    "`agent-gravity calibrate --route` for it, or give direct_below in nats")
            below = profile.route.direct_below
        if below is None:
            call.route = {"route": "reason", "why": "calibration certified no direct-answer threshold"}
            return
        fmt, backend, config = call.fmt, call.backend, call.config
        sampling = dataclasses.replace(call.request.sampling,
                                       max_tokens=min(call.request.sampling.max_tokens, config.max_answer_tokens))
        call.direct = GenerationRequest(backend.render(chat, fmt.start + fmt.end + fmt.answer_prefix), sampling,
                                        steering_spec(backend, config, call.task, None), timeout=call.request.timeout,
                                        compute=call.request.compute)
        call.direct_below, call.direct_tokens = below, route.direct_tokens

    @staticmethod
    def _tool_set(tools: list[dict[str, Any]] | None, choice: Any, schema: dict | None) -> ToolSet | None:
        """The call's tools, or None when no tool may be called."""
        if tools is None:
            if choice is not None:
                raise InvalidCallOptionError("tool_choice was passed without tools; bind them with bind_tools")
            return None
        converted = convert_tools(tools)
        tool_set = ToolSet(converted, _tool_choice(choice, [t["function"]["name"] for t in converted]))
        if schema is not None and tool_set.offered:
            raise InvalidCallOptionError("a call cannot both offer tools and hold its answer to a structured-output "
                                         "schema; use bind_tools or with_structured_output, not both")
        return tool_set if tool_set.offered else None

    @staticmethod
    def _format(backend: Backend, config: GravityConfig) -> ReasoningFormat | None:
        if config.reasoning != "auto":
            return config.reasoning
        native = getattr(backend, "single_token_id", lambda _: None)
        return NATIVE_THINK if native("<think>") is not None and native("</think>") is not None else ReasoningFormat()

    def _telemetry(self, call: _Call, messages: list[BaseMessage]) -> Any:
        return chat_telemetry(self.telemetry, call.backend.provider, call.backend.model_name, call.params,
                              call.request.session, messages)

    def _message_fields(self, call: _Call, result: GenerationResult, tel: ChatTelemetry) -> dict[str, Any]:
        usage = usage_metadata(result)
        profile = self._profile if call.from_profile else None
        session = {**dataclasses.asdict(result.session), **self._compress(call, result)} if result.session else None
        gravity = {**gravity_metadata(result, call.request.sampling.max_tokens), "profile": profile, "task": call.task,
                   "risk": self._risk if call.from_profile else None, "session": session, "route": call.route}
        tel.finish(result.response_id, result.finish_reason, dict(usage), gravity,
                   {"conversation_id": call.request.session, "task": call.task, "zone": zone_of(call.config.policy)},
                   lambda: self._output_content(call, result))
        return {
            "usage_metadata": usage,
            "response_metadata": {"model_name": call.backend.model_name, "model_provider": call.backend.provider,
                                  "finish_reason": result.finish_reason, "gravity": gravity},
        }

    @staticmethod
    def _parsed(call: _Call, result: GenerationResult) -> tuple[str, str, list, list]:
        """The output's reasoning, answer, tool calls and invalid tool calls."""
        if call.tools:
            parsed = parse_output(result.text, call.tools)
            return "", parsed.content, parsed.tool_calls, parsed.invalid_tool_calls
        text = call.carried + result.text
        reasoning, answer = split_reasoning(text, call.fmt) if call.fmt else ("", text.strip())
        return reasoning, answer, [], []

    def _output_content(self, call: _Call, result: GenerationResult) -> str:
        reasoning, answer, calls, _ = self._parsed(call, result)
        return output_messages(reasoning, answer, calls, result.finish_reason)

    def _message(self, call: _Call, result: GenerationResult, tel: ChatTelemetry) -> AIMessage:
        fields = self._message_fields(call, result, tel)
        reasoning, answer, calls, invalid = self._parsed(call, result)
        if call.tools:
            return AIMessage(content=answer, tool_calls=calls, invalid_tool_calls=invalid, id=result.response_id,
                             **fields)
        kwargs = {"reasoning_content": reasoning} if reasoning else {}
        return AIMessage(content=answer, additional_kwargs=kwargs, id=result.response_id, **fields)

    def _chunk(self, call: _Call, item: StreamItem, splitter: ReasoningSplitter | ToolStreamSplitter | None,
               tel: ChatTelemetry) -> ChatGenerationChunk:
        if isinstance(splitter, ToolStreamSplitter):
            return self._tool_chunk(call, item, splitter, tel)
        if isinstance(item, GenerationDelta):
            reasoning, answer = splitter.feed(item.text) if splitter else ("", item.text)
            kwargs = {"reasoning_content": reasoning} if reasoning else {}
            return ChatGenerationChunk(message=AIMessageChunk(content=answer, additional_kwargs=kwargs))
        reasoning, answer = splitter.close() if splitter else ("", "")
        kwargs = {"reasoning_content": reasoning} if reasoning else {}
        return ChatGenerationChunk(message=AIMessageChunk(
            content=answer, additional_kwargs=kwargs, id=item.response_id, chunk_position="last",
            **self._message_fields(call, item, tel)))

    def _tool_chunk(self, call: _Call, item: StreamItem, splitter: ToolStreamSplitter,
                    tel: ChatTelemetry) -> ChatGenerationChunk:
        """Text streams as it comes; the calls arrive whole, as ``tool_call_chunks`` of the last chunk."""
        if isinstance(item, GenerationDelta):
            return ChatGenerationChunk(message=AIMessageChunk(content=splitter.feed(item.text)))
        rest, parsed = splitter.close()
        # LangChain rebuilds a stream's calls from its chunks. A valid call's args are its JSON object; a bad
        # call's raw text goes as a JSON string, which cannot parse to a dict, so it stays invalid there.
        chunks = [ToolCallChunk(name=c["name"], args=json.dumps(c["args"], ensure_ascii=False), id=c["id"], index=i,
                                type="tool_call_chunk")
                  for i, c in enumerate([*parsed.tool_calls, *parsed.invalid_tool_calls])]
        return ChatGenerationChunk(message=AIMessageChunk(
            content=rest, tool_call_chunks=chunks, id=item.response_id, chunk_position="last",
            **self._message_fields(call, item, tel)))

    def _compress(self, call: _Call, result: GenerationResult) -> dict[str, dict[str, Any] | None]:
        """Store the conversation's gravity zones in 8 bits, then trim its cache when the stretch written since
        its last trim has grown past ``kv.trim_above``; the reports of both (None where nothing was done)."""
        kv, report = self.kv, result.session
        if kv is None or not kv.trim or report is None:
            return {"quantize": None, "trim": None}
        from agent_gravity.trim import GravityZone, trim_policy_from_spec

        quantized = None
        if kv.quantize_below is not None:
            zone = GravityZone(kv.quantize_below, kv.zone_patience)
            quantized = dataclasses.asdict(call.backend.quantize(report.id, zone, kv.sinks, kv.window))
        session, trimmed = call.backend.sessions[report.id], None
        if session.cache.next_position - session.trimmed_until - kv.window > kv.trim_above:
            trimmed = dataclasses.asdict(call.backend.trim(report.id, trim_policy_from_spec(kv.policy), kv.ratio,
                                                           kv.sinks, kv.window, bits=kv.kept_bits))
        return {"quantize": quantized, "trim": trimmed}

    @staticmethod
    def _splitter(call: _Call) -> ReasoningSplitter | ToolStreamSplitter | None:
        if call.tools:
            return ToolStreamSplitter(call.tools)
        return ReasoningSplitter(call.fmt) if call.fmt else None

    # -- the call's tokens: its direct answer when adaptive thinking is sure of it, else the reasoning call --------

    @staticmethod
    def _run(call: _Call, tel: ChatTelemetry) -> Iterator[tuple[_Call, StreamItem]]:
        """The stream items of ``call``, each with the call (as routed) that wrote it."""
        source = call.backend.stream(call.request)
        if call.direct is not None:
            gate, direct = DirectGate(call.direct_below, call.direct_tokens, call.backend.decode), \
                call.backend.stream(call.direct)
            for item in direct:
                if gate.feed(item) is not None:
                    break
            call = call.routed(gate)
            if gate.verdict:
                source = itertools.chain(gate.held, direct)
            else:
                direct.close()  # aborts the direct answer in the engine
        if call.carried:
            yield call, GenerationDelta([], call.carried, [])
        for item in tel.timed(source):
            yield call, item

    @staticmethod
    async def _arun(call: _Call, tel: ChatTelemetry) -> AsyncIterator[tuple[_Call, StreamItem]]:
        """Async form of :meth:`_run`."""
        source = call.backend.astream(call.request)
        if call.direct is not None:
            gate, direct = DirectGate(call.direct_below, call.direct_tokens, call.backend.decode), \
                call.backend.astream(call.direct)
            async for item in direct:
                if gate.feed(item) is not None:
                    break
            call = call.routed(gate)
            if gate.verdict:
                source = _achain(gate.held, direct)
            else:
                await direct.aclose()
        if call.carried:
            yield call, GenerationDelta([], call.carried, [])
        async for item in tel.atimed(source):
            yield call, item

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        if self.tiers:
            return self._cascade().generate(messages, stop, kwargs)
        call = self._prepare(messages, stop, kwargs)
        with self._telemetry(call, messages) as tel:
            *_, (call, result) = self._run(call, tel)
            return ChatResult(generations=[ChatGeneration(message=self._message(call, result, tel))])

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        if self.tiers:
            return await self._cascade().agenerate(messages, stop, kwargs)
        call = self._prepare(messages, stop, kwargs)
        with self._telemetry(call, messages) as tel:
            async for call, item in self._arun(call, tel):
                result = item
            return ChatResult(generations=[ChatGeneration(message=self._message(call, result, tel))])

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        chunks = self._cascade().stream(messages, stop, kwargs) if self.tiers else self._chunks(messages, stop, kwargs)
        for chunk in chunks:
            if run_manager:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        chunks = self._cascade().astream(messages, stop, kwargs) if self.tiers else \
            self._achunks(messages, stop, kwargs)
        async for chunk in chunks:
            if run_manager:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    def _chunks(self, messages: list[BaseMessage], stop: list[str] | None,
                kwargs: dict[str, Any]) -> Iterator[ChatGenerationChunk]:
        call = self._prepare(messages, stop, kwargs)
        with self._telemetry(call, messages) as tel:
            splitter = None
            for routed, item in self._run(call, tel):
                splitter = splitter or self._splitter(routed)
                yield self._chunk(routed, item, splitter, tel)

    async def _achunks(self, messages: list[BaseMessage], stop: list[str] | None,
                       kwargs: dict[str, Any]) -> AsyncIterator[ChatGenerationChunk]:
        call = self._prepare(messages, stop, kwargs)
        with self._telemetry(call, messages) as tel:
            splitter = None
            async for routed, item in self._arun(call, tel):
                splitter = splitter or self._splitter(routed)
                yield self._chunk(routed, item, splitter, tel)
