"""Zone actions beyond drafting on the transformers backend: KV in fewer bits as decoding goes, lossy layer
skipping, top-2 sampling. Each acts only inside a gravity zone and reports what it did."""

from __future__ import annotations

import math

import pytest
import torch
from langchain_core.messages import HumanMessage
from pydantic import ValidationError

from agent_gravity import (
    ChatGravity,
    ComputeConfig,
    GravityConfig,
    InvalidCallOptionError,
    LayerSkipConfig,
    SpeculationConfig,
    Top2Config,
    ZoneKVConfig,
)
from agent_gravity.backends._layer_skip import middle_layers
from agent_gravity.backends._ragged_cache import RaggedCache
from agent_gravity.backends._zone_kv import ZoneKVSpec, ZonePacker
from agent_gravity.telemetry._events import gravity_events
from agent_gravity.trim.gravity_zone import GravityZone

COPY = ('Copy this JSON exactly, then add a field "ok": true.\n{"id": 4172, "name": "Ada Lovelace", '
        '"city": "London", "tags": ["math", "engine", "notes"], "year": 1843}')
OFF = GravityConfig(enabled=False, reasoning=None, max_answer_tokens=64)
NONE = ComputeConfig(speculate=None)
"""No action: the plain decode loop, reporting the bytes its cache holds."""


def _cache(entropy: list[float]) -> RaggedCache:
    cache = RaggedCache(num_layers=2, num_kv_heads=1, head_dim=32)
    n = len(entropy) - 1
    for layer in range(2):
        cache.update(torch.randn(1, 1, n, 32), torch.randn(1, 1, n, 32), layer)
    cache.advance(n)
    cache.entropy = torch.tensor(entropy)
    return cache


def test_the_packer_packs_zone_entries_of_the_output_once_they_leave_the_recent_window_in_batches():
    low, high = 0.1, 3.0
    # 4 prompt positions (never packed, even if low), then output: 6 low, 4 high, 10 low.
    cache = _cache([math.nan, low, low, low, *[low] * 6, *[high] * 4, *[low] * 10])
    packer = ZonePacker(ZoneKVSpec(bits=8, recent=4, every=8), GravityZone(0.5, 2), start=4)
    packer.step(cache, decided=14)                    # 10 - 4 = 6 positions out of the window: under a batch
    assert cache.packed() == 0
    packer.step(cache, decided=20)                    # 16 due: [4, 16) examined
    assert sorted(cache.heads[0][0].packed_positions().tolist()) == [*range(4, 10), 14, 15]
    packer.step(cache, decided=23, final=True)        # the end: whatever is due, however few
    assert sorted(cache.heads[0][0].packed_positions().tolist()) == [*range(4, 10), *range(14, 19)]
    report = packer.close(cache).as_dict()
    assert report["at"] == [*range(0, 6), *range(10, 15)] and report["entries"] == 22 and report["bits"] == 8
    assert report["bytes_ratio"] == pytest.approx((2 * 32 * 4 + 8) / (2 * 32 + 2 * 4 + 8))  # fp32 to int8 + scales


def test_the_zone_is_the_decode_loops_test_and_middle_layers_stay_away_from_the_ends():
    zone = GravityZone(1.0, 3)
    assert zone.holds(torch.tensor([5.0, 0.5, 0.5, 0.5])) and not zone.holds(torch.tensor([0.5, 0.5]))
    assert not zone.holds(torch.tensor([0.1, math.nan, 0.1])) and not zone.holds(torch.tensor([0.1, 0.1, 3.0]))
    assert middle_layers(30, 0.25) == tuple(range(11, 19)) and middle_layers(6, 0.9) == (2, 3)


def test_settings_are_checked_with_errors_that_say_what_to_change(transformers_backend):
    with pytest.raises(ValidationError, match="speculate=None"):
        ComputeConfig(skip=LayerSkipConfig())
    with pytest.raises(ValidationError, match="bits"):
        ZoneKVConfig(bits=2)
    with pytest.raises(ValidationError, match="margin"):
        Top2Config(margin=1.5)
    bad = ComputeConfig(speculate=None, skip=LayerSkipConfig(layers=(3, 99)))
    with pytest.raises(InvalidCallOptionError, match="0..29"):
        ChatGravity(backend=transformers_backend, gravity=OFF, compute=bad).invoke("hi")


def _meta(backend, compute, question=COPY, **options):
    message = ChatGravity(backend=backend, gravity=OFF, compute=compute, **options).invoke([HumanMessage(question)])
    return message, message.response_metadata["gravity"]


@pytest.mark.parametrize("bits", [8, 4])
def test_zone_kv_holds_fewer_bytes_and_keeps_the_full_caches_top_1_tokens(transformers_backend, bits):
    backend = transformers_backend
    full, full_meta = _meta(backend, NONE)
    packed, meta = _meta(backend, ComputeConfig(speculate=None, kv=ZoneKVConfig(bits=bits, recent=8, every=4)))
    report = meta["compute"]["kv"]
    assert report["entries"] > 0 and report["bytes_ratio"] >= (3 if bits == 8 else 5)
    assert meta["compute"]["kv_bytes"] < full_meta["compute"]["kv_bytes"]
    # Teacher-forced over the full run's output, the packed cache picks the same top-1 token almost everywhere.
    prompt = ChatGravity(backend=backend, gravity=OFF)._prepare([HumanMessage(COPY)], None, {}).request.prompt_ids
    output = backend.encode(full.content)
    spec = ComputeConfig(speculate=None, kv=ZoneKVConfig(bits=bits, recent=8, every=4)).spec()
    same = [a == b for a, b in zip(backend.top1_along(prompt, output, spec), backend.top1_along(prompt, output))]
    assert sum(same) / len(same) >= 0.9
    names = [name for name, _ in gravity_events(meta, 0)]
    assert "agent_gravity.kv" in names


def test_layer_skipping_acts_only_inside_zones_and_leaves_skipped_layers_without_entries(transformers_backend):
    backend = transformers_backend
    _, full = _meta(backend, NONE)
    _, meta = _meta(backend, ComputeConfig(speculate=None, skip=LayerSkipConfig(fraction=0.2)))
    skip = meta["compute"]["skip"]
    assert skip["layers"] == list(middle_layers(30, 0.2)) and 0 < skip["steps"] < meta["answer_tokens"]
    assert skip["layer_passes_saved"] == skip["steps"] * len(skip["layers"])
    assert meta["compute"]["kv_bytes"] < full["compute"]["kv_bytes"]   # skipped layers wrote no entries there
    entropy = meta["entropy"]
    for step in skip["skipped_at"]:                                   # each skip followed a low stretch
        assert sum(entropy[step - 4:step]) / 4 < 1.0


def test_top2_samples_from_two_tokens_only_in_zones_and_never_at_temperature_zero(transformers_backend):
    backend = transformers_backend
    top2 = ComputeConfig(speculate=None, top2=Top2Config())
    greedy, meta = _meta(backend, top2)
    plain, _ = _meta(backend, None)
    assert greedy.content == plain.content and meta["compute"]["top2"]["steps"] == 0
    _, sampled = _meta(backend, top2, temperature=0.7, seed=5)
    assert sampled["compute"]["top2"]["steps"] > 0


def test_drafting_and_zone_kv_work_together(transformers_backend):
    both = ComputeConfig(speculate=SpeculationConfig(), kv=ZoneKVConfig(recent=16, every=8))
    _, meta = _meta(transformers_backend, both)
    assert meta["compute"]["speculation"]["accepted"] > 0 and meta["compute"]["kv"]["entries"] > 0
