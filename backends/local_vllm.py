"""Local vLLM backend: runs vLLM in the caller's process with the gravity logits processor."""

from __future__ import annotations

import asyncio
import atexit
import itertools
import math
import os
import queue
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from agent_gravity._errors import EngineError, EngineMemoryError, EngineTimeoutError, SchemaNotEnforceableError
from agent_gravity._probe import line_confidence
from agent_gravity._steering import EXTRA_ARGS_KEY, Steering
from agent_gravity.backends._hf_tokenizer import HFTokenizerMethods, check_model_dir
from agent_gravity.backends._vllm_blocks import ledger_for
from agent_gravity.backends.base import (
    GenerationDelta,
    GenerationRequest,
    GenerationResult,
    SamplingSettings,
    StreamItem,
)

_GIB = 1 << 30


@dataclass(frozen=True)
class EngineSettings:
    """What identifies an engine: chat models asking for equal settings share one."""

    model_dir: str
    max_model_len: int = 4096
    dtype: str = "auto"
    kv_cache_gib: int = 2
    seed: int = 0
    max_logprobs: int = -1
    """Most log-probabilities a request may ask for. In-process nothing crosses a wire,
    so the whole vocabulary (-1) is allowed: it is how a caller checks the entropy trace."""
    reasoning_markers: tuple[str, str] | None = None
    """``(start, forced end)`` strings for vLLM's own ``thinking_token_budget``; None leaves it off."""

    def check_model_dir(self) -> None:
        """Raise ModelNotFoundError unless ``model_dir`` is a local model folder."""
        check_model_dir(self.model_dir)

    def memory_needed(self) -> int:
        """Bytes of host memory the engine will hold: weights, KV cache and a working margin."""
        weights = sum(p.stat().st_size for p in Path(self.model_dir).glob("*.safetensors"))
        return int(weights + self.kv_cache_gib * _GIB + 1 * _GIB)


class _EngineLoop:
    """Owns a vLLM LLMEngine; one thread steps it and routes outputs to per-request sinks."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._sinks: dict[str, Callable[[Any], None]] = {}
        self._failure: BaseException | None = None
        self._accepting = threading.Lock()  # a submit never slips past the final drain
        self._thread = threading.Thread(target=self._run, name="agent-gravity-engine", daemon=True)
        self._thread.start()

    def submit(self, request_id: str, prompt: dict, params: Any, sink: Callable[[Any], None]) -> None:
        with self._accepting:
            if self._failure is not None:
                raise EngineError(f"the vLLM engine has stopped: {self._failure}") from self._failure
            self._inbox.put(("add", (request_id, prompt, params, sink)))

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    def close(self) -> None:
        self._inbox.put(("close", None))
        self._thread.join(timeout=60)

    def _run(self) -> None:
        try:
            while self._drain_inbox(block=not self._engine.has_unfinished_requests()):
                if self._engine.has_unfinished_requests():
                    for output in self._engine.step():
                        self._deliver(output)
            self._fail_all(EngineError("the engine was closed; create a new chat model"))
        except BaseException as exc:  # noqa: BLE001 - every waiting caller must hear of it
            self._fail_all(exc)

    def _fail_all(self, exc: BaseException) -> None:
        with self._accepting:
            self._failure = exc
        for request_id in list(self._sinks):
            self._send(request_id, exc)
        while not self._inbox.empty():  # submitted while closing: answered too, never left waiting
            kind, payload = self._inbox.get_nowait()
            if kind == "add":
                _tell(payload[3], exc)

    def _send(self, request_id: str, item: Any) -> None:
        """Hand an item to a request's consumer; a consumer that is gone affects no other request."""
        sink = self._sinks.get(request_id)
        if sink is None:
            return
        if isinstance(item, BaseException) or getattr(item, "finished", False):
            del self._sinks[request_id]
        if not _tell(sink, item):
            self._sinks.pop(request_id, None)
            self._engine.abort_request([request_id])

    def _drain_inbox(self, block: bool) -> bool:
        """Apply queued commands; return False once closed."""
        while True:
            try:
                kind, payload = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if kind == "close":
                return False
            if kind == "abort":  # the consumer has left: nobody to tell
                self._engine.abort_request([payload])
                self._sinks.pop(payload, None)
                continue
            request_id, prompt, params, sink = payload
            try:
                self._engine.add_request(request_id, prompt, params)
            except Exception as exc:  # noqa: BLE001 - reported to the caller that sent it
                _tell(sink, exc)
                continue
            self._sinks[request_id] = sink

    def _deliver(self, output: Any) -> None:
        self._send(output.request_id, output)


def _tell(sink: Callable[[Any], None], item: Any) -> bool:
    """Call a consumer's sink; False when the consumer is gone (e.g. its event loop has closed)."""
    try:
        sink(item)
    except Exception:  # noqa: BLE001
        return False
    return True


class LocalVLLMBackend(HFTokenizerMethods):
    """vLLM in this process, with exact per-token entropy and gravity exits decided in-engine."""

    provider = "vllm"

    def __init__(self, settings: EngineSettings, model_name: str | None = None) -> None:
        settings.check_model_dir()
        self.settings = settings
        self.model_name = model_name or Path(settings.model_dir).name
        self._llm = _start_engine(settings)
        self._tokenizer = self._llm.get_tokenizer()
        self.max_context = settings.max_model_len
        self.eos_ids = _eos_ids(self._llm)
        self._loop = _EngineLoop(self._llm.llm_engine)
        self._blocks = ledger_for(self._llm.llm_engine)
        self._ids = itertools.count()
        self.closed = False

    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix, so that a benchmark arm starts as cold as the one before it."""
        self._llm.reset_prefix_cache()

    def stream(self, request: GenerationRequest) -> Iterator[StreamItem]:
        inbox: queue.Queue[Any] = queue.Queue()
        run = _Run(self, request)
        try:
            self._loop.submit(run.request_id, run.prompt, run.params, inbox.put)
            while not run.done:
                try:
                    item = inbox.get(timeout=run.seconds_left())
                except queue.Empty:
                    raise run.timed_out() from None
                yield from run.take(item)
        finally:
            run.finish(self._loop)

    async def astream(self, request: GenerationRequest) -> AsyncIterator[StreamItem]:
        inbox: asyncio.Queue[Any] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        run = _Run(self, request)
        try:
            self._loop.submit(run.request_id, run.prompt, run.params,
                              lambda item: loop.call_soon_threadsafe(inbox.put_nowait, item))
            while not run.done:
                try:
                    taken = await asyncio.wait_for(inbox.get(), run.seconds_left())
                except TimeoutError:
                    raise run.timed_out() from None
                for item in run.take(taken):
                    yield item
        finally:
            run.finish(self._loop)

    def close(self) -> None:
        """Stop the engine and free its memory; later calls on this backend fail with EngineError."""
        with _ENGINES_LOCK:
            if self.closed:
                return
            self.closed = True
            if _ENGINES.get(self.settings) is self:
                del _ENGINES[self.settings]
        self._loop.close()
        self._llm.llm_engine.engine_core.shutdown()


class _Run:
    """One request's journey through the engine loop: parameters in, deltas and result out."""

    def __init__(self, backend: LocalVLLMBackend, request: GenerationRequest) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from agent_gravity.backends._steered_rows import REGISTRY

        self.backend, self.request = backend, request
        self.request_id = f"chatcmpl-{uuid.uuid4().hex}"
        if backend._blocks is not None:
            backend._blocks.watch(self.request_id)
        self.prompt = {"prompt_token_ids": list(request.prompt_ids)}
        s = request.sampling
        self.steering = Steering(request.steering) if request.steering is not None else None
        extra = {EXTRA_ARGS_KEY: request.steering.to_dict()} if request.steering is not None else None
        self.params = SamplingParams(
            max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, seed=s.seed,
            stop=list(s.stop) or None, logprobs=s.logprobs, output_kind=RequestOutputKind.DELTA,
            extra_args=extra, thinking_token_budget=s.thinking_token_budget,
            structured_outputs=_grammar(s),
        )
        self.logprobs: list[dict[int, float]] | None = [] if s.logprobs is not None else None
        self._probe_ids: list[str] = []
        self._finished = False
        self._deadline = time.monotonic() + (request.timeout or 0.0)
        if self.steering is not None and self.steering.probes is not None:
            self.steering.prober = self._probe
        if self.steering is not None:  # registered last: nothing above may leave it behind
            REGISTRY.put(self.steering)
        self.token_ids: list[int] = []
        self.text: list[str] = []
        self.done = False

    def seconds_left(self) -> float | None:
        """Time left before the request's timeout; None without one."""
        if self.request.timeout is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def timed_out(self) -> EngineTimeoutError:
        return EngineTimeoutError.after(self.request.timeout)

    def _probe(self, generated: list[int]) -> None:
        """Start an answer probe as a side request (called on the engine thread by the steering)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        steering = self.steering
        assert steering is not None and steering.probes is not None
        probe_id = f"{self.request_id}-probe-{len(self._probe_ids)}"
        # Only the answer's first line is compared: stopping there keeps a probe a few tokens long.
        params = SamplingParams(max_tokens=steering.probes.spec.tokens, temperature=0.0, stop=["\n"],
                                output_kind=RequestOutputKind.FINAL_ONLY, logprobs=0)

        def answered(item: Any) -> None:
            if isinstance(item, BaseException):
                steering.probe_answered("", 0)
            elif item.finished:
                out = item.outputs[0]
                steering.probe_answered(out.text, len(out.token_ids), self._confidence(out))

        if self._finished:
            raise EngineError("the request has finished; no probe is needed")
        self._probe_ids.append(probe_id)
        self.backend._loop.submit(probe_id, {"prompt_token_ids": [*self.request.prompt_ids, *generated]},
                                  params, answered)

    def _confidence(self, completion: Any) -> float | None:
        """The lowest probability among a probe's first-line tokens (end of sequence aside), from the sampled
        tokens' log-probabilities; None when they are missing."""
        steps = completion.logprobs or []
        eos = self.backend.eos_ids
        pairs = [(t, step) for t, step in zip(completion.token_ids, steps, strict=False) if t not in eos]
        if len(steps) != len(completion.token_ids) or any(t not in step for t, step in pairs):
            return None
        texts = self.backend.token_texts
        return line_confidence([texts[t] if t < len(texts) else "" for t, _ in pairs],
                               [math.exp(step[t].logprob) for t, step in pairs])

    def take(self, item: Any) -> list[StreamItem]:
        if isinstance(item, BaseException):
            self.done = True
            raise EngineError(f"generation failed in the vLLM engine: {item}") from item
        completion = item.outputs[0]
        start = len(self.token_ids)
        self.token_ids.extend(completion.token_ids)
        self.text.append(completion.text)
        if self.logprobs is not None and completion.logprobs:
            self.logprobs.extend({i: lp.logprob for i, lp in step.items()} for step in completion.logprobs)
        entropy = self.steering.entropy[start:len(self.token_ids)] if self.steering else []
        items: list[StreamItem] = []
        if completion.token_ids:
            items.append(GenerationDelta(list(completion.token_ids), completion.text, list(entropy)))
        if item.finished:
            self.done = True
            items.append(self._result(completion.finish_reason or "stop", item.num_cached_tokens))
        return items

    def _result(self, finish_reason: str, cached_tokens: int | None) -> GenerationResult:
        n = len(self.token_ids)
        blocks = self.backend._blocks
        return GenerationResult(
            response_id=self.request_id,
            token_ids=self.token_ids,
            text="".join(self.text),
            finish_reason=finish_reason,
            prompt_tokens=len(self.request.prompt_ids),
            entropy=self.steering.entropy[:n] if self.steering else [],
            steering=self.steering,
            logprobs=self.logprobs,
            kv_blocks=None if blocks is None else blocks.report(self.request_id, cached_tokens),
        )

    def finish(self, loop: _EngineLoop) -> None:
        from agent_gravity.backends._steered_rows import REGISTRY

        self._finished = True  # read on the engine thread: no probe starts after this
        if self.backend._blocks is not None:
            self.backend._blocks.forget(self.request_id)
        if not self.done:
            loop.abort(self.request_id)
        for probe_id in self._probe_ids:  # a probe still running has nobody left to answer
            loop.abort(probe_id)
        if self.steering is not None:
            REGISTRY.pop(self.steering.spec.key)


_ENGINES: dict[EngineSettings, LocalVLLMBackend] = {}
_ENGINES_LOCK = threading.Lock()


def _grammar(s: SamplingSettings) -> Any:
    """vLLM's structured-output parameters for ``s``, checked up front: a schema the grammar cannot hold fails here."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    if s.json_schema is None and s.structural_tag is None:
        return None
    params = (StructuredOutputsParams(json=s.json_schema) if s.structural_tag is None
              else StructuredOutputsParams(structural_tag=s.structural_tag))
    try:
        validate_xgrammar_grammar(SamplingParams(structured_outputs=params))
    except (VLLMValidationError, ValueError) as exc:
        raise SchemaNotEnforceableError(
            f"the engine's grammar (xgrammar) cannot enforce this schema: {str(exc).strip()}; drop the unsupported "
            "keywords (for example lookaround in `pattern`) or loosen the schema") from exc
    return params


def available_memory() -> int:
    """Bytes of host memory available for a new engine."""
    return psutil.virtual_memory().available


def shared_backend(settings: EngineSettings, model_name: str | None = None) -> LocalVLLMBackend:
    """Return the running engine for ``settings``, starting it if memory allows."""
    with _ENGINES_LOCK:
        backend = _ENGINES.get(settings)
        if backend is not None:
            return backend
        settings.check_model_dir()
        if _ENGINES:
            needed, free = settings.memory_needed(), available_memory()
            if needed > free:
                running = ", ".join(s.model_dir for s in _ENGINES)
                raise EngineMemoryError(
                    f"starting a second engine for {settings.model_dir!r} needs about "
                    f"{needed / _GIB:.1f} GiB but only {free / _GIB:.1f} GiB is free while "
                    f"{running} runs; use the same model and engine settings to share the running "
                    "engine, or call close() on the other chat model's backend first"
                )
        backend = LocalVLLMBackend(settings, model_name)
        _ENGINES[settings] = backend
        return backend


def _close_all() -> None:
    for backend in list(_ENGINES.values()):
        backend.close()


atexit.register(_close_all)


def _start_engine(settings: EngineSettings) -> Any:
    # The processor must run in this process so traces come back without a round trip,
    # and a local folder must never send the loader to a model hub.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.kv_cache_gib))
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import torch
    from vllm import LLM

    on_gpu = torch.cuda.is_available()
    if on_gpu and os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "1").lower() not in ("0", "false"):
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"  # vLLM's GPU default, made explicit to match the class
        from agent_gravity.backends._vllm_processor_v2 import GravityLogitsProcessorV2 as processor
    else:
        from agent_gravity.backends._vllm_processor import GravityLogitsProcessor as processor
    dtype = settings.dtype if settings.dtype != "auto" or on_gpu else "float32"
    reasoning = {}
    if settings.reasoning_markers is not None:
        from vllm.config import ReasoningConfig

        start, end = settings.reasoning_markers
        reasoning["reasoning_config"] = ReasoningConfig(reasoning_start_str=start, reasoning_end_str=end)
    # vLLM seeds Python's global RNG as it starts; OpenTelemetry draws trace and span ids from it, so every run
    # would repeat the same ids (and a dashboard keep only the first of each). Give the process its state back.
    state = random.getstate()
    try:
        return LLM(
            model=settings.model_dir,
            dtype=dtype,
            max_model_len=settings.max_model_len,
            enforce_eager=not on_gpu,
            seed=settings.seed,
            max_logprobs=settings.max_logprobs,
            logits_processors=[] if plugin_installed() else [processor],
            **reasoning,
        )
    finally:
        random.setstate(state)


def plugin_installed() -> bool:
    """Whether vLLM loads our processor by itself, through the entry point (naming it too would run it twice)."""
    from importlib.metadata import entry_points

    return any(e.value.startswith("agent_gravity.") for e in entry_points(group="vllm.logits_processors"))


def _eos_ids(llm: Any) -> tuple[int, ...]:
    ids = {llm.get_tokenizer().eos_token_id}
    generation_eos = llm.llm_engine.model_config.get_diff_sampling_param().get("stop_token_ids") or []
    ids.update(generation_eos)
    return tuple(sorted(i for i in ids if i is not None))
