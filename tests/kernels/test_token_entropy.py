"""token_entropy: both implementations against the definition in float64 (Triton in interpreter mode)."""

import math

import pytest
import torch

from agent_gravity.kernels import TokenStats, resolve_impl, token_entropy
from agent_gravity.kernels.token_entropy_triton import token_entropy_triton

IMPLS = ["torch", "triton"]
# On a GPU the same tests run the compiled kernel; on the CPU, Triton's interpreter (see conftest).
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {torch.float32: 2e-4, torch.float16: 2e-3, torch.bfloat16: 2e-3}


def definition(logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """The statistics straight from their definitions, in float64, masked entries skipped."""
    rows = {k: [] for k in ("entropy", "varentropy", "top_prob", "margin", "top_id")}
    for row in logits.double().cpu():
        p = torch.softmax(row, dim=0)
        live = p > 0
        surprisal = -p[live].log()
        rows["entropy"].append(float((p[live] * surprisal).sum()))
        rows["varentropy"].append(float((p[live] * surprisal**2).sum() - (p[live] * surprisal).sum() ** 2))
        top = p.topk(2).values
        rows["top_prob"].append(float(top[0]))
        rows["margin"].append(float(top[0] - top[1]))
        rows["top_id"].append(int(row.argmax()))
    return {k: torch.tensor(v) for k, v in rows.items()}


def check(stats: TokenStats, logits: torch.Tensor, tol: float) -> None:
    want = definition(logits.float())
    for name in ("entropy", "varentropy", "top_prob", "margin"):
        got = getattr(stats, name).cpu()
        assert got.dtype == torch.float32 and torch.isfinite(got).all(), name
        scale = 1.0 if name != "varentropy" else max(1.0, float(want[name].abs().max()))
        torch.testing.assert_close(got.double(), want[name].double(), atol=tol * scale, rtol=tol, msg=name)
    ties = want["top_prob"] - want["margin"] == want["top_prob"]  # top-1 not unique: any argmax will do
    assert (stats.top_id.cpu() == want["top_id"])[~ties].all()


def rows_of(kind: str, n: int, vocab: int, seed: int) -> torch.Tensor:
    return _rows_of(kind, n, vocab, seed).to(DEVICE)


def _rows_of(kind: str, n: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        return torch.randn(n, vocab, generator=g) * 4
    if kind == "peaked":
        x = torch.randn(n, vocab, generator=g) - 30
        x[torch.arange(n), torch.randint(vocab, (n,), generator=g)] = 30
        return x
    if kind == "uniform":
        return torch.zeros(n, vocab)
    if kind == "sentinel":  # masked with a huge finite value instead of -inf, as some callers do
        x = torch.randn(n, vocab, generator=g) * 4
        x[:, : vocab // 2] = -1e30
        x[0, : vocab - 1] = torch.finfo(torch.bfloat16).min
        return x
    if kind == "masked":
        x = torch.randn(n, vocab, generator=g) * 4
        x[torch.rand(n, vocab, generator=g) < 0.7] = float("-inf")
        x[:, 0] = 0.0  # at least one finite entry
        x[0, 1:] = float("-inf")  # a row with a single finite entry
        return x
    raise AssertionError(kind)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["random", "peaked", "uniform", "masked", "sentinel"])
@pytest.mark.parametrize("vocab", [2, 4097, 50021])
def test_matches_the_definition(impl, dtype, kind, vocab):
    logits = rows_of(kind, 5, vocab, seed=vocab).to(dtype)
    check(token_entropy(logits, impl=impl), logits, TOL[dtype])


@pytest.mark.parametrize("impl", IMPLS)
def test_a_one_entry_vocabulary_is_certain(impl):
    stats = token_entropy(torch.randn(3, 1, device=DEVICE), impl=impl)
    assert stats.entropy.tolist() == [0.0] * 3 and stats.top_prob.tolist() == [1.0] * 3
    assert stats.margin.tolist() == [1.0] * 3 and stats.top_id.tolist() == [0] * 3


def test_known_values():
    logits = torch.stack([torch.zeros(1000), torch.full((1000,), -50.0)]).to(DEVICE)
    logits[1, 7] = 50.0
    for impl in IMPLS:
        stats = token_entropy(logits, impl=impl)
        assert stats.entropy[0].item() == pytest.approx(math.log(1000), abs=1e-4)
        assert stats.varentropy[0].item() == pytest.approx(0.0, abs=1e-3)
        assert stats.entropy[1].item() == pytest.approx(0.0, abs=1e-6) and stats.top_id[1].item() == 7


@pytest.mark.parametrize("impl", IMPLS)
def test_large_vocabulary(impl):
    logits = rows_of("random", 3, 152_064, seed=3)
    check(token_entropy(logits, impl=impl), logits, 2e-4)


@pytest.mark.parametrize("impl", IMPLS)
def test_many_rows_selected_rows_and_caller_buffers(impl):
    logits = rows_of("random", 512, 257, seed=4)
    out = TokenStats.empty(600, DEVICE)
    rows = torch.tensor([511, 0, 7, 7, 300], device=DEVICE)
    stats = token_entropy(logits, rows=rows, out=out[:5], impl=impl)
    assert stats.entropy.data_ptr() == out.entropy.data_ptr()
    check(stats, logits[rows], 2e-4)
    check(token_entropy(logits, impl=impl), logits, 2e-4)


@pytest.mark.parametrize("splits", [2, 3, 7])
def test_rows_split_over_several_programs_merge_exactly(splits):
    logits = rows_of("masked", 4, 30_000, seed=splits)
    check(token_entropy_triton(logits, splits=splits), logits, 2e-4)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match=r"\[rows, vocab\]"):
        token_entropy(torch.zeros(10))
    with pytest.raises(ValueError, match="fp32, fp16 or bf16"):
        token_entropy(torch.zeros(2, 10, dtype=torch.float64))
    with pytest.raises(ValueError, match="unknown kernel implementation"):
        token_entropy(torch.zeros(2, 10), impl="cuda")


def test_auto_picks_triton_on_cuda_and_the_reference_elsewhere():
    assert resolve_impl("auto", DEVICE) == ("triton" if DEVICE.type == "cuda" else "torch")
    assert resolve_impl("auto", torch.device("cpu")) == "torch"


def test_a_decode_batch_at_scale_in_bf16():
    logits = (torch.randn(64, 152_064, generator=torch.Generator().manual_seed(5)) * 4).to(DEVICE, torch.bfloat16)
    check(token_entropy(logits, impl="triton"), logits, TOL[torch.bfloat16])
