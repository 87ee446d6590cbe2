"""The gravity proxy: an OpenAI-compatible chat-completions server that applies gravity to every call.

``create_app(model)`` gives the ASGI app; ``run_server(model)`` serves it with uvicorn on loopback.
"""

from agent_gravity.serve._app import MAX_BODY_BYTES, MAX_CONCURRENCY, REQUEST_TIMEOUT, create_app
from agent_gravity.serve._server import run_server
from agent_gravity.serve._wire import (
    CLIENT_SETTINGS,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ErrorResponse,
)

__all__ = ["CLIENT_SETTINGS", "MAX_BODY_BYTES", "MAX_CONCURRENCY", "REQUEST_TIMEOUT", "ChatCompletion",
           "ChatCompletionChunk", "ChatCompletionRequest", "ErrorResponse", "create_app", "run_server"]
