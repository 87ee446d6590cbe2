"""One generation against an OpenAI-compatible server, with no I/O: request bodies out, stream events in.

Where the server runs our vLLM plugin, the engine decides every exit on exact entropy and this side only
reads them back. Elsewhere this side steers: it estimates each step's entropy from the server's top
log-probabilities, runs the same state machine, and when that wants a token the server did not sample
(the end-of-reasoning marker, an end of sequence after a loop), it drops the server's stream, writes the
tokens itself, and asks the server to go on from there.
"""

from __future__ import annotations

import math
import queue
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent_gravity._steering import Action, Exit, Steering, SteeringSpec
from agent_gravity.backends._logprob_entropy import estimate_entropy
from agent_gravity.backends._openai_wire import Chunk, TokenStep, completion_body
from agent_gravity.backends.base import GenerationDelta, GenerationRequest, GenerationResult, StreamItem
from agent_gravity.policies import Lock, Observation, policy_from_spec


@dataclass(frozen=True)
class Vocabulary:
    """What a run needs to know of the model: its name on the server, its vocabulary, its text."""

    model: str
    size: int
    decode: Callable[[Sequence[int]], str]


ProbeAnswered = Callable[[str, int, float | None, bool], None]
"""Called with a probe's answer text, its length in tokens, its least token probability (None: not measured) and
whether the probe failed (then the text is empty)."""
ProbeStarter = Callable[[list[int], int, ProbeAnswered], None]
"""Starts an answer probe for a prompt (token ids) of at most n tokens, and calls back when it is answered."""


class RemoteRun:
    """A request's progress: the tokens kept so far and the steering that judged them.

    ``in_engine``: the server runs the plugin. A request whose settings ask for answer probes is steered here
    all the same: probes are side requests, which a logits processor inside a server cannot start.
    """

    def __init__(self, vocab: Vocabulary, request: GenerationRequest, in_engine: bool, top_logprobs: int,
                 start_probe: ProbeStarter) -> None:
        spec = request.steering
        self.vocab, self.request = vocab, request
        self.in_engine = in_engine and (spec is None or spec.probe is None)
        self.top_logprobs = max(top_logprobs, request.sampling.logprobs or 0)
        # On the plugin's server this side only follows the phases: the engine's verdicts are read back after.
        self.steering = None if spec is None else Steering.follower(spec) if self.in_engine else Steering(spec)
        self._answers: queue.SimpleQueue[tuple[str, int, float | None, bool]] = queue.SimpleQueue()
        self.probe_failures = 0
        if self.steering is not None and self.steering.probes is not None:
            prompt, tokens, answered = list(request.prompt_ids), spec.probe.tokens, self._answers.put
            self.steering.prober = lambda ids: start_probe([*prompt, *ids], tokens, lambda *a: answered(a))
        self.token_ids: list[int] = []
        self.tops: list[dict[int, float]] = []
        self.bounds: list[float] = []
        self.texts: list[str] = []
        self.response_id: str | None = None
        self.finish_reason: str | None = None
        self.restarts = 0

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def body(self) -> dict:
        """The next request: the prompt with every kept token, for what is left of the budget."""
        left = self.request.sampling.max_tokens - len(self.token_ids)
        spec = self.request.steering if self.in_engine else None
        return completion_body(self.vocab.model, [*self.request.prompt_ids, *self.token_ids], self.request.sampling,
                               left, self.top_logprobs, spec)

    def feed(self, chunk: Chunk) -> tuple[list[StreamItem], bool]:
        """Take one stream event; return the items for the caller and whether to leave this stream for a new one."""
        self.response_id = self.response_id or chunk.response_id or None
        while not self._answers.empty():  # probes answer on their own threads; the steering hears them here
            text, tokens, confidence, failed = self._answers.get()
            self.probe_failures += failed
            self.steering.probe_answered(text, tokens, confidence)
        kept: list[int] = []
        restart = False
        for step in chunk.steps:
            token = self._judge(step)
            kept.append(token)
            if token != step.token_id:
                kept.extend(self._forced())
                restart = True
                break
        text = chunk.text if not restart else self.vocab.decode(kept)
        items: list[StreamItem] = []
        if kept:
            start = len(self.token_ids) - len(kept)
            items.append(GenerationDelta(kept, text, self._entropy()[start:]))
            self.texts.append(text)
        if restart:
            self.restarts += 1
            self._finish_if_over()
        elif chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
        if self.done:
            items.append(self.result())
        return items, restart and not self.done

    def _judge(self, step: TokenStep) -> int:
        """Record the step and return the token to keep: the server's, or the one the steering wants instead."""
        estimate = estimate_entropy(step.top.values(), self.vocab.size, self.top_logprobs)
        self.tops.append(step.top)
        self.bounds.append(estimate.bound)
        token = step.token_id
        if self.steering is not None:
            top_id = max(step.top, key=step.top.__getitem__)
            action = self.steering.step(estimate.value, self.token_ids, top_id)
            if not self.in_engine:
                token = _replacement(action, token, step.top)
        self.token_ids.append(token)
        return token

    def _forced(self) -> list[int]:
        """The tokens the steering forces next (the rest of a marker), written here with no server step."""
        forced = []
        assert self.steering is not None
        while not self._over():
            action = self.steering.step(math.nan, self.token_ids)
            if action.force is None:
                break
            self.tops.append({})
            self.bounds.append(math.nan)
            self.token_ids.append(action.force)
            forced.append(action.force)
        return forced

    def _over(self) -> bool:
        spec = self.request.steering
        ended = bool(self.token_ids) and spec is not None and self.token_ids[-1] in spec.eos_ids
        return ended or len(self.token_ids) >= self.request.sampling.max_tokens

    def _finish_if_over(self) -> None:
        if self._over():
            spec = self.request.steering
            self.finish_reason = "stop" if spec and self.token_ids[-1] in spec.eos_ids else "length"

    def _entropy(self) -> list[float]:
        return self.steering.entropy[: len(self.token_ids)] if self.steering else []

    def result(self) -> GenerationResult:
        """The finished request, with the engine's verdicts read back where the engine decided them."""
        if self.in_engine and self.steering is not None:
            credit_engine_exits(self.steering, self.request.steering, self.token_ids, self.tops)
        wanted = self.request.sampling.logprobs
        return GenerationResult(
            response_id=self.response_id or "", token_ids=self.token_ids, text="".join(self.texts),
            finish_reason=self.finish_reason or "abort", prompt_tokens=len(self.request.prompt_ids),
            entropy=self._entropy(), steering=self.steering, entropy_bound=list(self.bounds),
            logprobs=None if wanted is None else [dict(top) for top in self.tops], probe_failures=self.probe_failures)


def _replacement(action: Action, token: int, top: dict[int, float]) -> int:
    """The token the engine would have kept under ``action``: banned mass moves onto ``merge_into``, else the
    most likely allowed token the server showed takes its place."""
    if action.force is not None:
        return action.force
    if token not in action.ban:
        return token
    if action.merge_into is not None:
        return action.merge_into
    allowed = [i for i in sorted(top, key=top.__getitem__, reverse=True) if i not in action.ban]
    return allowed[0] if allowed else token


def credit_engine_exits(mirror: Steering, spec: SteeringSpec | None, ids: list[int],
                        tops: list[dict[int, float]]) -> None:
    """Tell the engine's exits from the model's own in a plugin server's output, and credit them on ``mirror``.

    The server's log-probabilities are the model's, before our processor acts: a marker or end of sequence
    the model did not rank first was forced by the engine. Its lock is replayed from the estimated trace.
    """
    if spec is None:
        return
    reasoning = spec.reasoning
    if reasoning is not None and mirror.exit is Exit.MODEL and mirror.reasoning_tokens is not None:
        s = mirror.reasoning_tokens
        if _forced(ids, tops, s):
            loop = _replay(spec.loop, ids, mirror.entropy, s)
            gravity = _replay(spec.policy, ids, mirror.entropy, s)
            budget = s >= reasoning.max_reasoning_tokens or (
                s > 0 and _forced(ids, tops, s - 1) and s - 1 >= reasoning.max_reasoning_tokens)
            mirror.exit = Exit.LOOP if loop else Exit.BUDGET if budget else Exit.GRAVITY
            mirror.lock = loop or gravity or (None if budget else Lock(s, "engine", {}))
    last = len(ids) - 1
    if spec.loop is not None and last >= 0 and ids[last] in spec.eos_ids and _forced(ids, tops, last):
        mirror.stopped = _replay(spec.loop, ids, mirror.entropy, last) or Lock(last, "engine", {}, reason="loop")


def _forced(ids: list[int], tops: list[dict[int, float]], s: int) -> bool:
    top = tops[s] if s < len(tops) else {}
    return bool(top) and max(top, key=top.__getitem__) != ids[s]


def _replay(policy: dict | None, ids: list[int], entropy: list[float], until: int) -> Lock | None:
    """The lock ``policy`` held on the estimated trace at step ``until`` (the last one it saw before)."""
    if policy is None:
        return None
    replayed, lock = policy_from_spec(policy), None
    for s in range(min(until, len(ids), len(entropy))):
        lock = replayed.observe(Observation(s, ids[s], entropy[s])) or None
    return lock
