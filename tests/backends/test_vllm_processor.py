"""The V1 logits processor under the batch layouts vLLM gives it: adds, removals, moves, swaps."""

import pytest
import torch

pytest.importorskip("vllm", reason="the vLLM extra is not installed")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality  # noqa: E402

from agent_gravity._steering import EXTRA_ARGS_KEY, SteeringSpec  # noqa: E402
from agent_gravity.backends._vllm_processor import REGISTRY, GravityLogitsProcessor  # noqa: E402
from agent_gravity.kernels import token_entropy  # noqa: E402

VOCAB = 64


def params(key: str) -> SamplingParams:
    spec = SteeringSpec(key=key, eos_ids=(0,))
    return SamplingParams(extra_args={EXTRA_ARGS_KEY: spec.to_dict()})


class Batch:
    """Keeps what the engine would: each slot's request key and live output list."""

    def __init__(self) -> None:
        self.proc = GravityLogitsProcessor(None, torch.device("cpu"), False)
        self.slots: dict[int, str] = {}
        self.outputs: dict[str, list[int]] = {}
        self.expected: dict[str, list[float]] = {}
        self.finished: dict[str, list[float]] = {}
        self.gen = torch.Generator().manual_seed(0)

    def update(self, added=(), removed=(), moved=()):
        adds = []
        for index, key, with_gravity in added:
            self.outputs[key], self.slots[index] = [], key
            adds.append((index, params(key) if with_gravity else SamplingParams(), [1, 2], self.outputs[key]))
            if with_gravity:
                self.expected[key] = []
        for index in removed:
            self.slots.pop(index)
        for a, b, direction in moved:
            ka, kb = self.slots.pop(a, None), self.slots.pop(b, None)
            self.slots[b] = ka
            if direction == MoveDirectionality.SWAP:
                self.slots[a] = kb
        self.proc.update_state(BatchUpdate(batch_size=len(self.slots), removed=list(removed), added=adds,
                                           moved=list(moved)))

    def step(self):
        logits = torch.randn(max(self.slots) + 1, VOCAB, generator=self.gen) * 3
        entropy = token_entropy(logits)
        self.proc.apply(logits.clone())
        for index, key in self.slots.items():
            if key in self.expected:
                self.expected[key].append(entropy[index].item())
            self.outputs[key].append(5)

    def traces(self) -> dict[str, list[float]]:
        return {key: self.proc_trace(key) for key in self.expected}

    def proc_trace(self, key):
        for row in self.proc._rows.values():
            if row.steering.spec.key == key:
                return row.steering.entropy
        return self.finished[key]


def test_each_request_keeps_its_own_trace_through_adds_moves_swaps_and_removals():
    b = Batch()
    b.update(added=[(0, "a", True), (1, "b", True), (2, "plain", False)])
    b.step()
    b.update(moved=[(0, 1, MoveDirectionality.SWAP)])
    b.step()
    b.finished["b"] = next(r.steering.entropy for r in b.proc._rows.values() if r.steering.spec.key == "b")
    b.update(removed=[0])  # "b" finishes; "a" now sits at 1
    b.update(moved=[(1, 0, MoveDirectionality.UNIDIRECTIONAL)])  # condense: "a" to 0
    b.step()
    b.update(added=[(1, "c", True)])  # a recycled slot
    b.step()
    b.step()
    for key, trace in b.traces().items():
        assert trace == pytest.approx(b.expected[key], abs=1e-6), key
    assert len(b.expected["a"]) == 5 and len(b.expected["b"]) == 2 and len(b.expected["c"]) == 2


def test_a_caller_registered_steering_is_the_one_the_engine_drives():
    proc = GravityLogitsProcessor(None, torch.device("cpu"), False)
    from agent_gravity._steering import Steering

    spec = SteeringSpec(key="mine", eos_ids=(0,))
    mine = Steering(spec)
    REGISTRY.put(mine)
    try:
        proc.update_state(BatchUpdate(batch_size=1, removed=[], moved=[],
                                      added=[(0, params("mine"), [1], [])]))
        proc.apply(torch.zeros(1, VOCAB))
        assert mine.entropy == pytest.approx([torch.log(torch.tensor(float(VOCAB))).item()])
    finally:
        REGISTRY.pop("mine")


def test_bad_settings_are_refused_at_validation():
    with pytest.raises(ValueError, match="invalid agent_gravity settings"):
        GravityLogitsProcessor.validate_params(SamplingParams(extra_args={EXTRA_ARGS_KEY: {"key": "x"}}))
    GravityLogitsProcessor.validate_params(SamplingParams())  # no settings: untouched
