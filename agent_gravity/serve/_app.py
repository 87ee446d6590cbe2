"""The gravity proxy's ASGI app: OpenAI's chat completions on a ChatGravity, with gravity metadata in every reply."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import httpx
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from langchain_core.messages import AIMessageChunk
from pydantic.json_schema import models_json_schema
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from agent_gravity._chat_model import ChatGravity
from agent_gravity._errors import (
    ContextLengthError,
    EngineError,
    EngineMemoryError,
    GravityError,
    ModelCacheError,
    ModelNotFoundError,
)
from agent_gravity.serve._wire import (
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
    chunks,
    completion,
    first_chunk,
    stop_sequences,
    to_message,
)

MAX_BODY_BYTES = 4 * 1024 * 1024
_MODEL_ERRORS = (GravityError, ValueError, TypeError, TimeoutError, ConnectionError, httpx.HTTPError)
"""What a model call raises for a bad request, a failed backend or a timeout; anything else is a bug (500)."""
_log = logging.getLogger(__name__)
T = TypeVar("T")


class ApiError(HTTPException):
    """An HTTP error with OpenAI's error body. An HTTPException, so FastAPI lets it through while it reads the
    body (the body limit is enforced there)."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, message, headers)
        self.error = ErrorDetail(message=message, type=type, param=param, code=code)


def _response(status: int, error: ErrorDetail, headers: dict[str, str] | None = None) -> Response:
    return Response(ErrorResponse(error=error).model_dump_json(), status, headers, media_type="application/json")


def model_error(exc: BaseException) -> ApiError:
    """The HTTP error a model call's exception stands for; 500 for an unexpected one (a bug)."""
    if isinstance(exc, ContextLengthError):
        return ApiError(400, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return ApiError(504, f"the model call timed out: {exc}", "timeout_error", code="timeout")
    if isinstance(exc, EngineError | EngineMemoryError | ModelNotFoundError | ModelCacheError | ConnectionError
                  | httpx.HTTPError):
        return ApiError(502, f"the model backend failed: {exc}", "upstream_error", code="upstream_error")
    if isinstance(exc, WireError):
        return ApiError(400, str(exc), param=exc.param)
    if isinstance(exc, GravityError | ValueError | TypeError):
        return ApiError(400, str(exc))
    return ApiError(500, f"internal error ({type(exc).__name__}); see the server log", "server_error")


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


async def _on_validation_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    message = "; ".join(_validation_message(e) for e in errors[:3])
    if len(errors) > 3:
        message += f" (and {len(errors) - 3} more)"
    param = _field(errors[0]["loc"]) if errors and errors[0]["type"] != "json_invalid" else None
    return _response(400, ErrorDetail(message=message, type="invalid_request_error", param=param or None))


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if isinstance(exc, ApiError):
        return _response(exc.status_code, exc.error, exc.headers)
    message = exc.detail
    if exc.status_code in (404, 405):
        message = (f"{request.method} {request.url.path}: {exc.detail}; this server has POST /v1/chat/completions, "
                   "GET /v1/models and GET /health")
    return _response(exc.status_code, ErrorDetail(message=message, type="invalid_request_error"), exc.headers)


async def _on_model_error(_: Request, exc: Exception) -> Response:
    error = model_error(exc)
    return _response(error.status_code, error.error)


class _Guard:
    """Refuse a request before its body is read: no valid API key on /v1 (401), or a body over the limit (413,
    from Content-Length, or counted as a chunked body arrives)."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int) -> None:
        self.app, self.max_body_bytes = app, max_body_bytes
        self.key = api_key.encode() if api_key is not None else None
        self.too_large = (f"the request body is larger than this server's limit of {max_body_bytes} bytes "
                          "(max_body_bytes); send a shorter conversation")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        if self.key is not None and scope["path"].startswith("/v1") and not self._authorized(headers):
            error = ErrorDetail(message="missing or wrong API key; send the header 'Authorization: Bearer <key>'",
                                type="invalid_request_error", code="invalid_api_key")
            return await _response(401, error, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            status, message = (413, self.too_large) if length.isdigit() else (400, "Content-Length is not a number")
            error = ErrorDetail(message=message, type="invalid_request_error",
                                code="request_too_large" if status == 413 else None)
            return await _response(status, error, {"Connection": "close"})(scope, receive, send)
        await self.app(scope, self._counted(receive), send)

    def _authorized(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.key)

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


async def _unless_client_leaves(request: Request, call: Awaitable[T]) -> T | None:
    """Await ``call``, cancelling it (so the backend aborts its request) if the client goes away first; None
    then."""
    work, watch = asyncio.ensure_future(call), asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    return None if work.cancelled() else work.result()


def _sse(payload: Any) -> str:
    return f"data: {payload.model_dump_json()}\n\n"


async def _events(source: AsyncIterator[AIMessageChunk], first: AIMessageChunk, wire: dict[str, Any],
                  include_usage: bool) -> AsyncIterator[str]:
    """The stream's events; once headers are out, an error can only be the last event."""
    try:
        yield _sse(first_chunk(**wire))
        message: AIMessageChunk | None = first
        while message is not None:
            for chunk in chunks(message, **wire, include_usage=include_usage):
                yield _sse(chunk)
            message = await anext(source, None)
        yield "data: [DONE]\n\n"
    except Exception as exc:  # noqa: BLE001 - every failure must reach the client as an error event
        error = model_error(exc)
        if error.status_code == 500:
            _log.exception("the model stream failed")
        yield _sse(ErrorResponse(error=error.error))


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorResponse} for status in statuses}


_REF = "#/components/schemas/{model}"


def _event_stream_doc() -> dict[str, Any]:
    """Each server-sent event of a stream: a chunk or a last error, as JSON, or the literal ``[DONE]``."""
    as_json = {"contentMediaType": "application/json", "contentSchema": {"anyOf": [
        {"$ref": _REF.format(model="ChatCompletionChunk")}, {"$ref": _REF.format(model="ErrorResponse")}]}}
    data = {"anyOf": [{"const": "[DONE]"}, {"type": "string", **as_json}], "description": (
        "With stream=true: one chat.completion.chunk per event, then [DONE]; a call that fails after the "
        "stream began ends it with an error event instead.")}
    return {"schema": {"type": "object", "required": ["data"], "properties": {"data": data}}}


def _openapi(app: FastAPI, secured: bool) -> Callable[[], dict[str, Any]]:
    """The OpenAPI description: 400 instead of FastAPI's 422, the event stream of ``stream=true``, and the bearer
    scheme when a key is required."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            for path, operations in doc["paths"].items():
                for operation in operations.values():
                    operation["responses"].pop("422", None)
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
               model_name: str | None = None) -> FastAPI:
    """Serve ``model`` as an OpenAI-compatible chat-completions API with gravity applied to every call.

    ``api_key``: require ``Authorization: Bearer <key>`` on ``/v1/*``. ``max_body_bytes``: larger bodies get
    413 before they are read. ``model_name``: the name clients send as ``model`` (default: the model's).
    """
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be at least 1, got {max_body_bytes}")

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
    app.add_middleware(_Guard, api_key=api_key, max_body_bytes=max_body_bytes)
    app.openapi = _openapi(app, api_key is not None)  # type: ignore[method-assign]

    @app.post("/v1/chat/completions", response_model=ChatCompletion,
              responses=_errors(400, 401, 404, 413, 502, 504))
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        """Create a chat completion (``stream=true``: server-sent chunks); gravity ends converged reasoning."""
        if body.model not in (None, served()):
            raise ApiError(404, f"model {body.model!r} is not served here; this server serves {served()!r}",
                           param="model", code="model_not_found")
        messages = [to_message(m) for m in body.messages]
        options = call_options(body, model.gravity)
        wire = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": served()}
        if not body.stream:
            call = model.ainvoke(messages, stop=stop_sequences(body), **options)
            message = await _unless_client_leaves(request, call)
            if message is None:
                return Response(status_code=499)  # nginx's "client closed request": no one reads it
            return Response(completion(message, **wire).model_dump_json(), media_type="application/json")
        source = model.astream(messages, stop=stop_sequences(body), **options)
        try:  # a bad option fails here, before any header goes out, as a plain HTTP error
            first = await anext(source)
        except BaseException:
            await source.aclose()
            raise
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return _EventStream(source, _events(source, first, wire, include_usage))

    @app.get("/v1/models", response_model=ModelList, responses=_errors(400, 401, 413, 502))
    async def models() -> ModelList:
        """The one model this server serves."""
        return ModelList(data=[ModelCard(id=served(), created=started)])

    @app.get("/health", response_model=Health, responses=_errors(400, 413))
    async def health() -> Health:
        """Liveness; needs no API key."""
        return Health()

    return app
