"""Backend: Hugging Face transformers in this process, CPU or GPU, with a session KV cache it fully controls.

Every decode step computes the exact entropy of the next-token distribution with our kernel and
lets the same Steering state machine as the vLLM backend decide, so traces and exits match. A
conversation's KV cache is kept across turns (``GenerationRequest.session``): an unchanged history
is never prefilled again, and KV trim policies act on that cache directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agent_gravity._errors import EngineError, EngineTimeoutError, SchemaNotEnforceableError, SessionNotFoundError
from agent_gravity._probe import line_confidence
from agent_gravity._steering import Steering
from agent_gravity.backends._adaptive_prefill import PrefillReport, PrefillSpec, adaptive_prefill
from agent_gravity.backends._compute import ComputeReport, ComputeSpec
from agent_gravity.backends._hf_tokenizer import HFTokenizerMethods, check_model_dir
from agent_gravity.backends._layer_skip import SkipReport, SkipSpec, decoder_layers, middle_layers, skipping
from agent_gravity.backends._ragged_cache import ATTENTION as RAGGED
from agent_gravity.backends._ragged_cache import GROUP, KEY_BLOCK, RaggedCache, packed_share
from agent_gravity.backends._ragged_cache import active as ragged_cache_active
from agent_gravity.backends._ragged_cache import unused_mask
from agent_gravity.backends._ragged_cache import register as register_ragged_attention
from agent_gravity.backends._reconstruction import reconstruction_scores
from agent_gravity.backends._sessions import KVSession, SessionStore
from agent_gravity.backends._speculation import Drafter
from agent_gravity.backends._steered_rows import SteeredRows, Track
from agent_gravity.backends._top2 import Top2Report, choose_top2
from agent_gravity.backends._zone_kv import ZonePacker
from agent_gravity.backends.base import (
    GenerationDelta,
    GenerationRequest,
    GenerationResult,
    SamplingSettings,
    SessionReport,
    StreamItem,
)
from agent_gravity.kernels import token_entropy
from agent_gravity.trim import Budget, GravityZone, LayerStretch, Reconstruction, TrimBudgetError, TrimPolicy
from agent_gravity.trim.protect import exact_value_positions


@dataclass(frozen=True)
class TrimReport:
    """What one trim did to a session's cache, read from the tensors it really holds."""

    session: str
    policy: str
    bytes_before: int
    bytes_after: int
    entries_before: int
    entries_after: int
    bits: int | None = None
    """Bits the trim stored its kept entries in; None: full precision."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class TransformersSettings:
    """What identifies a transformers engine."""

    model_dir: str
    max_model_len: int = 4096
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    max_sessions: int = 64
    """Conversation caches kept at once; past it the least recently used is evicted (its memory freed)."""
    max_session_bytes: int = 4 * 1024**3
    """Bytes all conversation caches may hold together; past it the least recently used are evicted."""
    adaptive_prefill: PrefillSpec | None = None
    """Prefill fresh prompts of ``min_tokens`` or more with entropy-adaptive attention (lossy: dense attention
    for the heads that are dynamic there, block-sparse for the rigid ones); None: always dense."""

    def check_model_dir(self) -> None:
        """Raise ModelNotFoundError unless ``model_dir`` is a local model folder."""
        check_model_dir(self.model_dir)


def _unsupported(s: SamplingSettings) -> str | None:
    if s.json_schema is not None or s.structural_tag is not None:
        return ("the transformers backend has no grammar engine, so it cannot hold output to a schema; use the "
                "vLLM backend for structured output and tool calls")
    if s.thinking_token_budget is not None:
        return "thinking_token_budget is vLLM's own cap; the transformers backend does not have it"
    return None


class TransformersBackend(HFTokenizerMethods):
    """transformers in this process: exact per-token entropy, gravity exits, one request at a time."""

    provider = "transformers"
    zone_compute = True
    """Honours ``GenerationRequest.compute``: drafts checked in one pass, zone KV in fewer bits, skipped layers and
    top-2 sampling inside gravity zones."""

    def __init__(self, settings: TransformersSettings, model_name: str | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        settings.check_model_dir()
        self.settings = settings
        self.model_name = model_name or Path(settings.model_dir).name
        self.max_context = settings.max_model_len
        self._device = torch.device(settings.device)
        self._tokenizer = AutoTokenizer.from_pretrained(settings.model_dir, local_files_only=True)
        register_ragged_attention()
        self._model = AutoModelForCausalLM.from_pretrained(
            settings.model_dir, local_files_only=True, dtype=getattr(torch, settings.dtype),
            attn_implementation=RAGGED).to(self._device)
        config = self._model.config
        self._shape = (config.num_hidden_layers, config.num_key_value_heads,
                       getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        self._model.eval()
        eos = {self._tokenizer.eos_token_id, *_as_list(self._model.generation_config.eos_token_id)}
        self.eos_ids = tuple(sorted(i for i in eos if i is not None))
        self._lock = threading.Lock()
        self._rows = SteeredRows(1, self._device)
        self.sessions = SessionStore(settings.max_sessions, settings.max_session_bytes)

    def stream(self, request: GenerationRequest) -> Iterator[StreamItem]:
        problem = _unsupported(request.sampling)
        if problem:
            raise SchemaNotEnforceableError(problem)
        with self._lock:
            yield from _Decode(self, request).run()

    async def astream(self, request: GenerationRequest) -> AsyncIterator[StreamItem]:
        items = self.stream(request)
        done = object()
        try:
            while (item := await asyncio.to_thread(next, items, done)) is not done:
                yield item
        finally:  # a consumer that leaves early must not leave the engine's lock held by a suspended generator
            items.close()

    def forward(self, ids: Sequence[int], cache: RaggedCache) -> torch.Tensor:
        """Feed ``ids`` after what ``cache`` holds; return the last position's logits ``[vocab]``."""
        return self.forward_rows(ids, cache)[-1]

    def forward_rows(self, ids: Sequence[int], cache: RaggedCache, skip: tuple[int, ...] = (),
                     prefill: PrefillReport | None = None) -> torch.Tensor:
        """Feed ``ids`` after what ``cache`` holds (without the decoder layers in ``skip``); return every fed
        position's logits ``[len(ids), vocab]``. What adaptive prefill did goes into ``prefill`` when given."""
        start = cache.next_position
        logits = self._run(ids, cache, skip, every_row=True, prefill=prefill)
        cache.record_entropy(start, _entropies(logits))
        return logits.float()

    def read(self, ids: Sequence[int], cache: RaggedCache) -> None:
        """Feed ``ids`` after what ``cache`` holds for their keys and values alone: no logits, no entropies (a pass
        that is cropped off again)."""
        self._run(ids, cache, (), every_row=False)

    def _run(self, ids: Sequence[int], cache: RaggedCache, skip: tuple[int, ...], every_row: bool,
             prefill: PrefillReport | None = None) -> torch.Tensor:
        q, start = len(ids), cache.next_position
        positions = torch.arange(start, start + q, device=self._device).unsqueeze(0)
        # not inference_mode: steering edits logits in place
        spec = self.settings.adaptive_prefill
        with (torch.no_grad(), ragged_cache_active(cache), skipping(self._model, skip),
              adaptive_prefill(spec, prefill) if spec is not None else contextlib.nullcontext()):
            out = self._model(torch.tensor([list(ids)], device=self._device), past_key_values=cache,
                              position_ids=positions, attention_mask=unused_mask(self._device), use_cache=True,
                              logits_to_keep=0 if every_row else 1)
        cache.advance(q)
        return out.logits[0]

    def new_cache(self) -> RaggedCache:
        return RaggedCache(*self._shape)

    @property
    def max_positions(self) -> int:
        """The longest sequence the model was trained for (its config's ``max_position_embeddings``)."""
        return int(getattr(self._model.config, "max_position_embeddings", None) or self.max_context)

    @property
    def num_layers(self) -> int:
        return self._shape[0]

    def skip_layers(self, spec: SkipSpec) -> tuple[int, ...]:
        """The decoder layers ``spec`` names on this model (its ``fraction`` of middle layers when it names none);
        ValueError naming the range when one is out of it."""
        count = len(decoder_layers(self._model))
        layers = spec.layers if spec.layers is not None else middle_layers(count, spec.fraction)
        if any(not 0 <= i < count for i in layers):
            raise ValueError(f"skip layers {list(layers)} are not all among this model's decoder layers 0..{count - 1}")
        return tuple(sorted(set(layers)))

    def session(self, session_id: str) -> KVSession:
        """A conversation's session; SessionNotFoundError says why there is none (never made, or evicted)."""
        return self.sessions[session_id]

    def trim(self, session_id: str, policy: TrimPolicy, ratio: float, sinks: int = 4, window: int = 32,
             protect: bool = True, bits: int | None = None) -> TrimReport:
        """Trim the stretch of a session's cache written since its last trim: keep the first ``sinks`` and
        the last ``window`` entries, and of the rest what ``policy`` picks, about ``1 / ratio`` of it per KV
        head (exact values too, with ``protect``). What is evicted is freed; what stays is never trimmed again,
        and with ``bits`` (8 or 4) the stretch's kept entries, exact values included, are stored in that many bits.
        At ``ratio=1`` every entry stays (no scoring pass).
        """
        if ratio < 1:
            raise TrimBudgetError(f"ratio {ratio} would keep more than there is; use 1 or more (2, 4, 8...)")
        if bits is not None and (type(bits) is not int or bits not in GROUP):
            raise ValueError(f"a trim stores the entries it keeps in 8 or 4 bits, not {bits}; pass 8, 4 or None")
        with self._lock:
            session = self.session(session_id)
            cache = session.cache
            start, end = max(session.trimmed_until, sinks), cache.next_position - window
            held = sum(map(sum, cache.lengths()))
            if cache.next_position / ratio < sinks + window:
                raise TrimBudgetError(
                    f"keeping 1/{ratio} of the {cache.next_position} tokens in session {session_id!r} cannot hold "
                    f"its {sinks} sinks and {window}-token window in every head; lower the ratio, or the sinks "
                    "and window")
            before = cache.nbytes()
            if end > start:
                if ratio > 1:  # at 1 every entry stays: no scoring pass
                    self._evict(session, policy, ratio, start, end, protect)
                if bits is not None:
                    cache.quantize(torch.arange(start, end), bits, KEY_BLOCK)
                session.trimmed_until = end
            return TrimReport(session_id, policy.name, before, cache.nbytes(), held, sum(map(sum, cache.lengths())),
                              bits)

    def kept_share(self, bits: int) -> float:
        """Bytes an entry a trim keeps with ``bits`` holds, over its bytes at full precision (keys in blocks, as
        ``trim`` packs them)."""
        return packed_share(self._shape[2], self._model.dtype, bits, KEY_BLOCK)

    def _evict(self, session: KVSession, policy: TrimPolicy, ratio: float, start: int, end: int,
               protect: bool) -> None:
        """Keep what ``policy`` picks of ``[start, end)``, about ``1 / ratio`` per KV head; free the rest."""
        cache = session.cache
        protected = (exact_value_positions(session.ids, self.token_texts) if protect
                     else torch.zeros(0, dtype=torch.long))
        scores = self._reconstruction_scores(session, policy, start, end)
        inside = [[(h.positions >= start) & (h.positions < end) for h in heads] for heads in cache.heads]
        stretches: Iterable[LayerStretch] = (
            self._stretch(cache, layer, inside[layer], protected, None if scores is None else scores[layer])
            for layer in range(self._shape[0]))
        share = getattr(policy, "layer_budgets", None)
        if share:  # a budget shared among layers needs them all at once; otherwise one layer at a time
            stretches = list(stretches)
            budgets: Iterable[Budget] = share(stretches, Budget(ratio))
        else:
            budgets = itertools.repeat(Budget(ratio))
        for stretch, budget, masks in zip(stretches, budgets, inside):
            cache.keep(stretch.layer, [torch.cat([torch.nonzero(~m).flatten(), torch.nonzero(m).flatten()[k]])
                                       for m, k in zip(masks, policy.select(stretch, budget))])

    def quantize(self, session_id: str, zone: GravityZone, sinks: int = 4, window: int = 32) -> TrimReport:
        """Store in 8 bits the entries of a session's cache that lie in a gravity ``zone``, past its sinks and
        last trim and before its recent ``window``; entries already compressed stay as they are."""
        with self._lock:
            session = self.session(session_id)
            cache = session.cache
            before, held = cache.nbytes(), sum(map(sum, cache.lengths()))
            cache.quantize(zone.positions(cache.entropy, max(session.trimmed_until, sinks),
                                          cache.next_position - window))
            return TrimReport(session_id, "int8_gravity", before, cache.nbytes(), held, held, 8)

    def _reconstruction_scores(self, session: KVSession, policy: TrimPolicy, start: int,
                               end: int) -> list[list[torch.Tensor]] | None:
        """Per layer and KV head, every held entry's score from re-reading ``[start, end)`` (None unless the policy
        scores by reconstruction)."""
        spec: Reconstruction | None = getattr(policy, "reconstruction", None)
        if spec is None:
            return None
        cache = session.cache
        scores = reconstruction_scores(cache, session.ids[start:end], self.encode(spec.instruction), spec.chunk,
                                       self.read, spec.recent)
        # a head's layout puts its 8-bit entries first; the stretch is full-precision entries only
        return [[s[len(h) - h.keys.shape[0]:].to(h.positions.device) for s, h in zip(layer, heads)]
                for layer, heads in zip(scores.best, cache.heads)]

    @staticmethod
    def _stretch(cache: RaggedCache, layer: int, inside: list[torch.Tensor], protected: torch.Tensor,
                 scores: list[torch.Tensor] | None) -> LayerStretch:
        """What a trim policy sees of one layer: per KV head, the entries ``inside`` marks."""
        heads = cache.heads[layer]
        return LayerStretch(layer, [h.keys[m] for h, m in zip(heads, inside)],
                            [h.positions[m] for h, m in zip(heads, inside)], cache.queries[layer], protected,
                            None if scores is None else [s[m] for s, m in zip(scores, inside)])

    def fork_session(self, source: str, target: str) -> None:
        """Start conversation ``target`` from a copy of ``source``'s cache (branching, or comparing trims)."""
        with self._lock:
            old = self.session(source)
            self.sessions[target] = KVSession(copy.deepcopy(old.cache), list(old.ids), intact_until=old.intact_until,
                                              trimmed_until=old.trimmed_until)

    def teacher_force(self, session_id: str, prompt_ids: Sequence[int], answer_ids: Sequence[int]) -> list[int]:
        """The model's top-1 token at each position of ``answer_ids`` after ``prompt_ids``, on the session's
        cache, feeding the given answer (teacher forcing); the cache is left as the prompt leaves it."""
        with self._lock:
            session = self.session(session_id)
            n = common_prefix(session.ids, prompt_ids)
            if n < session.trimmed_until or n == 0:
                raise SessionNotFoundError(f"session {session_id!r} does not hold the start of this prompt")
            n = min(n, len(prompt_ids) - 1)
            session.cache.crop(n - session.cache.next_position)
            logits = self.forward(prompt_ids[n:], session.cache)
            top = []
            for token in answer_ids:
                top.append(int(torch.argmax(logits)))
                logits = self.forward([token], session.cache)
            session.cache.crop(len(prompt_ids) - session.cache.next_position)
            session.ids = list(prompt_ids)
            return top

    def top1_along(self, prompt_ids: Sequence[int], answer_ids: Sequence[int],
                   compute: ComputeSpec | None = None) -> list[int]:
        """The model's top-1 token at each position of ``answer_ids`` after ``prompt_ids``, feeding the given answer
        (teacher forcing) on a fresh cache whose zone entries are packed as decoding packs them under
        ``compute.kv`` (None: the full-precision cache)."""
        with self._lock:
            cache = self.new_cache()
            kv = compute.kv if compute is not None else None
            packer = ZonePacker(kv, compute.zone, len(prompt_ids)) if kv is not None else None
            logits = self.forward(prompt_ids, cache)
            top = []
            for token in answer_ids:
                top.append(int(torch.argmax(logits)))
                logits = self.forward([token], cache)
                if packer is not None:
                    packer.step(cache, cache.next_position)
            return top

    def forced(self, prompt_ids: Sequence[int], answer_ids: Sequence[int],
               skip: tuple[int, ...] = ()) -> tuple[list[int], list[float]]:
        """The model's top-1 token and next-token entropy at each position of ``answer_ids`` after ``prompt_ids``,
        fed the given answer (teacher forcing) in one pass on a fresh cache, without the decoder layers ``skip``."""
        with self._lock:
            rows = self.forward_rows([*prompt_ids, *answer_ids[:-1]], self.new_cache(), skip)[len(prompt_ids) - 1:]
            return rows.argmax(dim=-1).tolist(), _entropies(rows).tolist()

    def end_session(self, session_id: str) -> None:
        """Forget a conversation's KV cache and free its memory."""
        with self._lock:
            del self.sessions[session_id]

    def _attach(self, request: GenerationRequest) -> tuple[Any, int, str | None]:
        """The cache to decode on, how many prompt tokens it already holds, and why it was reset (or None)."""
        if request.session is None:
            return self.new_cache(), 0, None
        prompt, old = list(request.prompt_ids), self.sessions.get(request.session)
        if old is None:
            why = self.sessions.evicted(request.session)
            return self._fresh(request.session), 0, why and (
                f"conversation {request.session!r} had its cache evicted ({why}); it started a new session")
        n = min(common_prefix(old.ids, prompt), len(prompt) - 1)  # the last prompt token is fed for its logits
        if n < old.trimmed_until:  # the history changed inside what was trimmed: the cache cannot be cut back
            return self._fresh(request.session), 0, (
                f"conversation {request.session!r} came back with a different history than its trimmed cache "
                "holds; it started a new session, so no answer comes from a stale cache")
        if old.intact_until is not None:
            n = min(n, old.intact_until)
        if n < len(old.ids):
            old.cache.crop(n - len(old.ids))
            del old.ids[n:]
        old.intact_until = None
        return old.cache, n, None

    def _fresh(self, session_id: str) -> Any:
        self.sessions[session_id] = KVSession(self.new_cache(), [])
        return self.sessions[session_id].cache


def _entropies(logits: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """Next-token entropy of each row of ``[q, vocab]`` logits, a chunk of rows at a time (bounded memory)."""
    return torch.cat([token_entropy(logits[i:i + chunk].float()).entropy for i in range(0, logits.shape[0], chunk)])


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


class _Decode:
    """One request's decode loop: prefill what the cache lacks, then one steered, sampled token per step (inside
    gravity zones, with drafted tokens checked in the same pass: see ``_speculation``)."""

    def __init__(self, backend: TransformersBackend, request: GenerationRequest) -> None:
        self.backend, self.request = backend, request
        self.s = request.sampling
        self.steering = Steering(request.steering) if request.steering is not None else None
        self.track = Track(self.steering) if self.steering is not None else None
        self.cache, self.reused, self.reset = backend._attach(request)
        self.output: list[int] = []
        self.entropy: list[float] = []
        self.logprobs: list[dict[int, float]] | None = [] if self.s.logprobs is not None else None
        self.generator = torch.Generator(device=backend._device)
        self.generator.manual_seed(self.s.seed if self.s.seed is not None else backend.settings.seed)
        self.deadline = None if request.timeout is None else time.monotonic() + request.timeout
        if self.steering is not None and self.steering.probes is not None:
            self.steering.prober = self._probe
        compute = request.compute
        self.zone = compute.zone if compute is not None else None
        self.drafter = Drafter(compute.draft, self.zone) if compute and compute.draft else None
        self.packer = ZonePacker(compute.kv, self.zone, len(request.prompt_ids)) if compute and compute.kv else None
        self.skip = SkipReport(backend.skip_layers(compute.skip)) if compute and compute.skip else None
        self.top2 = Top2Report() if compute and compute.top2 else None
        self.prefill = PrefillReport() if backend.settings.adaptive_prefill is not None else None
        self.pending: list[int] = []
        """Drafted tokens fed after the last decided one, not yet checked; ``rows``: the logits after each."""
        self.rows: list[torch.Tensor] = []

    def run(self) -> Iterator[StreamItem]:
        response_id = f"chatcmpl-{uuid.uuid4().hex}"
        try:
            logits = self.backend.forward_rows(self.request.prompt_ids[self.reused:], self.cache,
                                               prefill=self.prefill)[-1]
        except RuntimeError as exc:
            raise EngineError(f"generation failed in the transformers engine: {exc}") from exc
        text, finish = "", "length"
        while len(self.output) < self.s.max_tokens:
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise EngineTimeoutError.after(self.request.timeout)
            token = self._sample(logits)
            self.output.append(token)
            if token in self.backend.eos_ids:
                finish = "stop"
                break
            decoded = self.backend.decode(self.output)
            stop_at = _stop_index(decoded, self.s.stop)
            decoded = decoded if stop_at is None else decoded[:stop_at]
            yield from self._delta(decoded[len(text):], [token])
            text = decoded
            if stop_at is not None:
                finish = "stop"
                break
            logits = self._after(token)
        self._drop_pending()
        compute = self._compute_report()
        yield GenerationResult(response_id=response_id, token_ids=list(self.output), text=text, finish_reason=finish,
                               prompt_tokens=len(self.request.prompt_ids), entropy=list(self.entropy),
                               steering=self.steering, logprobs=self.logprobs, session=self._close_session(),
                               compute=compute, prefill=self.prefill if self.prefill and self.prefill.layers else None)

    def _after(self, token: int) -> torch.Tensor:
        """The logits after ``token``: those of its drafted position when the draft guessed it, else from a
        forward pass that carries a new draft behind it inside a gravity zone."""
        if self.pending and self.pending[0] == token:
            self.pending.pop(0)
            self.drafter.kept(len(self.output) - 1)
            return self.rows.pop(0)
        self._drop_pending()
        draft, skip = [], ()
        if self.drafter is not None:
            room = self.s.max_tokens - len(self.output) - 1
            draft = self.drafter.draft([*self.request.prompt_ids, *self.output], self.cache.entropy, room,
                                       lambda n: self._layer_draft(token, n))
        if self.skip is not None and self.zone.holds(self.cache.entropy):
            skip = self.skip.layers
            self.skip.steps += 1
            self.skip.skipped_at.append(len(self.output))
        rows = self.backend.forward_rows([token, *draft], self.cache, skip)
        self.pending, self.rows = draft, list(rows[1:])
        if self.packer is not None:
            self.packer.step(self.cache, len(self.request.prompt_ids) + len(self.output))
        return rows[0]

    def _layer_draft(self, token: int, n: int) -> list[int]:
        """Up to ``n`` greedy tokens after ``token`` from the model without its draft layers (what the check will
        sample from is the full model's distribution, so greedy drafts only decide what is kept); their cache
        entries are cropped before the check."""
        start, ids = self.cache.next_position, []
        layers = self.request.compute.draft.layers
        for _ in range(n):
            token = int(torch.argmax(self.backend.forward_rows([token], self.cache, layers)[-1]))
            if token in self.backend.eos_ids:
                break
            ids.append(token)
        self.cache.crop(start - self.cache.next_position)
        return ids

    def _drop_pending(self) -> None:
        """Crop the drafted tokens not checked yet (a miss, a probe, the end) from the cache."""
        if self.pending:
            self.cache.crop(-len(self.pending))
            self.pending, self.rows = [], []

    def _compute_report(self) -> ComputeReport | None:
        """Pack what is due, then read what each zone action did (None when the request asked for none)."""
        if self.zone is None:
            return None
        if self.drafter is not None:
            self.drafter.close()
        if self.packer is not None:
            self.packer.step(self.cache, self.cache.next_position, final=True)
        return ComputeReport(self.cache.nbytes(), self.drafter.report if self.drafter is not None else None,
                             self.packer.close(self.cache) if self.packer is not None else None, self.skip, self.top2)

    def _close_session(self) -> SessionReport | None:
        """Record what the session's cache now holds: the prompt and every output token fed back."""
        session_id = self.request.session
        if session_id is None:
            return None
        session = self.backend.sessions[session_id]
        session.ids = [*self.request.prompt_ids, *self.output][:self.cache.next_position]
        steering = self.steering
        if steering is not None and steering.spec.reasoning is not None and steering.answer_start:
            # Converged reasoning is never sent back: its entries go now, the answer's stay.
            start = len(self.request.prompt_ids)
            self.cache.drop(start, start + steering.answer_start)
            session.intact_until = start
        self.backend.sessions.fit(keep=session_id)  # the cache grew by this call
        return SessionReport(session_id, self.reused, len(self.request.prompt_ids) - self.reused, session.nbytes(),
                             self.reset)

    def _delta(self, text: str, ids: list[int]) -> Iterator[GenerationDelta]:
        yield GenerationDelta(ids, text, self.entropy[-len(ids):] if self.entropy else [])

    def _sample(self, logits: torch.Tensor) -> int:
        if self.logprobs is not None:  # the model's own distribution, before any steering
            lp = torch.log_softmax(logits, dim=-1)
            values, ids = torch.topk(lp, lp.numel() if self.s.logprobs == -1 else self.s.logprobs)
            self.logprobs.append(dict(zip(ids.tolist(), values.tolist())))
        row = logits.unsqueeze(0)
        if self.track is not None:
            self.backend._rows.apply(row, [0], [self.track])
            self.entropy.append(self.track.steering.entropy[len(self.output)])
        token = self._top2(row[0])
        token = _choose(row[0], self.s, self.generator) if token is None else token
        if self.track is not None:
            self.track.output_ids.append(token)
        return token

    def _top2(self, row: torch.Tensor) -> int | None:
        """Inside a zone at temperature > 0, the token sampled among the top two when the first leads by the
        margin; else None."""
        if self.top2 is None or self.s.temperature == 0.0:
            return None
        seen = self.cache.entropy[:len(self.request.prompt_ids) + len(self.output) + 1]  # pending drafts aside
        if not self.zone.holds(seen):
            return None
        token = choose_top2(row, self.s.temperature, self.request.compute.top2.margin, self.generator)
        if token is not None:
            self.top2.steps += 1
            self.top2.at.append(len(self.output))
        return token

    def _probe(self, generated: list[int]) -> None:
        """Answer probe: greedy tokens after ``generated`` up to a line break, on this cache, then undone."""
        steering = self.steering
        assert steering is not None and steering.probes is not None
        self._drop_pending()
        keep = self.cache.get_seq_length()  # the prompt and the output so far
        logits = self.backend.forward(generated[len(self.output):], self.cache)
        ids: list[int] = []
        probs: list[float] = []
        for _ in range(steering.probes.spec.tokens):
            top = torch.softmax(logits.float(), dim=-1).max(dim=-1)
            token = int(top.indices)
            if token in self.backend.eos_ids:
                break
            ids.append(token)
            probs.append(float(top.values))
            if "\n" in self.backend.decode(ids):
                break
            logits = self.backend.forward([token], self.cache)
        self.cache.crop(keep - self.cache.get_seq_length())  # negative: drop the probe's tokens
        texts = [self.backend.token_texts[t] for t in ids]
        steering.probe_answered(self.backend.decode(ids).split("\n")[0], len(ids), line_confidence(texts, probs))


def _stop_index(text: str, stops: Sequence[str]) -> int | None:
    hits = [text.find(s) for s in stops if s and s in text]
    return min(hits) if hits else None


def _choose(row: torch.Tensor, s: SamplingSettings, generator: torch.Generator) -> int:
    """Greedy at temperature 0; else temperature and nucleus (top-p) sampling."""
    if s.temperature == 0.0 or torch.isinf(row).sum() == row.numel() - 1:
        return int(torch.argmax(row))
    probs = torch.softmax(row / s.temperature, dim=-1)
    if s.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs > s.top_p
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))
