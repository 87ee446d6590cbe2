"""The gravity proxy: an OpenAI-compatible chat-completions server that applies gravity to every call.

``create_app(model)`` gives the ASGI app; ``run_server(model)`` serves it with uvicorn on loopback.
"""

from agent_gravity.serve._app import MAX_BODY_BYTES, create_app
from agent_gravity.serve._server import run_server
from agent_gravity.serve._wire import ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, ErrorResponse

__all__ = ["MAX_BODY_BYTES", "ChatCompletion", "ChatCompletionChunk", "ChatCompletionRequest", "ErrorResponse",
           "create_app", "run_server"]
