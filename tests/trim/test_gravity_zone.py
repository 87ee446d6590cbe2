"""Entropy-gated 8-bit KV: gravity zones are found from the entropy trace, stored in int8, never packed twice."""

from __future__ import annotations

import math

import pytest
import torch
from langchain_core.messages import HumanMessage

from agent_gravity import ChatGravity, GravityConfig, KVConfig
from agent_gravity._messages import to_chat_dicts
from agent_gravity.backends._ragged_cache import HeadKV, PackedKV
from agent_gravity.trim import GravityZone, TrimBudgetError, trim_policy_from_spec

from tests.trim.conftest import HISTORY, QUESTION

NAN = math.nan


def test_a_zone_is_every_position_of_a_low_stretch_and_unknown_entropy_is_never_low():
    e = torch.tensor([NAN, 3, 3, .1, .1, .1, .1, 3, 3, .1, NAN, .1, .1])
    zone = GravityZone(threshold=0.5, patience=3)
    assert zone.positions(e, 0, 13).tolist() == [3, 4, 5, 6]
    assert zone.positions(e, 4, 13).tolist() == [4, 5, 6]      # only inside [start, end)
    assert zone.positions(e, 0, 2).tolist() == []                # shorter than the patience
    assert GravityZone(0.5, 1).positions(e, 0, 13).tolist() == [3, 4, 5, 6, 9, 11, 12]


@pytest.mark.parametrize("bad", [{"threshold": 0}, {"threshold": math.inf}, {"patience": 0}])
def test_bad_zones_are_clear_errors(bad):
    with pytest.raises(TrimBudgetError, match="gravity zone"):
        GravityZone(**bad)


def test_int8_entries_round_trip_within_half_a_step_and_hold_a_quarter_of_the_bytes():
    torch.manual_seed(0)
    keys, values = torch.randn(50, 64) * 3, torch.randn(50, 64)
    packed = PackedKV.pack(keys, values, torch.arange(50))
    k, v = packed.unpack(torch.float32)
    assert torch.all((k - keys).abs() <= packed.key_scales / 2 + 1e-6)
    assert torch.all((v - values).abs() <= packed.value_scales / 2 + 1e-6)
    assert packed.keys.dtype == torch.int8 and packed.keys.nbytes == keys.nbytes // 4


def test_int4_entries_pack_two_to_a_byte_with_a_scale_per_32_values_and_round_trip_within_half_a_step():
    torch.manual_seed(0)
    keys, values = torch.randn(50, 64) * 3, torch.randn(50, 64)
    packed = PackedKV.pack(keys, values, torch.arange(50), bits=4)
    k, _ = packed.unpack(torch.float32)
    step = packed.key_scales.repeat_interleave(32, dim=1)
    assert torch.all((k - keys).abs() <= step / 2 + 1e-6)
    assert packed.keys.dtype == torch.uint8 and packed.keys.shape == (50, 32) and packed.key_scales.shape == (50, 2)
    codes = torch.arange(-7, 8).repeat(2)[:16].float()[None]            # every 4-bit code, signs included
    assert torch.equal(PackedKV.pack(codes, codes, torch.arange(1), bits=4).unpack(torch.float32)[0], codes)
    with pytest.raises(ValueError, match="8 or 4 bits"):
        PackedKV.pack(keys, values, torch.arange(50), bits=2)


@pytest.mark.parametrize("bits", [8, 4])
def test_keys_with_a_scale_per_channel_per_block_keep_an_outlier_channel_to_itself(bits):
    torch.manual_seed(0)
    keys, values = torch.randn(150, 64), torch.randn(150, 64)
    keys[:, 5] *= 40                                                     # one outlier channel, as RoPE'd keys have
    per_entry = PackedKV.pack(keys, values, torch.arange(150), bits)
    packed = PackedKV.pack(keys, values, torch.arange(150), bits, key_block=64)
    assert packed.key_counts.tolist() == [64, 64, 22] and packed.key_scales.shape == (3, 64)
    k, v = packed.unpack(torch.float32)
    step = packed.key_scales.repeat_interleave(packed.key_counts.long(), dim=0)
    assert torch.all((k - keys).abs() <= step / 2 + 1e-6)
    assert torch.equal(v, per_entry.unpack(torch.float32)[1])             # values keep a scale per entry
    rest = torch.arange(64) != 5
    assert (k - keys)[:, rest].abs().mean() < (per_entry.unpack(torch.float32)[0] - keys)[:, rest].abs().mean() / 3
    keep = torch.arange(150) % 3 == 0
    keep[64:128] = False                                                 # the middle block empties and goes
    kept = packed.where(keep)
    assert kept.key_counts.tolist() == [22, 7] and torch.equal(kept.unpack(torch.float32)[0], k[keep])
    both = kept.cat(packed)
    assert both.key_counts.tolist() == [22, 7, 64, 64, 22]
    assert torch.equal(both.unpack(torch.float32)[0], torch.cat([k[keep], k]))
    with pytest.raises(AssertionError):
        kept.cat(per_entry)                                              # one store holds one key layout
    for store in (packed, per_entry):                                     # a crop can empty a store: it still lays out
        empty = store.where(torch.zeros(150, dtype=torch.bool))
        assert [t.shape[0] for t in empty.unpack(torch.float32)] == [0, 0]
    with pytest.raises(ValueError, match="whole number of entries, 1 or more, not 0"):
        PackedKV.pack(keys, values, torch.arange(150), bits, key_block=0)


def test_a_head_keeps_one_store_per_width_and_key_layout_and_lays_every_entry_out():
    torch.manual_seed(0)
    head = HeadKV(torch.randn(10, 64), torch.randn(10, 64), torch.arange(10))
    mixed = head.quantize(torch.tensor([1, 2]), bits=8).quantize(torch.tensor([2, 5, 6]), bits=4)
    assert [s.bits for s in mixed.packed] == [8, 4] and mixed.packed_positions().tolist() == [1, 2, 5, 6]
    keys, _ = mixed.layout()
    assert keys.shape == (10, 64) and torch.allclose(keys[2:4], head.keys[[5, 6]], atol=0.5)
    assert mixed.where(lambda p: p != 5).packed_positions().tolist() == [1, 2, 6]
    blocks = mixed.quantize(torch.tensor([7, 8]), bits=8, key_block=64)  # another key layout: its own store
    assert [(s.bits, s.key_counts is None) for s in blocks.packed] == [(8, True), (4, True), (8, False)]


def test_a_head_packs_the_chosen_entries_once_and_crops_and_drops_reach_them():
    torch.manual_seed(0)
    head = HeadKV(torch.randn(10, 8), torch.randn(10, 8), torch.arange(10))
    layout = head.layout()
    packed = head.quantize(torch.tensor([2, 3, 4]))
    assert packed.positions.tolist() == [0, 1, 5, 6, 7, 8, 9] and packed.packed_positions().tolist() == [2, 3, 4]
    assert len(packed) == 10 and sum(t.nbytes for t in packed.tensors()) < sum(t.nbytes for t in head.tensors())
    keys, _ = packed.layout()                                    # packed first, then full precision
    assert torch.allclose(keys[:3], layout[0][2:5], atol=0.05)
    assert torch.equal(keys[3:], layout[0][[0, 1, 5, 6, 7, 8, 9]])
    again = packed.quantize(torch.tensor([3, 4, 5]))             # 3 and 4 are packed already: only 5 moves
    assert again.packed_positions().tolist() == [2, 3, 4, 5]
    assert torch.equal(again.packed[0].keys[:3], packed.packed[0].keys)
    assert again.where(lambda p: p < 4).packed_positions().tolist() == [2, 3]
    assert again.select(torch.tensor([0])).packed is again.packed  # trims pick among full-precision entries only


def test_a_session_stores_its_gravity_zones_in_8_bits_and_answers_as_before(transformers_backend, session):
    backend = transformers_backend
    prompt = backend.render(to_chat_dicts([*HISTORY, QUESTION]))
    backend.fork_session(session, f"{session}-full")
    full = backend.teacher_force(f"{session}-full", prompt, backend.encode(" K7Q2X9"))
    cache = backend.sessions[session].cache
    zone = GravityZone(0.5, 8)
    expected = set(zone.positions(cache.entropy, 4, cache.next_position - 32).tolist())
    report = backend.quantize(session, zone, sinks=4, window=32)
    assert expected and report.policy == "int8_gravity" and report.entries_after == report.entries_before
    assert report.bytes_after == cache.nbytes() < report.bytes_before
    for layer in cache.heads:
        for head in layer:
            assert set(head.packed_positions().tolist()) == expected and not expected & set(head.positions.tolist())
    # Nothing is lost: the same top-1 tokens as the full cache, teacher-forced over the exact value.
    assert backend.teacher_force(session, prompt, backend.encode(" K7Q2X9")) == full
    backend.sessions.pop(f"{session}-full")


def test_what_is_packed_is_never_trimmed_and_what_was_trimmed_is_never_packed(transformers_backend, session):
    backend = transformers_backend
    backend.quantize(session, GravityZone(0.5, 8))
    cache = backend.sessions[session].cache
    packed = [[h.packed_positions().tolist() for h in layer] for layer in cache.heads]
    backend.trim(session, trim_policy_from_spec({"name": "snapkv"}), ratio=4)
    assert [[h.packed_positions().tolist() for h in layer] for layer in cache.heads] == packed
    trimmed_until = backend.sessions[session].trimmed_until
    backend.quantize(session, GravityZone(10.0, 1))             # everything is "low" now
    for layer in cache.heads:
        for head in layer:
            assert all(p in packed[0][0] or p >= trimmed_until for p in head.packed_positions().tolist())


def test_a_chat_model_with_kv_config_stores_gravity_zones_in_8_bits_each_turn(transformers_backend, spans):
    chat = ChatGravity(backend=transformers_backend, gravity=GravityConfig(enabled=False), max_tokens=6,
                       kv=KVConfig(trim_above=10_000))
    long = HumanMessage("Log:\n" + "\n".join(f"line {i}: all fine" for i in range(40)) + "\nSummarise the log.")
    meta = chat.invoke([long], conversation_id="kv-int8").response_metadata["gravity"]["session"]
    assert meta["quantize"]["policy"] == "int8_gravity" and meta["trim"] is None
    assert meta["quantize"]["bytes_after"] < meta["quantize"]["bytes_before"] / 1.3
    (span,) = [s for s in spans.get_finished_spans() if s.name.startswith("chat ")]
    assert span.attributes["agent_gravity.kv.bytes_before"] == meta["quantize"]["bytes_before"]
    assert span.attributes["agent_gravity.kv.bytes_after"] == meta["quantize"]["bytes_after"]
    assert meta["kv_bytes"] == meta["quantize"]["bytes_before"]  # what the turn left, before it was packed
    plain = ChatGravity(backend=transformers_backend, gravity=GravityConfig(enabled=False), max_tokens=6,
                        kv=KVConfig(trim_above=10_000, quantize_below=None))
    assert plain.invoke([long], conversation_id="kv-fp").response_metadata["gravity"]["session"]["quantize"] is None
    for sid in ("kv-int8", "kv-fp"):
        transformers_backend.end_session(sid)


def test_a_chat_model_can_trim_into_8_bits_and_says_so(transformers_backend, spans):
    kv = KVConfig(policy={"name": "streaming_llm"}, ratio=2, trim_above=16, quantize_below=None, kept_bits=8)
    chat = ChatGravity(backend=transformers_backend, gravity=GravityConfig(enabled=False), max_tokens=4, kv=kv)
    long = HumanMessage("Log:\n" + "\n".join(f"line {i}: all fine" for i in range(40)) + "\nSummarise the log.")
    trim = chat.invoke([long], conversation_id="kv-bits").response_metadata["gravity"]["session"]["trim"]
    assert trim["bits"] == 8 and trim["bytes_after"] < trim["bytes_before"] / 3  # 2x fewer entries, 8 bits
    assert transformers_backend.sessions["kv-bits"].cache.packed() > 0
    (span,) = [s for s in spans.get_finished_spans() if s.name.startswith("chat ")]
    (event,) = [e for e in span.events if e.name == "agent_gravity.kv_trim"]
    assert event.attributes["agent_gravity.kv.bits"] == 8 and event.attributes["agent_gravity.kv.action"] == "trim"
    transformers_backend.end_session("kv-bits")

