"""The gravity proxy's ASGI app: OpenAI's chat completions on a ChatGravity, with gravity metadata in every reply."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import anyio
import httpx
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from langchain_core.exceptions import ModelInvalidRequestError
from langchain_core.messages import AIMessageChunk
from pydantic.json_schema import models_json_schema
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_gravity._chat_model import ChatGravity
from agent_gravity._errors import (
    ContextLengthError,
    EngineError,
    EngineMemoryError,
    GravityError,
    ModelCacheError,
    ModelNotFoundError,
    UpstreamRejectedError,
)
from agent_gravity.serve._wire import (
    CLIENT_SETTINGS,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ErrorDetail,
    ErrorResponse,
    Health,
    ModelCard,
    ModelList,
    WireError,
    call_options,
    checked_client_settings,
    chunks,
    completion,
    first_chunk,
    stop_sequences,
    to_message,
)

MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_CONCURRENCY = 128
"""Chat completions in flight at once; more get 503 with Retry-After."""
REQUEST_TIMEOUT = 600.0
"""Seconds a chat completion (a whole stream included) may take before it ends in 504 and its backend call is
aborted."""
REQUEST_ID = "x-request-id"
_COMPLETIONS = "/v1/chat/completions"
_MODEL_ERRORS = (GravityError, ValueError, TypeError, TimeoutError, ConnectionError, httpx.HTTPError)
"""What a model call raises for a bad request, a failed backend or a timeout, answered inside the app; anything
else reaches Starlette's last handler (500)."""
_FAILURES: tuple[tuple[tuple[type[BaseException], ...], int, str, str, str], ...] = (
    ((TimeoutError, httpx.TimeoutException), 504, "timeout_error", "timeout", "the model call timed out"),
    ((EngineError, EngineMemoryError, ModelNotFoundError, ModelCacheError, UpstreamRejectedError, ConnectionError,
      httpx.HTTPError), 502, "upstream_error", "upstream_error", "the model backend failed"),
    ((BaseException,), 500, "server_error", "internal_error", "internal error"),
)
"""Failures that are not the request's fault: status, type, code and the fixed message clients get."""
_log = logging.getLogger(__name__)
T = TypeVar("T")


class ApiError(HTTPException):
    """An HTTP error with OpenAI's error body. An HTTPException, so FastAPI lets it through while it reads the
    body (the body limit is enforced there)."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None,
                 request_id: str | None = None) -> None:
        super().__init__(status, message, headers)
        self.error = ErrorDetail(message=message, type=type, param=param, code=code, request_id=request_id)


def _response(status: int, error: ErrorDetail, request_id: str, headers: dict[str, str] | None = None) -> Response:
    body = ErrorResponse(error=error.model_copy(update={"request_id": request_id}))
    return Response(body.model_dump_json(), status, {**(headers or {}), REQUEST_ID: request_id},
                    media_type="application/json")


def _request_id(request: Request) -> str:
    return request.state.request_id


def model_error(exc: BaseException, request_id: str) -> ApiError:
    """The HTTP error a model call's exception stands for. A fault in the request keeps its message (400); any
    other failure gets a fixed message and the request id, and its detail goes to the log under that id."""
    if isinstance(exc, WireError):
        return ApiError(400, str(exc), param=exc.param, request_id=request_id)
    if isinstance(exc, ContextLengthError):
        return ApiError(400, str(exc), param="messages", code="context_length_exceeded", request_id=request_id)
    if isinstance(exc, ModelInvalidRequestError) and not isinstance(exc, UpstreamRejectedError):
        return ApiError(400, str(exc), request_id=request_id)  # the messages or options the client sent
    status, kind, code, what = next(f[1:] for f in _FAILURES if isinstance(exc, f[0]))
    _log.error("request %s: %s (%d): %s: %s", request_id, what, status, type(exc).__name__, exc,
               exc_info=exc if status == 500 else None)
    return ApiError(status, f"{what}; the server's log has the detail under request id {request_id}", kind,
                    code=code, request_id=request_id)


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc if p != "body")


def _validation_message(error: dict[str, Any]) -> str:
    field = _field(error["loc"])
    if error["type"] == "extra_forbidden":
        return f"unsupported field {field!r}: the gravity proxy does not take it; leave it out"
    if error["type"] == "json_invalid":
        return f"the body is not valid JSON ({error.get('ctx', {}).get('error', 'parse error')})"
    if error["type"] == "missing" and not field:
        return "the request has no body; send a JSON object"
    return f"{field or 'body'}: {error['msg']}"


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    message = "; ".join(_validation_message(e) for e in errors[:3])
    if len(errors) > 3:
        message += f" (and {len(errors) - 3} more)"
    param = _field(errors[0]["loc"]) if errors and errors[0]["type"] != "json_invalid" else None
    return _response(400, ErrorDetail(message=message, type="invalid_request_error", param=param or None),
                     _request_id(request))


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    request_id = _request_id(request)
    if isinstance(exc, ApiError):
        return _response(exc.status_code, exc.error, request_id, exc.headers)
    message = exc.detail
    if exc.status_code in (404, 405):
        message = (f"{request.method} {request.url.path}: {exc.detail}; this server has POST /v1/chat/completions, "
                   "GET /v1/models and GET /health")
    return _response(exc.status_code, ErrorDetail(message=message, type="invalid_request_error"), request_id,
                     exc.headers)


async def _on_model_error(request: Request, exc: Exception) -> Response:
    error = model_error(exc, _request_id(request))
    return _response(error.status_code, error.error, _request_id(request))


def _checked_api_key(api_key: str | None) -> bytes | None:
    """The key as bytes; ValueError for an empty one, which would let anyone in with an empty bearer token."""
    if api_key is None:
        return None
    if not api_key.strip():
        raise ValueError("the API key is empty; give a real key, or None to serve without one")
    return api_key.encode()


def _with_request_id(send: Send, request_id: str) -> Send:
    """``send``, adding the ``x-request-id`` header to a response that has none."""
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            if not any(name.lower() == REQUEST_ID.encode() for name, _ in headers):
                message = {**message, "headers": [*headers, (REQUEST_ID.encode(), request_id.encode())]}
        await send(message)

    return sending


class _Guard:
    """Give every request its id (``x-request-id`` on every response), and refuse a request before its body is
    read: no valid API key on /v1 (401), a body over the limit (413, from Content-Length, or counted as a chunked
    body arrives), or a chat completion past the concurrency cap (503 with Retry-After)."""

    def __init__(self, app: ASGIApp, key: bytes | None, max_body_bytes: int, max_concurrency: int) -> None:
        self.app, self.key, self.max_body_bytes, self.max_concurrency = app, key, max_body_bytes, max_concurrency
        self.active = 0
        self.too_large = (f"the request body is larger than this server's limit of {max_body_bytes} bytes "
                          "(max_body_bytes); send a shorter conversation")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = f"req_{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = request_id
        send = _with_request_id(send, request_id)
        refusal = self._refusal(scope)
        if refusal is not None:
            status, error, headers = refusal
            return await _response(status, error, request_id, headers)(scope, receive, send)
        if scope["path"] != _COMPLETIONS:
            return await self.app(scope, self._counted(receive), send)
        self.active += 1  # one event loop: no lock needed
        try:
            await self.app(scope, self._counted(receive), send)
        finally:
            self.active -= 1

    def _refusal(self, scope: Scope) -> tuple[int, ErrorDetail, dict[str, str]] | None:
        headers = Headers(scope=scope)
        if self.key is not None and scope["path"].startswith("/v1") and not self._authorized(headers):
            error = ErrorDetail(message="missing or wrong API key; send the header 'Authorization: Bearer <key>'",
                                type="invalid_request_error", code="invalid_api_key")
            return 401, error, {"WWW-Authenticate": "Bearer"}
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            status, message = (413, self.too_large) if length.isdigit() else (400, "Content-Length is not a number")
            error = ErrorDetail(message=message, type="invalid_request_error",
                                code="request_too_large" if status == 413 else None)
            return status, error, {"Connection": "close"}
        if scope["path"] == _COMPLETIONS and self.active >= self.max_concurrency:
            error = ErrorDetail(message=f"this server is at its limit of {self.max_concurrency} chat completions at "
                                        "a time (max_concurrency); retry in a moment", type="server_error",
                                code="server_busy")
            return 503, error, {"Retry-After": "1"}
        return None

    def _authorized(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        token = token.strip()
        return scheme.lower() == "bearer" and bool(token) and hmac.compare_digest(token.encode(), self.key)

    def _counted(self, receive: Receive) -> Receive:
        seen = 0

        async def counted() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body_bytes:
                raise ApiError(413, self.too_large, code="request_too_large", headers={"Connection": "close"})
            return message

        return counted


class _EventStream(StreamingResponse):
    """Server-sent events, generated in the request's own task (ChatGravity's telemetry context must open and
    close in one task), that close the model's stream however the response ends, a client that went away
    included, so the backend aborts its request at once instead of generating for no one."""

    def __init__(self, source: AsyncGenerator[Any, None], events: AsyncIterator[str]) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.source = source

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as watcher:
                async def stop_on_disconnect() -> None:
                    await self.listen_for_disconnect(receive)
                    watcher.cancel_scope.cancel()

                watcher.start_soon(stop_on_disconnect)
                with contextlib.suppress(OSError):  # the client went away while an event was being sent
                    await self.stream_response(send)
                watcher.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
            await self.source.aclose()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_client_leaves(request: Request, call: Awaitable[T], deadline: float | None) -> T | None:
    """Await ``call``, cancelling it (so the backend aborts its request) if the client goes away first (None then)
    or the event loop's clock passes ``deadline`` (TimeoutError then)."""
    work, watch = asyncio.ensure_future(call), asyncio.ensure_future(_disconnect(request))
    left = None if deadline is None else deadline - asyncio.get_running_loop().time()
    try:
        await asyncio.wait((work, watch), timeout=left, return_when=asyncio.FIRST_COMPLETED)
        timed_out = not (work.done() or watch.done())
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    if timed_out:
        raise TimeoutError("the call ran past the server's request_timeout; its backend call was aborted")
    return None if work.cancelled() else work.result()


def _sse(payload: Any) -> str:
    return f"data: {payload.model_dump_json()}\n\n"


async def _events(source: AsyncIterator[AIMessageChunk], first: AIMessageChunk, wire: dict[str, Any],
                  include_usage: bool, request_id: str, deadline: float | None) -> AsyncIterator[str]:
    """The stream's events, until ``deadline`` (the event loop's clock); once headers are out, an error can only
    be the last event."""
    try:
        yield _sse(first_chunk(**wire))
        message: AIMessageChunk | None = first
        while message is not None:
            for chunk in chunks(message, **wire, include_usage=include_usage):
                yield _sse(chunk)
            async with asyncio.timeout_at(deadline):
                message = await anext(source, None)
        yield "data: [DONE]\n\n"
    except Exception as exc:  # noqa: BLE001 - every failure must reach the client as an error event
        yield _sse(ErrorResponse(error=model_error(exc, request_id).error))


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorResponse} for status in statuses}


_REF = "#/components/schemas/{model}"
_REQUEST_ID_DOC = {"required": True, "schema": {"type": "string"}, "description": (
    "This request's id; the server's log has the detail of a failure under it (also in an error's request_id).")}


def _event_stream_doc() -> dict[str, Any]:
    """Each server-sent event of a stream: a chunk or a last error, as JSON, or the literal ``[DONE]``."""
    as_json = {"contentMediaType": "application/json", "contentSchema": {"anyOf": [
        {"$ref": _REF.format(model="ChatCompletionChunk")}, {"$ref": _REF.format(model="ErrorResponse")}]}}
    data = {"anyOf": [{"const": "[DONE]"}, {"type": "string", **as_json}], "description": (
        "With stream=true: one chat.completion.chunk per event, then [DONE]; a call that fails after the "
        "stream began ends it with an error event instead.")}
    return {"schema": {"type": "object", "required": ["data"], "properties": {"data": data}}}


def _openapi(app: FastAPI, secured: bool) -> Callable[[], dict[str, Any]]:
    """The OpenAPI description: 400 instead of FastAPI's 422, the event stream of ``stream=true``, the request id
    header, and the bearer scheme when a key is required."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            for path, operations in doc["paths"].items():
                for operation in operations.values():
                    operation["responses"].pop("422", None)
                    for response in operation["responses"].values():
                        response["headers"] = {REQUEST_ID: _REQUEST_ID_DOC}
                    if secured and path.startswith("/v1"):
                        operation["security"] = [{"bearer": []}]
            doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]["text/event-stream"] = (
                _event_stream_doc())
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            _, chunk = models_json_schema([(ChatCompletionChunk, "serialization")], ref_template=_REF)
            schemas.update(chunk["$defs"])
            if secured:
                doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            app.openapi_schema = doc
        return app.openapi_schema

    return openapi


def create_app(model: ChatGravity, *, api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               model_name: str | None = None, client_settings: Iterable[str] = CLIENT_SETTINGS,
               max_concurrency: int = MAX_CONCURRENCY, request_timeout: float | None = REQUEST_TIMEOUT) -> FastAPI:
    """Serve ``model`` as an OpenAI-compatible chat-completions API with gravity applied to every call.

    ``api_key``: require ``Authorization: Bearer <key>`` on ``/v1/*`` (never empty). ``max_body_bytes``: larger
    bodies get 413 before they are read. ``model_name``: the name clients send as ``model`` (default: the
    model's). ``client_settings``: the GravityConfig fields a request's ``gravity`` may change (budgets only
    downwards); others get 400. ``max_concurrency``: chat completions in flight at once, more get 503.
    ``request_timeout``: seconds a chat completion may take (None: no limit), then 504 and its backend call is
    aborted.
    """
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be at least 1, got {max_body_bytes}")
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
    if request_timeout is not None and not request_timeout > 0:
        raise ValueError(f"request_timeout must be a positive number of seconds or None, got {request_timeout}")
    allowed, key = checked_client_settings(client_settings), _checked_api_key(api_key)

    def served() -> str:  # the backend's own name: an upstream's served model, or the local folder's
        return model_name or model.get_backend().model_name

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # The backend starts (or reaches its servers) before the first request, off the event loop.
        await anyio.to_thread.run_sync(model.get_backend)
        yield

    started = int(time.time())
    app = FastAPI(title="agent-gravity proxy", version="1", lifespan=lifespan, description=(
        "OpenAI-compatible chat completions with gravity: every call's reasoning ends once its next-token entropy "
        "has locked in. Extensions: the request fields `gravity`, `task` and `conversation_id`; the `gravity` "
        "report on each completion and on the stream's finishing chunk; `reasoning_content` on messages."))
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(HTTPException, _on_http_error)
    for error_type in _MODEL_ERRORS:
        app.add_exception_handler(error_type, _on_model_error)
    app.add_exception_handler(Exception, _on_model_error)  # a bug: Starlette logs it after this 500 goes out
    app.add_middleware(_Guard, key=key, max_body_bytes=max_body_bytes, max_concurrency=max_concurrency)
    app.openapi = _openapi(app, api_key is not None)  # type: ignore[method-assign]

    @app.post("/v1/chat/completions", response_model=ChatCompletion,
              responses=_errors(400, 401, 404, 413, 502, 503, 504))
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        """Create a chat completion (``stream=true``: server-sent chunks); gravity ends converged reasoning."""
        deadline = None if request_timeout is None else asyncio.get_running_loop().time() + request_timeout
        if body.model not in (None, served()):
            raise ApiError(404, f"model {body.model!r} is not served here; this server serves {served()!r}",
                           param="model", code="model_not_found")
        messages = [to_message(m) for m in body.messages]
        options = call_options(body, model.gravity, allowed)
        wire = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": served()}
        if not body.stream:
            call = model.ainvoke(messages, stop=stop_sequences(body), **options)
            message = await _unless_client_leaves(request, call, deadline)
            if message is None:
                return Response(status_code=499)  # nginx's "client closed request": no one reads it
            return Response(completion(message, **wire).model_dump_json(), media_type="application/json")
        source = model.astream(messages, stop=stop_sequences(body), **options)
        try:  # a bad option fails here, before any header goes out, as a plain HTTP error
            async with asyncio.timeout_at(deadline):
                first = await anext(source)
        except BaseException:
            await source.aclose()
            raise
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return _EventStream(source, _events(source, first, wire, include_usage, _request_id(request), deadline))

    @app.get("/v1/models", response_model=ModelList, responses=_errors(400, 401, 413, 502))
    async def models() -> ModelList:
        """The one model this server serves."""
        return ModelList(data=[ModelCard(id=served(), created=started)])

    @app.get("/health", response_model=Health, responses=_errors(400, 413))
    async def health() -> Health:
        """Liveness; needs no API key."""
        return Health()

    return app
