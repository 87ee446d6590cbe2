"""Scoring by context reconstruction: each held entry gets the most attention any re-reading query of its
group gives it (padding and the causal part respected), and the cache ends exactly as it began."""

from __future__ import annotations

import torch

from agent_gravity.backends._ragged_cache import _mask
from agent_gravity.backends._reconstruction import EntryScores, reconstruction_scores

from tests.trim.conftest import NOISE

D = 8


def _reference(query, key, held, width):
    """Per KV head, each held entry's largest softmax weight over every query of its group, one query at a time."""
    q_heads, q = query.shape[1], query.shape[2]
    groups = q_heads // key.shape[1]
    out = []
    for h, n in enumerate(held):
        best = torch.zeros(n)
        for g in range(groups):
            for i in range(q):
                visible = torch.cat([key[0, h, :n], key[0, h, width:width + i + 1]])
                weights = torch.softmax(visible @ query[0, h * groups + g, i] * D ** -0.5, dim=0)
                best = torch.maximum(best, weights[:n])
        out.append(best)
    return out


def test_observe_matches_a_per_query_reference_on_ragged_heads():
    torch.manual_seed(0)
    held, q = [12, 9], 5
    width = max(held)
    query, key = torch.randn(1, 4, q, D), torch.randn(1, 2, width + q, D)
    scores = EntryScores(held=[held], best=[[torch.zeros(n) for n in held]])
    scores.observe(0, query, key, _mask(held, width, q, torch.device("cpu")), D ** -0.5)
    for got, want in zip(scores.best[0], _reference(query, key, held, width)):
        torch.testing.assert_close(got, want)


def test_observe_on_level_heads_is_causal_over_the_new_part_and_keeps_the_running_maximum():
    torch.manual_seed(1)
    held, q = [7, 7], 4
    query, key = torch.randn(1, 2, q, D), torch.randn(1, 2, 7 + q, D)
    scores = EntryScores(held=[held], best=[[torch.ones(7), torch.zeros(7)]])
    scores.observe(0, query, key, None, D ** -0.5)
    want = _reference(query, key, held, 7)
    assert torch.equal(scores.best[0][0], torch.ones(7))   # a running maximum never goes down
    torch.testing.assert_close(scores.best[0][1], want[1])


def test_reconstruction_leaves_the_cache_as_it_was_and_scores_the_buried_value_above_the_noise(transformers_backend):
    backend = transformers_backend
    text = f"LOG:\n{NOISE}\n[WARN] deploy code is K7Q2X9\n{NOISE}"
    ids = backend.encode(text)
    cache = backend.new_cache()
    backend.forward(ids, cache)
    before = ([[h.positions.clone() for h in layer] for layer in cache.heads], cache.next_position,
              [q.clone() for q in cache.queries], cache.entropy.clone())
    scores = reconstruction_scores(cache, ids, backend.encode("\n\nRepeat the previous context exactly.\n\n"), 64,
                                   backend.read)
    after = ([[h.positions for h in layer] for layer in cache.heads], cache.next_position, cache.queries,
             cache.entropy)
    assert all(torch.equal(a, b) for x, y in zip(before[0], after[0]) for a, b in zip(x, y))
    assert before[1] == after[1] and all(torch.equal(a, b) for a, b in zip(before[2], after[2]))
    assert torch.allclose(before[3], after[3], equal_nan=True)
    code = [i for i, t in enumerate(backend.token_texts[j] for j in ids) if any(c.isdigit() for c in t)
            and i > len(backend.encode(f"LOG:\n{NOISE}\n[WARN] deploy code is"))][:2]
    per_entry = torch.stack([torch.stack(layer) for layer in scores.best]).amax(dim=(0, 1))  # over layers, heads
    assert per_entry.shape == (len(ids),) and (per_entry[code] > per_entry[4:].median()).all()


def test_the_recent_queries_score_too_when_asked(transformers_backend):
    backend = transformers_backend
    ids = backend.encode(f"LOG:\n{NOISE}\n[WARN] deploy code is K7Q2X9\n{NOISE}\nWhat is the deploy code?")
    cache = backend.new_cache()
    backend.forward(ids, cache)
    instruction = backend.encode("\n\nRepeat the previous context exactly.\n\n")
    plain = reconstruction_scores(cache, ids, instruction, 64, backend.read)
    recent = reconstruction_scores(cache, ids, instruction, 64, backend.read, recent=True)
    pairs = [(a, b) for x, y in zip(plain.best, recent.best) for a, b in zip(x, y)]
    assert all((b >= a).all() for a, b in pairs) and any((b > a).any() for a, b in pairs)
