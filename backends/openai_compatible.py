"""OpenAI-compatible backend: gravity for a model served over HTTP (vLLM with or without our plugin, and others).

Prompts are rendered here, with the served model's tokenizer, and sent as token ids to
``/v1/completions``. Where the server runs the agent-gravity vLLM plugin the engine decides exits on exact
entropy; elsewhere this backend estimates entropy from the top log-probabilities the server returns (see
``entropy_bound``) and steers from the client side, ending a stream itself when gravity fires.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from agent_gravity import _model_store
from agent_gravity._errors import (
    EngineError,
    EngineTimeoutError,
    ModelNotFoundError,
    UpstreamAuthError,
    UpstreamRejectedError,
)
from agent_gravity._steering import EXTRA_ARGS_KEY
from agent_gravity.backends._hf_tokenizer import HFTokenizerMethods
from agent_gravity.backends._openai_wire import error_message, parse_chunk, probe_confidence, sse_data
from agent_gravity.backends._remote_run import ProbeAnswered, RemoteRun, Vocabulary
from agent_gravity.backends._upstreams import Upstream, UpstreamPool, check_url, joined
from agent_gravity.backends.base import GenerationRequest, GenerationResult, StreamItem

_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_log = logging.getLogger(__name__)


class OpenAICompatibleSettings(BaseModel):
    """Where the servers are and how to talk to them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: list[str] = Field(min_length=1)
    """One server, or several serving the same model: requests go to the least busy one."""
    api_key: SecretStr | None = None
    model: str | None = None
    """The served model's name; None: the servers' only model."""
    tokenizer: str | None = None
    """A local folder with the served model's tokenizer; None: the server's own model folder when it is on this
    machine, else the embedded default's when the server serves it."""
    gravity: Literal["auto", "engine", "client"] = "auto"
    """Who steers: ``engine`` needs the plugin on every server, ``client`` estimates entropy here, ``auto`` asks."""
    top_logprobs: int = Field(20, ge=1, le=1000)
    """Log-probabilities asked per token (vLLM's default cap is 20): more shrink the entropy bound."""
    timeout: float = Field(60.0, gt=0)
    """Seconds to wait for the server's next event."""
    connect_timeout: float = Field(5.0, gt=0)
    max_retries: int = Field(2, ge=0)
    """Times a failed request is sent again (to another server where there is one), going on from the tokens
    already received."""

    @field_validator("base_url", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("api_key")
    @classmethod
    def _key_given(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            raise ValueError("api_key is empty; pass the servers' key, or None for servers without one")
        return value

    @field_validator("base_url")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        return [check_url(url) for url in value]


class OpenAICompatibleBackend(HFTokenizerMethods):
    """A model on one or more OpenAI-compatible servers, steered by gravity in their engine or from here."""

    def __init__(self, base_url: str | Sequence[str], **options: Any) -> None:
        self.settings = OpenAICompatibleSettings(base_url=base_url, **options)
        s = self.settings
        self._pool = UpstreamPool(list(s.base_url))
        headers = {"Authorization": f"Bearer {s.api_key.get_secret_value()}"} if s.api_key else {}
        self._http = dict(headers=headers, timeout=httpx.Timeout(s.timeout, connect=s.connect_timeout))
        self._client = httpx.Client(**self._http)
        self._async_clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._lock = threading.Lock()
        self._probe_failures_seen: set[str] = set()
        try:
            card, self.in_engine = self._inspect()
            folder = _tokenizer_folder(s.tokenizer, card)
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except BaseException:
            self._client.close()  # a backend that failed to start holds no connections
            raise
        self.model_name: str = card["id"]
        self.provider: str = card.get("owned_by") or "openai_compatible"
        self.eos_ids = _eos_ids(self._tokenizer, folder)
        self.max_context = int(card.get("max_model_len") or self._tokenizer.model_max_length)
        self._vocab = Vocabulary(self.model_name, _vocab_size(self._tokenizer, folder), self.decode)

    @property
    def upstreams(self) -> list[Upstream]:
        """The servers, with the requests each has been sent."""
        return self._pool.upstreams

    def close(self) -> None:
        """Close the connections to the servers, those of every event loop's client included."""
        self._client.close()
        with self._lock:
            clients, self._async_clients = list(self._async_clients.items()), {}
        for loop, client in clients:
            _close_on(loop, client)

    def _async_client(self) -> httpx.AsyncClient:
        """This event loop's client: an async client's connections belong to the loop that opened them. Clients of
        loops that have closed are dropped (their connections hold the loop, which would never be freed)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._async_clients = {k: v for k, v in self._async_clients.items() if not k.is_closed()}
            client = self._async_clients.get(loop)
            if client is None:
                # No cap on connections: the caller bounds its requests (the proxy's max_concurrency).
                limits = httpx.Limits(max_connections=None, max_keepalive_connections=20)
                client = self._async_clients[loop] = httpx.AsyncClient(**self._http, limits=limits)
            return client

    # -- what the servers are -------------------------------------------------------------------

    def _inspect(self) -> tuple[dict[str, Any], bool]:
        """The served model's card and whether every server runs the plugin; a clear error for any other state."""
        cards, plugins, down = [], [], []
        for upstream in self._pool.upstreams:
            try:
                cards.append(self._card(upstream.url))
                plugins.append(self._has_plugin(upstream.url, cards[-1]["id"]))
            except httpx.TransportError as exc:
                down.append(f"{upstream.url} ({exc.__class__.__name__}: {exc})")
                upstream.down_until = time.monotonic() + 5.0
        if not cards:
            raise EngineError(f"no server answered: {'; '.join(down)}; start the server(s) or fix base_url")
        if len({c["id"] for c in cards}) > 1:
            raise EngineError(f"the servers serve different models {sorted({c['id'] for c in cards})}; every "
                              "base_url must serve the same one")
        if len(set(plugins)) > 1:
            raise EngineError("some servers run the agent-gravity plugin and some do not; gravity must behave the "
                              "same on each, so install agent-gravity beside vLLM on all of them (or none)")
        in_engine = plugins[0] if self.settings.gravity == "auto" else self.settings.gravity == "engine"
        if self.settings.gravity == "engine" and not plugins[0]:
            raise EngineError("gravity='engine' needs the agent-gravity plugin in the server's vLLM; install "
                              "agent-gravity beside vLLM there, or use gravity='auto' to steer from here")
        return cards[0], in_engine

    def _card(self, url: str) -> dict[str, Any]:
        response = self._client.get(joined(url, "/v1/models"))
        _raise_for(response, url)
        models = response.json().get("data") or []
        wanted = self.settings.model
        chosen = [m for m in models if wanted is None or m.get("id") == wanted]
        if wanted is None and len(models) > 1:
            raise EngineError(f"{url} serves several models {[m.get('id') for m in models]}; name one with model=")
        if not chosen:
            raise ModelNotFoundError(f"{url} does not serve {wanted!r}; it serves {[m.get('id') for m in models]}")
        return chosen[0]

    def _has_plugin(self, url: str, model: str) -> bool:
        """Send settings only the plugin reads, and malformed: its validation refuses them, a plain server ignores
        them. One token of work either way."""
        if self.settings.gravity == "client":
            return False
        body = {"model": model, "prompt": [0], "max_tokens": 1, "vllm_xargs": {EXTRA_ARGS_KEY: "not settings"}}
        response = self._client.post(joined(url, "/v1/completions"), json=body)
        if response.status_code == 400 and EXTRA_ARGS_KEY in response.text:
            return True
        _raise_for(response, url)
        return False

    # -- generation -----------------------------------------------------------------------------

    def _probe(self, prompt_ids: list[int], tokens: int, answered: ProbeAnswered) -> None:
        """Ask for an answer probe on a side thread; only the answer's first line is compared."""
        body = {"model": self.model_name, "prompt": prompt_ids, "max_tokens": tokens, "temperature": 0.0,
                "stop": ["\n"], "return_token_ids": True, "logprobs": 0}

        def run() -> None:
            upstream, text, count, confidence, failure = self._pool.acquire(), "", 0, None, None
            try:
                response = self._client.post(joined(upstream.url, "/v1/completions"), json=body)
                _raise_for(response, upstream.url)
                choice = response.json()["choices"][0]
                text, count = choice.get("text", ""), len(choice.get("token_ids") or [])
                confidence = probe_confidence(choice)
            except (httpx.HTTPError, _Retry, EngineError, KeyError, IndexError, TypeError, ValueError) as exc:
                failure = _probe_failure(exc)
                self._warn_once(failure, exc)
            finally:
                self._pool.release(upstream)
                answered(text, count, confidence, failure is not None)

        threading.Thread(target=run, name="agent-gravity-probe", daemon=True).start()

    def _warn_once(self, kind: str, exc: Exception) -> None:
        """Log the first probe failure of each kind; the rest are counted in each call's ``probe_failures``."""
        with self._lock:
            first = kind not in self._probe_failures_seen
            self._probe_failures_seen.add(kind)
        if first:
            _log.warning("an answer probe failed (%s: %s); a failed probe confirms no exit, so gravity cannot end "
                         "reasoning early while probes fail. Later %s failures are not logged: each call counts "
                         "them in its gravity metadata (probe_failures)", kind, exc, kind)

    def _tries(self, request: GenerationRequest) -> _Tries:
        run = RemoteRun(self._vocab, request, self.in_engine, self.settings.top_logprobs, self._probe)
        return _Tries(run, self._pool, self.settings.max_retries, _Deadline(request.timeout))

    def _post(self, tries: _Tries, upstream: Upstream) -> dict[str, Any]:
        """The arguments of the next streamed request of ``tries`` to ``upstream``."""
        return dict(method="POST", url=joined(upstream.url, "/v1/completions"), json=tries.run.body(),
                    headers=_trace_headers(), timeout=tries.deadline.httpx(self.settings))

    def stream(self, request: GenerationRequest) -> Iterator[StreamItem]:
        tries = self._tries(request)
        while tries.result is None:
            with tries.next() as upstream, self._client.stream(**self._post(tries, upstream)) as response:
                if response.status_code != 200:
                    response.read()
                _raise_for(response, upstream.url)
                for line in response.iter_lines():
                    yield from tries.take(line)
                    if tries.leaving:
                        break
            time.sleep(tries.wait)
        yield tries.result

    async def astream(self, request: GenerationRequest) -> AsyncIterator[StreamItem]:
        tries, client = self._tries(request), self._async_client()
        while tries.result is None:
            with tries.next() as upstream:
                async with client.stream(**self._post(tries, upstream)) as response:
                    if response.status_code != 200:
                        await response.aread()
                    _raise_for(response, upstream.url)
                    async for line in response.aiter_lines():
                        for item in tries.take(line):
                            yield item
                        if tries.leaving:
                            break
            await asyncio.sleep(tries.wait)
        yield tries.result


class _Retry(Exception):
    """The server failed in a way another try may not (a 5xx, or a stream cut short)."""


class _Tries:
    """The retry loop of one request, shared by the sync and async transports: each try streams from the least
    busy server, ``with tries.next() as upstream``. A failure another try may mend (transport, 5xx, a stream cut
    short) is counted and swallowed, that server set aside, and ``wait`` is the backoff before the next try; past
    ``max_retries`` it raises EngineError, past the deadline EngineTimeoutError. A caller that leaves does not set
    the server aside.

    A finished stream is read to its end, so its connection serves the next request; ``result`` is held until
    then, and the server released."""

    def __init__(self, run: RemoteRun, pool: UpstreamPool, max_retries: int, deadline: _Deadline) -> None:
        self.run, self.deadline = run, deadline
        self._pool, self._max_retries, self._failures = pool, max_retries, 0
        self.wait = 0.0  # the backoff before the next try
        self.leaving = False  # the run wants a new stream: it wrote tokens the server did not sample
        self.result: GenerationResult | None = None

    def take(self, line: str) -> list[StreamItem]:
        """The deltas of one line of the stream (the result is kept in ``result``)."""
        self.deadline.check()
        event = sse_data(line)
        if event is None or self.run.done:
            return []
        items, self.leaving = self.run.feed(parse_chunk(event))
        if self.run.done:
            self.result = items.pop()
        return items

    @contextlib.contextmanager
    def next(self) -> Iterator[Upstream]:
        upstream, failed, self.wait, self.leaving = self._pool.acquire(), False, 0.0, False
        try:
            yield upstream
            if not (self.run.done or self.leaving):
                raise _Retry("the server closed the stream before the completion finished")
        except (httpx.TransportError, _Retry) as exc:
            failed = True
            self._failures += 1
            self.deadline.check(exc)
            if self._failures > self._max_retries:
                raise _gave_up(upstream, self._failures, exc) from exc
            self.wait = _backoff(self._failures)
        except (UpstreamRejectedError, EngineTimeoutError):
            raise  # the request's own fault, or its deadline: the server is fine
        except Exception:
            failed = True
            raise
        finally:
            self._pool.release(upstream, failed=failed)


def _raise_for(response: httpx.Response, url: str) -> None:
    if response.status_code == 200:
        return
    try:
        message = error_message(response.json())
    except (json.JSONDecodeError, UnicodeDecodeError):
        message = response.text[:500]
    if response.status_code in _RETRYABLE_STATUS:
        raise _Retry(f"HTTP {response.status_code} from {url}: {message}")
    if response.status_code in (401, 403):
        raise UpstreamAuthError(f"{url} refused the API key (HTTP {response.status_code}: {message}); "
                                "pass the server's key as api_key")
    raise UpstreamRejectedError(f"{url} refused the request (HTTP {response.status_code}): {message}")


_PROBE_FAILURES: tuple[tuple[type[Exception], str], ...] = (
    (UpstreamAuthError, "auth"), (_Retry, "server"), (UpstreamRejectedError, "rejected"),
    (httpx.HTTPError, "transport"))


def _probe_failure(exc: Exception) -> str:
    """The kind of a probe's failure, for the log: auth, server (5xx, 408, 429), rejected (other 4xx), transport
    or malformed (a reply this backend cannot read)."""
    return next((kind for error, kind in _PROBE_FAILURES if isinstance(exc, error)), "malformed")


def _close_on(loop: asyncio.AbstractEventLoop, client: httpx.AsyncClient) -> None:
    """Close ``client`` on the event loop it belongs to; a closed loop took its connections with it."""
    if loop.is_closed():
        return
    if loop.is_running():
        asyncio.run_coroutine_threadsafe(client.aclose(), loop)
    else:
        loop.run_until_complete(client.aclose())


def _gave_up(upstream: Upstream, failures: int, exc: Exception) -> EngineError:
    return EngineError(f"the request failed {failures} times, last at {upstream.url}: {exc}; check that the "
                       "server is up, or raise max_retries")


def _backoff(failures: int) -> float:
    return min(2.0, 0.1 * 2 ** (failures - 1))


def _trace_headers() -> dict[str, str]:
    from agent_gravity.telemetry._spans import trace_headers

    return trace_headers()


class _Deadline:
    """A request's whole-call timeout, over every try."""

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self._end = None if timeout is None else time.monotonic() + timeout

    def left(self) -> float | None:
        return None if self._end is None else self._end - time.monotonic()

    def check(self, cause: Exception | None = None) -> None:
        left = self.left()
        if left is not None and left <= 0:
            raise EngineTimeoutError.after(self.timeout) from cause

    def httpx(self, settings: OpenAICompatibleSettings) -> httpx.Timeout:
        left = self.left()
        read = settings.timeout if left is None else max(0.001, min(settings.timeout, left))
        return httpx.Timeout(read, connect=settings.connect_timeout)


def _tokenizer_folder(explicit: str | None, card: dict[str, Any]) -> Path:
    """Where the served model's tokenizer is on this machine."""
    if explicit is not None:
        folder = Path(explicit).expanduser()
        if not (folder / "tokenizer_config.json").is_file():
            raise ModelNotFoundError(f"tokenizer folder {explicit!r} has no tokenizer_config.json; give the local "
                                     "folder of the served model (or of its tokenizer)")
        return folder
    root = Path(str(card.get("root") or ""))
    if card.get("root") and (root / "tokenizer_config.json").is_file():
        return root
    if card["id"] == _model_store.DEFAULT_MODEL.name:
        return _model_store.pull()
    raise ModelNotFoundError(f"the server's model {card['id']!r} is not on this machine; pass tokenizer= with a local "
                             "folder holding its tokenizer (prompts are rendered here, as token ids)")


def _config(folder: Path, name: str) -> dict[str, Any]:
    path = folder / name
    return json.loads(path.read_text()) if path.is_file() else {}


def _eos_ids(tokenizer: Any, folder: Path) -> tuple[int, ...]:
    eos = _config(folder, "generation_config.json").get("eos_token_id")
    ids = {tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos])}
    return tuple(sorted(i for i in ids if i is not None))


def _vocab_size(tokenizer: Any, folder: Path) -> int:
    """Width of the model's logits (its config's vocab_size), never less than the tokenizer's vocabulary."""
    return max(len(tokenizer), int(_config(folder, "config.json").get("vocab_size") or 0))
