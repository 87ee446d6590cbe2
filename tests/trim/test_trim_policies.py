"""The shared suite every KV trim policy passes, on the embedded model's real session cache."""

from __future__ import annotations

import pytest
import torch
from langchain_core.messages import HumanMessage

from agent_gravity import SessionNotFoundError
from agent_gravity.trim import (
    TRIM_POLICIES,
    Budget,
    HeadEntropyPolicy,
    LayerStretch,
    ReconstructionPolicy,
    TrimBudgetError,
    TrimPolicy,
    trim_policy_from_spec,
)
from agent_gravity.trim.protect import exact_value_positions

from tests.trim.conftest import HISTORY, QUESTION, chat_on

POLICIES = [*(cls() for cls in TRIM_POLICIES.values()),
            *(cls(protect=not cls().protect) for cls in TRIM_POLICIES.values())]
SINKS, WINDOW = 4, 32
SHARED_BUDGETS = ("head_entropy", "reconstruction")


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.name}-protect={p.protect}")
def test_every_policy_frees_memory_keeps_sinks_window_and_exact_values_and_the_session_goes_on(
        transformers_backend, session, policy):
    backend = transformers_backend
    assert isinstance(policy, TrimPolicy)
    cache = backend.sessions[session].cache
    end = cache.next_position - WINDOW
    report = backend.trim(session, policy, ratio=4, sinks=SINKS, window=WINDOW)
    assert report.bytes_after == cache.nbytes() < report.bytes_before / 2.5
    assert report.entries_after == sum(map(sum, cache.lengths())) < report.entries_before
    protected = set(exact_value_positions(backend.sessions[session].ids, backend.token_texts).tolist())
    budget = Budget(4).per_head(end - SINKS)
    model_kept, model_extra = 0, 0
    for layer in cache.heads:
        layer_kept, layer_extra = 0, 0
        for head in layer:
            kept = set(head.positions.tolist())
            assert set(range(SINKS)) <= kept and set(range(end, cache.next_position)) <= kept
            stretch = {p for p in kept if SINKS <= p < end}
            extra = max(0, len(protected & stretch) - budget) if policy.protect else 0
            # Budgets are per head; head_entropy and reconstruction move budget between the heads of a layer,
            # never add to it.
            assert policy.name in SHARED_BUDGETS or len(stretch) <= budget + extra
            assert not policy.protect or protected & set(range(SINKS, end)) <= kept
            layer_kept, layer_extra = layer_kept + len(stretch), layer_extra + extra
        # reconstruction's default shares the model's budget across layers, never adding to it
        assert getattr(policy, "share", "layer") == "model" or layer_kept <= len(layer) * budget + layer_extra
        model_kept, model_extra = model_kept + layer_kept, model_extra + layer_extra
    assert model_kept <= sum(map(len, cache.heads)) * budget + model_extra
    reply = chat_on(backend).invoke([*HISTORY, QUESTION], conversation_id=session)
    meta = reply.response_metadata["gravity"]["session"]
    assert meta["reset"] is None and meta["reused_tokens"] > 0 and meta["prefilled_tokens"] < 20


def test_what_was_trimmed_is_never_trimmed_again(transformers_backend, session):
    backend = transformers_backend
    backend.trim(session, trim_policy_from_spec({"name": "snapkv"}), ratio=4)
    cache, first_end = backend.sessions[session].cache, backend.sessions[session].trimmed_until
    before = [[h.positions[h.positions < first_end].tolist() for h in layer] for layer in cache.heads]
    chat_on(backend).invoke([*HISTORY, QUESTION], conversation_id=session)
    backend.trim(session, trim_policy_from_spec({"name": "snapkv"}), ratio=4)
    after = [[h.positions[h.positions < first_end].tolist() for h in layer] for layer in cache.heads]
    assert after == before and backend.sessions[session].trimmed_until > first_end


def test_a_history_changed_inside_the_trimmed_part_starts_over_and_says_so(transformers_backend, session):
    transformers_backend.trim(session, trim_policy_from_spec({"name": "streaming_llm"}), ratio=4)
    reply = chat_on(transformers_backend).invoke([HumanMessage("Something else entirely.")], conversation_id=session)
    meta = reply.response_metadata["gravity"]["session"]
    assert meta["reused_tokens"] == 0 and "different history" in meta["reset"] and "stale" in meta["reset"]


def test_a_trim_stores_what_it_keeps_in_fewer_bits_and_the_session_goes_on(transformers_backend, session):
    backend, policy = transformers_backend, trim_policy_from_spec({"name": "snapkv"})
    backend.fork_session(session, f"{session}-fp")
    plain = backend.trim(f"{session}-fp", policy, ratio=2, sinks=SINKS, window=WINDOW)
    cache = backend.sessions[session].cache
    for bad in (3, 8.0):
        with pytest.raises(ValueError, match=f"in 8 or 4 bits, not {bad}; pass 8, 4 or None"):
            backend.trim(session, policy, ratio=2, bits=bad)
    assert cache.nbytes() == plain.bytes_before and cache.packed() == 0  # refused before anything changed
    packed = backend.trim(session, policy, ratio=2, sinks=SINKS, window=WINDOW, bits=8)
    assert packed.bits == 8 and plain.bits is None and packed.entries_after == plain.entries_after
    assert packed.bytes_after < plain.bytes_after / 2  # the sinks and window stay at full precision
    held, full = cache.packed_nbytes()  # what the bench's byte budget counts on, up to the last block of each head
    assert backend.kept_share(8) <= held / full < backend.kept_share(8) * 1.05
    end = cache.next_position - WINDOW
    fp = backend.sessions[f"{session}-fp"].cache
    for layer, fp_layer in zip(cache.heads, fp.heads):
        for head, fp_head in zip(layer, fp_layer):
            assert sorted(head.packed_positions().tolist()) == [p for p in fp_head.positions.tolist()
                                                                if SINKS <= p < end]
            assert head.positions.tolist() == [*range(SINKS), *range(end, cache.next_position)]
            assert [s.key_counts is not None for s in head.packed] == [True]  # keys: a scale per channel per block
    reply = chat_on(backend).invoke([*HISTORY, QUESTION], conversation_id=session)
    assert reply.response_metadata["gravity"]["session"]["reused_tokens"] > 0
    backend.end_session(f"{session}-fp")


def test_bad_trims_get_clear_errors(transformers_backend, session):
    policy = trim_policy_from_spec({"name": "streaming_llm"})
    with pytest.raises(TrimBudgetError, match="cannot hold its 4 sinks and 32-token window"):
        transformers_backend.trim(session, policy, ratio=100)
    with pytest.raises(TrimBudgetError, match="ratio 0.5"):
        transformers_backend.trim(session, policy, ratio=0.5)
    with pytest.raises(SessionNotFoundError, match="no KV session 'nobody'"):
        transformers_backend.trim("nobody", policy, ratio=2)
    with pytest.raises(ValueError, match="unknown trim policy 'h2o'; choose one of .'head_entropy', 'reconstruction'"):
        trim_policy_from_spec({"name": "h2o"})
    with pytest.raises(ValueError, match="bad parameters"):
        trim_policy_from_spec({"name": "snapkv", "colour": 1})


def test_head_entropy_moves_budget_from_rigid_to_dynamic_heads_per_head_not_per_layer():
    torch.manual_seed(0)
    n, d = 64, 16
    keys = [torch.randn(n, d), torch.randn(n, d)]
    sharp = keys[0][5:6].repeat(4, 1) * 40                    # head 0's queries all hit one key: rigid
    flat = torch.zeros(4, d)                                  # head 1 attends evenly: dynamic
    stretch = LayerStretch(0, keys, [torch.arange(n), torch.arange(n)], torch.stack([sharp, flat]), torch.zeros(0))
    policy = HeadEntropyPolicy()
    rigidity = policy.rigidity(stretch)
    assert rigidity[0] < policy.rigid_below < rigidity[1]
    budgets = policy.budgets(stretch, Budget(4), [r < policy.rigid_below for r in rigidity])
    assert budgets[0] < 16 < budgets[1] and sum(budgets) == 32
    kept = policy.select(stretch, Budget(4))
    assert [len(k) for k in kept] == budgets and kept[0].tolist() == list(range(n - budgets[0], n))


def test_reconstruction_shares_the_layer_budget_by_score_keeps_protected_entries_and_needs_its_pass():
    positions = [torch.arange(8), torch.arange(8)]
    keys = [torch.zeros(8, 4), torch.zeros(8, 4)]
    importance = [torch.tensor([.9, .8, .7, .6, .5, .01, .01, .01]),
                  torch.tensor([.02, .03, .01, .01, .01, .01, .01, .04])]
    stretch = LayerStretch(0, keys, positions, None, torch.tensor([6]), importance)
    kept = ReconstructionPolicy().select(stretch, Budget(4))  # 2 + 2 of 16: the layer keeps 4
    assert [k.tolist() for k in kept] == [[0, 1, 6], [6]]      # position 6 is protected in every head
    unprotected = ReconstructionPolicy(protect=False).select(stretch, Budget(4))
    assert [k.tolist() for k in unprotected] == [[0, 1, 2, 3], []]
    with pytest.raises(TrimBudgetError, match="needs entry scores from a reconstruction pass"):
        ReconstructionPolicy().select(LayerStretch(0, keys, positions, None, torch.zeros(0)), Budget(4))
    with pytest.raises(ValueError, match="chunk"):
        ReconstructionPolicy(chunk=0)


def test_reconstruction_shares_the_model_budget_across_layers_by_score():
    positions, keys = [torch.arange(8)], [torch.zeros(8, 4)]
    sharp = LayerStretch(0, keys, positions, None, torch.zeros(0), [torch.tensor([.9, .8, .7, .6, .5, .4, .3, .2])])
    flat = LayerStretch(1, keys, positions, None, torch.tensor([7]), [torch.full((8,), .05)])
    policy = ReconstructionPolicy()
    budgets = policy.layer_budgets([sharp, flat], Budget(4))  # 2 + 2 entries in all; the protected one counts
    assert [b.entries for b in budgets] == [3, 1]
    assert [k.tolist() for k in policy.select(sharp, budgets[0])] == [[0, 1, 2]]
    assert [k.tolist() for k in policy.select(flat, budgets[1])] == [[7]]
    per_layer = ReconstructionPolicy(share="layer")
    assert per_layer.layer_budgets is None  # each layer keeps its own pool: trimmed one layer at a time
    assert [k.tolist() for k in per_layer.select(sharp, Budget(4))] == [[0, 1]]
    with pytest.raises(ValueError, match="share must be 'model' or 'layer'"):
        ReconstructionPolicy(share="head")


def test_exact_values_are_found_across_the_tokens_that_spell_them():
    texts = ["code", " is", " K", "7", "Q", " ok", " worker", "_id", " done", " at", " 4", "2", " AB", "C", "."]
    assert exact_value_positions(list(range(len(texts))), texts).tolist() == [2, 3, 4, 6, 7, 10, 11, 12, 13]


def test_values_in_repeated_log_lines_are_noise_and_rare_ones_are_protected():
    log = "".join(f"[INFO] depth {i}\n" for i in range(5)) + "[WARN] code K7Q2X9\n"
    texts = list(log)  # one character per token
    kept = "".join(log[i] for i in exact_value_positions(list(range(len(texts))), texts).tolist())
    assert kept == "WARNK7Q2X9"  # the rare line's all-caps level and its code; no depth from the noise
