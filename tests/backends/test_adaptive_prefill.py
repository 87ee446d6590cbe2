"""Entropy-adaptive prefill: a dense plan is dense attention, a sparse head attends over exactly its blocks, a
far block a head points at is kept, and the transformers backend prefills adaptively only inside the context."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from agent_gravity.backends._adaptive_prefill import (
    FixedPattern,
    PrefillReport,
    PrefillSpec,
    active,
    adaptive_prefill,
    prefill_attention,
)
from agent_gravity import ChatGravity, GravityConfig
from agent_gravity.backends.local_transformers import TransformersBackend
from agent_gravity.telemetry._spans import response_attributes

D = 16


def _qkv(n: int, heads: int = 4, kv: int = 2, offset: int = 0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, heads, n, D, generator=g), torch.randn(1, kv, offset + n, D, generator=g),
            torch.randn(1, kv, offset + n, D, generator=g))


def _reference(q, k, v, allowed=None):
    """Masked attention: query i (at offset + i) sees key j when j <= offset + i and ``allowed[h, i, j]``."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    n, keys = q.shape[2], k.shape[2]
    mask = torch.arange(keys).unsqueeze(0) <= (torch.arange(n) + keys - n).unsqueeze(1)
    mask = mask.expand(q.shape[1], n, keys) & (allowed if allowed is not None else True)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(0), scale=D ** -0.5)


@pytest.mark.parametrize("offset", [0, 40])
def test_a_dense_plan_is_dense_attention(offset):
    q, k, v = _qkv(200, offset=offset)
    report = PrefillReport()
    out = prefill_attention(q, k, v, D ** -0.5, 0, PrefillSpec(segment=64, block=16, dynamic_above=-1.0), report)
    assert torch.allclose(out, _reference(q, k, v), atol=1e-5)
    assert report.sparse_heads == 0 and report.cells == report.dense_cells and report.estimate_cells > 0


def test_sparse_heads_whose_blocks_cover_every_key_are_exact():
    q, k, v = _qkv(200)
    report = PrefillReport()
    spec = PrefillSpec(segment=64, block=16, dynamic_above=math.inf, coverage=1.0, max_share=1.0)
    out = prefill_attention(q, k, v, D ** -0.5, 0, spec, report)
    assert torch.allclose(out, _reference(q, k, v), atol=1e-5)
    assert report.sparse_heads == 4 * 3  # every head in each segment after the first


def test_the_fixed_pattern_attends_over_sinks_and_the_local_window_only():
    n, block, window, segment = 192, 16, 32, 64
    q, k, v = _qkv(n)
    spec = PrefillSpec(segment=segment, block=block, window=window, fixed=FixedPattern({0: (1,)}, sink_blocks=1))
    out = prefill_attention(q, k, v, D ** -0.5, 0, spec, PrefillReport())
    allowed = torch.ones(4, n, n, dtype=torch.bool)
    for h in (0, 2, 3):  # head 1 of layer 0 stays dense
        for i in range(n):
            start = (i // segment) * segment
            local = max(0, (start - window) // block) * block if start else 0
            allowed[h, i] = (torch.arange(n) < block) | (torch.arange(n) >= local)
    assert torch.allclose(out, _reference(q, k, v, allowed), atol=1e-5)


def test_a_rigid_head_that_points_at_a_far_block_keeps_it_where_the_fixed_pattern_loses_it():
    n, needle = 256, 40
    q, k, v = _qkv(n, heads=2, kv=2, seed=1)
    q, k = q * 0.05, k * 0.05
    k[0, 0, needle] = 20.0 * torch.ones(D)  # head 0: every late query attends to one far key
    q[0, 0, 128:] = torch.ones(D)
    v[0, 0, needle] = 50.0
    spec = PrefillSpec(segment=64, block=16, window=32, dynamic_above=0.5)
    report = PrefillReport()
    adaptive = prefill_attention(q, k, v, D ** -0.5, 0, spec, report)
    dense = _reference(q, k, v)
    streaming = prefill_attention(q, k, v, D ** -0.5, 0, PrefillSpec(segment=64, block=16, window=32,
                                                                     fixed=FixedPattern()), PrefillReport())
    late = slice(128, n)
    assert torch.allclose(adaptive[0, 0, late], dense[0, 0, late], atol=1e-3)
    assert not torch.allclose(streaming[0, 0, late], dense[0, 0, late], atol=1.0)
    assert report.sparse_heads >= 1 and report.cells < report.dense_cells


def test_adaptive_prefill_is_active_only_for_long_prompts_inside_its_block():
    assert active(10_000) is None
    with adaptive_prefill(PrefillSpec(min_tokens=100)) as report:
        assert active(99) is None and active(100) == (PrefillSpec(min_tokens=100), report)
    assert active(10_000) is None


@pytest.mark.engine
def test_the_transformers_backend_prefills_adaptively_and_agrees_with_dense(transformers_backend):
    dense_backend = transformers_backend
    settings = dataclasses.replace(dense_backend.settings, adaptive_prefill=PrefillSpec(min_tokens=256, segment=256))
    backend = TransformersBackend(settings, dense_backend.model_name)
    text = "\n".join(f"[INFO] node {i}: heartbeat ok, latency {i % 37}ms" for i in range(120))
    prompt = backend.render([{"role": "user", "content": text + "\nWhich node had latency 5ms?"}], "Node")
    dense = dense_backend.forward_rows(prompt, dense_backend.new_cache())[-1]
    cache = backend.new_cache()
    adaptive = backend.forward_rows(prompt, cache)[-1]
    assert len(prompt) > 1024 and not torch.equal(adaptive, dense)  # it ran, and it is not dense attention
    assert int(adaptive.argmax()) == int(dense.argmax())
    kl = float((dense.log_softmax(-1).exp() * (dense.log_softmax(-1) - adaptive.log_softmax(-1))).sum())
    assert kl < 0.05
    assert cache.next_position == len(prompt)  # the cache holds every entry: decoding goes on from it
    assert torch.isfinite(backend.forward([int(adaptive.argmax())], cache)).all()
    with adaptive_prefill(PrefillSpec(min_tokens=256, segment=256)) as report:
        dense_backend.forward_rows(prompt, dense_backend.new_cache())
    assert report.layers == list(range(dense_backend.num_layers)) and 0 < report.sparse_share
    assert report.attention_share < 1


@pytest.mark.engine
def test_a_call_says_what_adaptive_prefill_did_in_its_metadata_and_span(transformers_backend):
    dense_backend = transformers_backend
    settings = dataclasses.replace(dense_backend.settings, adaptive_prefill=PrefillSpec(min_tokens=256, segment=256))
    chat = ChatGravity(backend=TransformersBackend(settings, dense_backend.model_name),
                       gravity=GravityConfig(enabled=False, reasoning=None), max_tokens=1)
    text = "\n".join(f"[INFO] node {i}: heartbeat ok, latency {i % 37}ms" for i in range(60))
    reply = chat.invoke(text + "\nWhich node had latency 5ms?")
    prefill = reply.response_metadata["gravity"]["prefill"]
    assert prefill["layers"] == dense_backend.num_layers and prefill["attention_share"] > 0  # estimate included
    usage = {"input_tokens": 1, "output_tokens": 1}
    attrs = response_attributes("m", "r", "length", usage, reply.response_metadata["gravity"])
    assert attrs["agent_gravity.prefill.attention_share"] == prefill["attention_share"]
    short = chat.invoke("Hi")  # under min_tokens: dense, and nothing to say
    assert short.response_metadata["gravity"]["prefill"] is None


@pytest.mark.parametrize("spec", [
    PrefillSpec(segment=64, block=16, window=32, dynamic_above=0.5),
    PrefillSpec(segment=64, block=16, window=32, fixed=FixedPattern({0: (1,)}, sink_blocks=1)),
    PrefillSpec(segment=64, block=16, dynamic_above=-1.0)], ids=["adaptive", "fixed", "dense"])
def test_the_gpu_path_one_block_sparse_kernel_over_a_table_attends_as_the_cpu_path(monkeypatch, spec):
    q, k, v = _qkv(256, heads=4, kv=2, seed=3)
    q, k = q * 0.05, k * 0.05
    k[0, 0, 40], q[0, 0, 128:] = 20.0, 1.0  # heads 0 and 1 (one KV group) point at a far block late on
    on_cpu, in_table = PrefillReport(), PrefillReport()
    want = prefill_attention(q, k, v, D ** -0.5, 0, spec, on_cpu)
    monkeypatch.setenv("AGENT_GRAVITY_KERNELS", "triton")  # the Triton kernel, in interpreter mode here
    got = prefill_attention(q, k, v, D ** -0.5, 0, spec, in_table)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert in_table.sparse_heads == on_cpu.sparse_heads and in_table.dense_cells == on_cpu.dense_cells
    assert (in_table.sparse_heads > 0) == (spec.dynamic_above >= 0)
    with pytest.raises(ValueError, match="whole number of blocks"):
        PrefillSpec(segment=100, block=16)
    with pytest.raises(ValueError, match="power of two of at least 16"):
        PrefillSpec(segment=96, block=48)
