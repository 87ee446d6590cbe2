"""Entropy-adaptive prefill: dense attention for the heads that need it, block-sparse attention for the rest.

Head types depend on the input, so they are found at run time, per query segment. For each segment of the prompt
(``segment`` queries) and each query head, the segment's last ``samples`` queries attend exactly over every key
they see. Their attention entropy, divided by the log of the keys seen, says whether the head is *dynamic* in
that segment (spread out: it keeps dense attention) or *rigid* (concentrated). A rigid head attends only over
the key blocks that hold ``coverage`` of its sampled attention mass, always with the first block (the sinks) and
the local window: a retrieval head that points at a far block keeps that block. A rigid head whose blocks would
cover more than ``max_share`` of what it sees stays dense, so sparse attention runs only where it saves work.

The estimate costs ``samples / segment`` of dense attention; short prompts (under ``min_tokens``, the measured
break-even) stay dense.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from agent_gravity.kernels import block_sparse_attention, resolve_impl

_ACTIVE: contextvars.ContextVar[tuple[PrefillSpec, PrefillReport] | None] = contextvars.ContextVar(
    "agent_gravity_adaptive_prefill", default=None)


@dataclass(frozen=True)
class PrefillSpec:
    """How adaptive prefill decides (see the module docstring); ``fixed`` replaces the run-time choice."""

    min_tokens: int = 4096
    segment: int = 512
    block: int = 64
    samples: int = 16
    dynamic_above: float = 0.55
    """Normalised attention entropy (nats over the log of the keys seen) above which a head is dynamic."""
    coverage: float = 0.95
    window: int = 256
    """Keys before a segment's first query that every sparse head keeps (the local window)."""
    max_share: float = 0.5
    fixed: FixedPattern | None = None

    def __post_init__(self) -> None:
        if self.block < 16 or self.block & (self.block - 1):
            raise ValueError(f"adaptive prefill's block must be a power of two of at least 16 (the block-sparse "
                             f"kernel's tile), got {self.block}")
        if min(self.min_tokens, self.segment, self.samples) < 1 or self.segment % self.block:
            raise ValueError(f"adaptive prefill needs positive sizes and a segment ({self.segment}) that is a "
                             f"whole number of blocks ({self.block})")


@dataclass(frozen=True)
class FixedPattern:
    """A baseline that ignores the input: ``dense_heads`` per layer keep dense attention (a DuoAttention-style
    split), every other head attends over the sinks (``sink_blocks`` first blocks) and its local window."""

    dense_heads: dict[int, tuple[int, ...]] = field(default_factory=dict)
    sink_blocks: int = 1


@dataclass
class PrefillReport:
    """What adaptive prefill did in one forward: attention cells computed against dense, per layer."""

    cells: int = 0
    dense_cells: int = 0
    estimate_cells: int = 0
    sparse_heads: int = 0
    heads: int = 0
    layers: list[int] = field(default_factory=list)
    head_entropy: dict[int, list[float]] = field(default_factory=dict)
    """Per layer, each query head's mean normalised entropy over the sampled queries of its segments."""

    @property
    def attention_share(self) -> float:
        """Query-key products computed (estimate included) over those of dense attention."""
        return (self.cells + self.estimate_cells) / self.dense_cells if self.dense_cells else 1.0

    @property
    def sparse_share(self) -> float:
        """Share of (layer, segment, head) cells that ran block-sparse."""
        return self.sparse_heads / self.heads if self.heads else 0.0

    def as_dict(self) -> dict[str, float | int]:
        """What a call's metadata says: the shares, and how many layers ran adaptively."""
        return {"attention_share": self.attention_share, "sparse_share": self.sparse_share,
                "layers": len(self.layers)}


@contextlib.contextmanager
def adaptive_prefill(spec: PrefillSpec, report: PrefillReport | None = None) -> Iterator[PrefillReport]:
    """Within this block, long prefills through the ragged attention run adaptively; yields their report
    (``report`` when given)."""
    report = report if report is not None else PrefillReport()
    token = _ACTIVE.set((spec, report))
    try:
        yield report
    finally:
        _ACTIVE.reset(token)


def active(query_len: int) -> tuple[PrefillSpec, PrefillReport] | None:
    """The spec and report in force for a prefill of ``query_len`` queries, or None (dense)."""
    found = _ACTIVE.get()
    return found if found is not None and query_len >= found[0].min_tokens else None


def _segments(n: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, n)) for a in range(0, n, size)]


@dataclass
class _Estimate:
    """The sampled queries of every segment: per head and segment, normalised entropy ``[H, S]`` and attention
    mass per key block ``[H, S, key blocks]`` (zero past the blocks a segment sees)."""

    entropy: torch.Tensor
    mass: torch.Tensor
    cells: int


def _estimate(q: torch.Tensor, k: torch.Tensor, segments: list[tuple[int, int]], offset: int, spec: PrefillSpec,
              scale: float) -> _Estimate:
    """Each segment's last ``samples`` queries attend exactly over the keys they see."""
    heads = q.shape[0]
    entropy = torch.zeros(heads, len(segments), device=q.device)
    mass = torch.zeros(heads, len(segments), math.ceil(k.shape[1] / spec.block), device=q.device)
    cells = 0
    for s, (a, b) in enumerate(segments):
        m, seen = min(spec.samples, b - a), offset + b
        logp = torch.einsum("hmd,hkd->hmk", q[:, b - m:b].float(), k[:, :seen].float()).mul_(scale)
        logp[..., seen - m:].masked_fill_(torch.ones(m, m, dtype=torch.bool, device=q.device).triu(1), -math.inf)
        logp.sub_(torch.logsumexp(logp, -1, keepdim=True))
        probs = torch.exp(logp)
        logp.nan_to_num_(neginf=0.0)
        seen_by = torch.arange(seen - m + 1, seen + 1, dtype=torch.float32, device=q.device)  # keys each query sees
        entropy[:, s] = (-(probs * logp).sum(-1) / torch.log(seen_by + 1)).mean(-1)
        blocks = math.ceil(seen / spec.block)
        mass[:, s, :blocks] = torch.nn.functional.pad(probs.mean(1), (0, blocks * spec.block - seen)).view(
            heads, blocks, spec.block).sum(-1)
        cells += heads * m * seen
    return _Estimate(entropy, mass, cells)


def _base_blocks(segments: list[tuple[int, int]], offset: int, spec: PrefillSpec, blocks: int, sinks: int,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per segment, the key blocks every sparse head keeps (the ``sinks`` first blocks, and the local window
    through the segment itself) ``[S, blocks]``, and the key blocks its queries see ``[S]``."""
    ids = torch.arange(blocks, device=device)
    seen = torch.tensor([math.ceil((offset + b) / spec.block) for _, b in segments], device=device)
    local = torch.tensor([max(0, (offset + a - spec.window) // spec.block) for a, _ in segments], device=device)
    base = ((ids < sinks) | (ids >= local[:, None])) & (ids < seen[:, None])
    return base, seen


def _chosen(mass: torch.Tensor, base: torch.Tensor, seen: torch.Tensor, coverage: float) -> torch.Tensor:
    """Per head and segment, the base blocks and then the heaviest others until ``coverage`` of the sampled mass
    is held ``[H, S, blocks]``."""
    held = (mass * base).sum(-1)
    rest = mass.masked_fill(base, 0.0)
    order = torch.argsort(rest, dim=-1, descending=True)
    total = rest.gather(-1, order).cumsum(-1)
    need = torch.searchsorted(total, (coverage - held).unsqueeze(-1)).squeeze(-1) + 1
    need = torch.where(held < coverage, need, 0)
    take = torch.arange(mass.shape[-1], device=mass.device) < need.unsqueeze(-1)
    chosen = torch.zeros_like(base.expand_as(mass)).scatter(-1, order, take)
    return (base | chosen) & (torch.arange(mass.shape[-1], device=mass.device) < seen[:, None])


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
           scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` ``[H, m, d]`` over ``k``/``v`` ``[H, L, d]`` with its log-sum-exp ``[H, m]``, so that
    passes over disjoint keys merge exactly. ``causal`` (square only): query i sees keys up to i."""
    if q.device.type == "cpu":  # torch's fused CPU kernel, the one dense prefill runs on
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), 0.0, causal, scale=scale)[:2]
        return out[0], lse[0]
    scores = torch.einsum("hmd,hkd->hmk", q.float(), k.float()) * scale
    if causal:
        scores.masked_fill_(torch.ones_like(scores[0], dtype=torch.bool).triu(1), -math.inf)
    lse = torch.logsumexp(scores, -1)
    return torch.einsum("hmk,hkd->hmd", torch.exp(scores - lse.unsqueeze(-1)), v.float()).to(q.dtype), lse


def _merge(first: tuple[torch.Tensor, torch.Tensor],
           second: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """One attention pass over the union of two passes' disjoint keys."""
    (o1, l1), (o2, l2) = first, second
    top = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - top), torch.exp(l2 - top)
    total = w1 + w2
    out = (o1.float() * (w1 / total).unsqueeze(-1) + o2.float() * (w2 / total).unsqueeze(-1)).to(o1.dtype)
    return out, top + torch.log(total)


def _prefix_ids(chosen: torch.Tensor, block: int, end: int) -> torch.Tensor:
    """Key positions of the blocks ``chosen`` that lie before ``end``."""
    ids = (chosen.unsqueeze(1) * block + torch.arange(block)).reshape(-1)
    return ids[ids < end]


def _plan(q: torch.Tensor, k: torch.Tensor, segments: list[tuple[int, int]], offset: int, layer: int,
          spec: PrefillSpec, scale: float, report: PrefillReport) -> tuple[torch.Tensor, torch.Tensor]:
    """Which heads run sparse in which segment ``[H, S]``, and the key blocks each keeps there ``[H, S, blocks]``
    (the rest run dense)."""
    heads, blocks = q.shape[0], math.ceil(k.shape[1] / spec.block)
    after_start = torch.tensor([offset + a > 0 for a, _ in segments], device=q.device)
    if spec.fixed is not None:
        base, _ = _base_blocks(segments, offset, spec, blocks, spec.fixed.sink_blocks, q.device)
        dense = torch.zeros(heads, 1, dtype=torch.bool, device=q.device)
        dense[list(spec.fixed.dense_heads.get(layer, ()))] = True
        return ~dense & after_start, base.expand(heads, -1, -1)
    estimate = _estimate(q, k, segments, offset, spec, scale)
    report.estimate_cells += estimate.cells
    report.head_entropy[layer] = estimate.entropy[:, 1:].mean(1).tolist() if len(segments) > 1 else []
    base, seen = _base_blocks(segments, offset, spec, blocks, 1, q.device)
    keep = _chosen(estimate.mass, base, seen, spec.coverage)
    sparse = ((estimate.entropy <= spec.dynamic_above) & (keep.sum(-1) <= spec.max_share * seen)
              & after_start)
    return sparse, keep


def prefill_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float, layer: int,
                      spec: PrefillSpec, report: PrefillReport) -> torch.Tensor:
    """Causal attention of ``query`` ``[1, H, n, d]`` over ``key``/``value`` ``[1, KV, offset + n, d]`` (grouped
    heads), dense per head and segment where the head is dynamic, block-sparse where it is rigid. Returns
    ``[1, H, n, d]``.

    Heads dense in every segment run as one causal pass. The others run segment by segment: over the segment's
    own keys causally, then over the keys before it (all of them where the head is dense there, its chosen
    blocks where it is sparse); the passes merge by their log-sum-exp, so a dense plan is dense attention to
    rounding.
    """
    q, k, v = query[0], key[0], value[0]
    heads, n, _ = q.shape
    groups = heads // k.shape[0]
    offset = k.shape[1] - n
    segments = _segments(n, spec.segment)
    report.layers.append(layer)
    report.dense_cells += heads * (n * offset + n * (n + 1) // 2)
    report.heads += heads * len(segments)
    grouped = k, v
    k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
    sparse, keep = _plan(q, k, segments, offset, layer, spec, scale, report)
    if resolve_impl("auto", q.device) == "triton":
        return _by_table(q, *grouped, sparse, keep, offset, spec, scale, report).unsqueeze(0)
    plans = [{h: torch.nonzero(keep[h, s]).squeeze(1) for h in torch.nonzero(sparse[:, s]).flatten().tolist()}
             for s in range(len(segments))]
    out = torch.empty_like(q)
    mixed = sorted({h for plan in plans for h in plan})
    whole = [h for h in range(heads) if h not in mixed]
    if whole and offset == 0:
        index = torch.tensor(whole)
        out[index] = _flash(q[index], k[index], v[index], True, scale)[0]
        report.cells += len(whole) * n * (n + 1) // 2
    elif whole:
        mixed = list(range(heads))
    if not mixed:
        return out.unsqueeze(0)
    index = torch.tensor(mixed)
    qm, km, vm = q[index], k[index], v[index]
    for (a, b), plan in zip(segments, plans):
        start, seen, m = offset + a, offset + b, b - a
        own = _flash(qm[:, a:b], km[:, start:seen], vm[:, start:seen], True, scale)
        report.cells += len(mixed) * m * (m + 1) // 2
        if start == 0:
            out[index, a:b] = own[0]
            continue
        # heads that attend over the same keys before the segment share one pass
        groups: dict[tuple[int, ...] | None, list[int]] = {}
        for i, h in enumerate(mixed):
            groups.setdefault(tuple(plan[h].tolist()) if h in plan else None, []).append(i)
        before_out, before_lse = torch.empty_like(own[0]), torch.empty_like(own[1])
        for blocks, members in groups.items():
            rows = torch.tensor(members)
            if blocks is None:
                keys, values, width = km[rows, :start], vm[rows, :start], start
            else:
                ids = _prefix_ids(torch.tensor(blocks), spec.block, start)
                keys, values, width = km[rows][:, ids], vm[rows][:, ids], len(ids)
                report.sparse_heads += len(members)
            before_out[rows], before_lse[rows] = _flash(qm[rows, a:b], keys, values, False, scale)
            report.cells += len(members) * m * width
        out[index, a:b] = _merge(own, (before_out, before_lse))[0]
    return out.unsqueeze(0)


def _block_table(sparse: torch.Tensor, keep: torch.Tensor, n: int, offset: int,
                 spec: PrefillSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head and query block, the key blocks it attends to (its kept blocks in a segment where it runs sparse,
    every block up to its diagonal where dense): ``[H, query blocks, width]`` ids first, and their counts."""
    heads, _, blocks = keep.shape
    rows = torch.arange(math.ceil(n / spec.block), device=keep.device)
    segment = rows * spec.block // spec.segment
    last = (offset + torch.clamp((rows + 1) * spec.block, max=n) - 1) // spec.block
    ids = torch.arange(blocks, device=keep.device)
    listed = torch.where(sparse[:, segment, None], keep[:, segment], True) & (ids <= last[:, None])
    counts = listed.sum(-1)
    width = int(counts.max())
    table = torch.empty(heads, len(rows), width, dtype=torch.int32, device=keep.device)
    for h in range(heads):  # one head at a time: the slot index is [query blocks, key blocks] int64
        slot = torch.where(listed[h], listed[h].cumsum(-1) - 1, width)
        row = torch.zeros(len(rows), width + 1, dtype=torch.long, device=keep.device)
        table[h] = row.scatter_(-1, slot, ids.expand(len(rows), -1))[:, :width]
    return table, counts


def _by_table(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sparse: torch.Tensor, keep: torch.Tensor,
              offset: int, spec: PrefillSpec, scale: float, report: PrefillReport) -> torch.Tensor:
    """The GPU path: heads dense in every segment of a fresh prompt run as one fused causal pass (torch's flash
    attention); the rest run in one block-sparse kernel over their table of key blocks."""
    heads, n, _ = q.shape
    groups = heads // k.shape[0]
    out = torch.empty_like(q)
    whole = ~sparse.any(1) if offset == 0 else torch.zeros(heads, dtype=torch.bool, device=q.device)
    if whole.any():
        index = torch.nonzero(whole).flatten()
        out[index] = torch.nn.functional.scaled_dot_product_attention(
            q[index], k[index // groups], v[index // groups], is_causal=True, scale=scale)
        report.cells += len(index) * n * (n + 1) // 2
    mixed = torch.nonzero(~whole).flatten()
    if len(mixed):
        table, counts = _block_table(sparse[mixed], keep[mixed], n, offset, spec)
        out[mixed] = block_sparse_attention(q[mixed], k[mixed // groups], v[mixed // groups], table, counts,
                                            spec.block, scale)[0]
        report.cells += int(counts.sum()) * spec.block * spec.block
        report.sparse_heads += int(sparse[mixed].sum())
    return out
