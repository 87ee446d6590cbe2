"""Run the gravity proxy with uvicorn, on loopback unless told otherwise."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

import uvicorn

from agent_gravity._chat_model import ChatGravity
from agent_gravity.serve._app import MAX_BODY_BYTES, MAX_CONCURRENCY, REQUEST_TIMEOUT, create_app
from agent_gravity.serve._wire import CLIENT_SETTINGS


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def run_server(model: ChatGravity, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
               max_body_bytes: int = MAX_BODY_BYTES, *, model_name: str | None = None, allow_public: bool = False,
               client_settings: Iterable[str] = CLIENT_SETTINGS, max_concurrency: int = MAX_CONCURRENCY,
               request_timeout: float | None = REQUEST_TIMEOUT) -> None:
    """Serve ``model`` at ``http://host:port/v1`` until interrupted; the model's backend starts first.

    A host other than loopback needs an ``api_key`` (or ``allow_public=True``): anyone who reaches the port
    could otherwise run the model. The other options are ``create_app``'s.
    """
    if not is_loopback(host) and api_key is None and not allow_public:
        raise ValueError(f"refusing to serve on {host!r} without an API key: anyone who can reach it could run the "
                         "model; set an API key, bind 127.0.0.1, or pass allow_public=True")
    app = create_app(model, api_key=api_key, max_body_bytes=max_body_bytes, model_name=model_name,
                     client_settings=client_settings, max_concurrency=max_concurrency,
                     request_timeout=request_timeout)
    model.get_backend()  # a missing model or a dead upstream fails now, not on the first request
    uvicorn.run(app, host=host, port=port, log_level="info")
