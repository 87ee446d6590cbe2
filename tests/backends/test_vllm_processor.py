"""Both vLLM logits-processor adapters under the batch layouts vLLM gives them."""

import pytest
import torch

pytest.importorskip("vllm", reason="the vLLM extra is not installed")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality  # noqa: E402

from agent_gravity._steering import EXTRA_ARGS_KEY, SteeringSpec  # noqa: E402
from agent_gravity.backends._steered_rows import REGISTRY  # noqa: E402
from agent_gravity.backends._vllm_processor import GravityLogitsProcessor  # noqa: E402
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
        entropy = token_entropy(logits).entropy
        self.proc.apply(logits.clone())
        for index, key in self.slots.items():
            if key in self.expected:
                self.expected[key].append(entropy[index].item())
            self.outputs[key].append(5)

    def traces(self) -> dict[str, list[float]]:
        return {key: self.proc_trace(key) for key in self.expected}

    def proc_trace(self, key):
        for row in self.proc._tracks.values():
            if row.steering.spec.key == key:
                return row.steering.entropy
        return self.finished[key]


def test_each_request_keeps_its_own_trace_through_adds_moves_swaps_and_removals():
    b = Batch()
    b.update(added=[(0, "a", True), (1, "b", True), (2, "plain", False)])
    b.step()
    b.update(moved=[(0, 1, MoveDirectionality.SWAP)])
    b.step()
    b.finished["b"] = next(r.steering.entropy for r in b.proc._tracks.values() if r.steering.spec.key == "b")
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


class FakeSlots:
    """Model Runner V2's view: recycled request slots, rows reordered every step."""

    def __init__(self) -> None:
        from types import SimpleNamespace

        import numpy as np

        from agent_gravity.backends._vllm_processor_v2 import GravityLogitsProcessorV2

        self.prompt_len = np.zeros(8, dtype=np.int32)
        self.all_token_ids = torch.zeros(8, 64, dtype=torch.int64)
        states = SimpleNamespace(prompt_len=SimpleNamespace(np=self.prompt_len), max_num_reqs=8,
                                 device=torch.device("cpu"), all_token_ids=SimpleNamespace(gpu=self.all_token_ids))
        self.proc = GravityLogitsProcessorV2(None, states)
        self.live: dict[int, dict] = {}  # slot -> request
        self.gen = torch.Generator().manual_seed(1)

    def add(self, slot: int, key: str, prompt: int, with_gravity: bool = True) -> dict:
        self.prompt_len[slot] = prompt
        request = {"key": key, "prompt": [7] * prompt, "out": [], "expected": []}
        accepted = self.proc.add_request(slot, params(key) if with_gravity else SamplingParams())
        assert accepted is with_gravity
        self.live[slot] = request
        return request

    def step(self, order: list[int]) -> None:
        from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext

        requests = [self.live[s] for s in order]
        pos = [len(r["prompt"]) + len(r["out"]) - 1 for r in requests]
        fed = [(r["prompt"] + r["out"])[-1] for r in requests]
        ctx = LogitsContext(
            expanded_idx_mapping=torch.tensor(order), idx_mapping=torch.tensor(order),
            idx_mapping_np=torch.tensor(order).numpy(), expanded_local_pos=torch.zeros(len(order), dtype=torch.int64),
            input_ids=torch.tensor(fed), pos=torch.tensor(pos), seq_lens_upper_bound_np=None)
        logits = torch.randn(len(order), VOCAB, generator=self.gen) * 3
        entropy = token_entropy(logits).entropy.tolist()
        self.proc.apply(logits.clone(), ctx)
        for row, (slot, request) in enumerate(zip(order, requests)):
            request["expected"].append(entropy[row])
            request["out"].append(int(torch.randint(3, VOCAB, (1,), generator=self.gen)))
            tokens = request["prompt"] + request["out"]
            self.all_token_ids[slot, : len(tokens)] = torch.tensor(tokens)

    def trace(self, slot: int) -> tuple[list[float], list[int]]:
        track = self.proc._tracks[slot]
        return track.steering.entropy, track.output_ids


def test_model_runner_v2_adapter_keeps_traces_through_reordering_and_recycled_slots():
    b = FakeSlots()
    a, c = b.add(0, "a", 3), b.add(1, "c", 5)
    b.add(2, "plain", 4, with_gravity=False)
    b.step([0, 1, 2])
    b.step([2, 1, 0])  # reordered
    c_trace = b.trace(1)
    b.live.pop(1)  # "c" finished; its slot is recycled for "d"
    d = b.add(1, "d", 2)
    b.step([1, 0, 2])
    b.step([0, 2, 1])
    assert c_trace[0] == pytest.approx(c["expected"], abs=1e-6) and c_trace[1] == c["out"][:1]
    for slot, request in ((0, a), (1, d)):
        entropy, output_ids = b.trace(slot)
        assert entropy == pytest.approx(request["expected"], abs=1e-6)
        assert output_ids == request["out"][:-1]  # the last sample is fed back on the next step
    assert len(a["expected"]) == 4 and len(d["expected"]) == 2


def test_model_runner_v2_adapter_recovers_the_ids_of_a_request_resumed_after_preemption():
    b = FakeSlots()
    a = b.add(0, "a", 3)
    for _ in range(3):
        b.step([0])
    steering = b.proc._tracks[0].steering
    b.live.pop(0)  # preempted: the slot is freed, then the request comes back in slot 5
    b.prompt_len[5] = 3
    b.all_token_ids[5] = b.all_token_ids[0]
    from agent_gravity.backends._steered_rows import REGISTRY

    REGISTRY.put(steering)  # the caller's Steering is found again by its key
    try:
        b.proc.add_request(5, params("a"))
        b.live[5] = a
        b.step([5])
        b.step([5])
    finally:
        REGISTRY.pop("a")
    entropy, output_ids = b.trace(5)
    assert output_ids == a["out"][:-1] and len(output_ids) == 4
    assert entropy == pytest.approx(a["expected"], abs=1e-6) and len(entropy) == 5


def test_the_plugin_builds_the_processor_of_the_runner_that_asks_and_validates_settings():
    from types import SimpleNamespace

    from agent_gravity.backends._vllm_processor_v2 import GravityLogitsProcessorV2
    from agent_gravity.backends.vllm_plugin import GravityPlugin

    assert type(GravityPlugin(None, torch.device("cpu"), False)) is GravityLogitsProcessor  # V1: the CPU runner
    states = SimpleNamespace(prompt_len=SimpleNamespace(np=None), max_num_reqs=2, device=torch.device("cpu"),
                             all_token_ids=SimpleNamespace(gpu=torch.zeros(2, 4, dtype=torch.int64)))
    assert type(GravityPlugin(None, states)) is GravityLogitsProcessorV2  # Model Runner V2 (the GPU default)
    with pytest.raises(ValueError, match="invalid agent_gravity settings"):
        GravityPlugin.validate_params(SamplingParams(extra_args={EXTRA_ARGS_KEY: {"key": "x"}}))
    GravityPlugin.validate_params(SamplingParams())
