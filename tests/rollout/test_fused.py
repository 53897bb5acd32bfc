"""The fused decode kernels compute what the eager operations they replace compute: exactly
where the arithmetic is the same, and within the rounding of the compute dtype where only the
order of a float32 sum or the exp implementation differs. The decoders' own tests
(test_decoders.py) run every architecture through both paths."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpokit.native.build import build, main
from grpokit.native.decoders import blocked_bt
from grpokit.native.fused import BLOCK, BlockedLinear, decode_kernels

BF16_ULP = 2.0**-7
"""The largest spacing of bfloat16 numbers relative to their value (8 significant bits): two
roundings of nearly the same float32 value differ by at most this much of it."""

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module")
def kernels():  # type: ignore[no-untyped-def]
    ops = decode_kernels()
    assert ops is not None, "the fused decode kernels did not build (see the log)"
    return ops


def _within_one_rounding(
    ours: torch.Tensor, want: torch.Tensor, terms: torch.Tensor | None = None, slack: float = 0
) -> None:
    """ours is want (float64 or float32) rounded to ours' dtype, give or take one rounding; plus
    ``slack`` of ``terms``, the size of what was summed into want (a sum that cancels has a
    float32 error relative to its terms, not to itself)."""
    rounding = BF16_ULP if ours.dtype == torch.bfloat16 else 2.0**-20
    err = (ours.double() - want.double()).abs()
    bound = rounding * want.double().abs() + 1e-30
    if terms is not None:
        bound = bound + slack * terms.double()
    assert bool((err <= bound).all()), f"largest error {float((err - bound).max())} over bound"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_delta", [False, True])
def test_add_rms_norm(kernels, dtype: torch.dtype, with_delta: bool) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, 96, generator=g) * 3
    delta = (torch.randn(5, 96, generator=g) * 2).to(dtype) if with_delta else None
    weight = torch.randn(96, generator=g)
    want_hidden = hidden + delta if delta is not None else hidden.clone()
    normed = torch.nn.functional.rms_norm(want_hidden.double(), (96,), eps=1e-5)
    out = kernels.add_rms_norm(hidden, delta, weight, 1e-5, dtype == torch.bfloat16)
    assert out.dtype == dtype and out.shape == hidden.shape
    torch.testing.assert_close(hidden, want_hidden, rtol=0, atol=0)  # the residual add, in place
    _within_one_rounding(out, weight.double() * normed)


def _eager_rope(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: int,
    kv: int,
    d: int,
    norms: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The eager decoder's arithmetic (grpokit.native.decoders) in float64: per-head norm,
    rotation; q and k as (float64, size of the rotation's two terms), v as given."""
    rows = qkv.shape[0]
    q, k, v = qkv.split([heads * d, kv * d, kv * d], dim=-1)
    q, k = q.reshape(rows, heads, d).double(), k.reshape(rows, kv, d).double()
    if norms is not None:

        def head_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            n = torch.nn.functional.rms_norm(x, (d,), eps=1e-6).to(qkv.dtype).double()
            return w.double() * n

        q, k = head_norm(q, norms[0]), head_norm(k, norms[1])

    def rotate(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = x * cos[:, None].double(), x.roll(d // 2, dims=-1) * sin[:, None].double()
        return a + b, a.abs() + b.abs()

    return rotate(q), rotate(k), v.reshape(rows, kv, d)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_norms", [False, True], ids=["llama", "qwen3-head-norms"])
def test_rope_cache(kernels, dtype: torch.dtype, head_norms: bool) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(1)
    rows, heads, kv, d, width, column = 3, 6, 2, 16, 9, 4
    qkv = torch.randn(rows, (heads + 2 * kv) * d, generator=g).to(dtype)
    cos, sin = torch.randn(rows, d, generator=g), torch.randn(rows, d, generator=g)
    norms = (torch.randn(d, generator=g), torch.randn(d, generator=g)) if head_norms else None
    keys = torch.randn(rows, kv, d, width, generator=g).to(dtype)
    values = torch.randn(rows, kv, width, d, generator=g).to(dtype)
    old_keys, old_values = keys.clone(), values.clone()
    q = kernels.rope_cache(
        qkv, cos, sin, keys, values, column, heads, *(norms or (None, None)), 1e-6
    )
    want_q, want_k, want_v = _eager_rope(qkv, cos, sin, heads, kv, d, norms)
    # a per-head norm rounds to the dtype before the rotation, whose sum may cancel
    slack = BF16_ULP if head_norms and dtype == torch.bfloat16 else 2.0**-20
    _within_one_rounding(q, *want_q, slack=slack)
    _within_one_rounding(keys[..., column], *want_k, slack=slack)
    assert torch.equal(values[:, :, column], want_v)
    other = [c for c in range(width) if c != column]
    assert torch.equal(keys[..., other], old_keys[..., other])
    assert torch.equal(values[:, :, other], old_values[:, :, other])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads, kv", [(6, 2), (4, 4), (20, 2)], ids=["gqa3", "mha", "gqa10"])
def test_decode_attention(kernels, dtype: torch.dtype, heads: int, kv: int) -> None:  # type: ignore[no-untyped-def]
    """Against softmax attention in float64 over the first ``upto`` columns; the columns after
    are NaN, so anything read from them would show, as would a padding column (bias -inf).
    Groups of 3, 1 and 10 query heads per key/value head (the kernel blocks them by 8)."""
    g = torch.Generator().manual_seed(2)
    # 23 cached columns and d = 24: a full block of 16 and a narrower one in both products
    rows, d, width, upto, scale = 4, 24, 40, 23, 0.25
    q = torch.randn(rows, heads, d, generator=g).to(dtype)
    keys = torch.randn(rows, kv, d, width, generator=g).to(dtype)
    values = torch.randn(rows, kv, width, d, generator=g).to(dtype)
    keys[..., upto:], values[:, :, upto:] = float("nan"), float("nan")
    bias = torch.zeros(rows, width)
    bias[0, :2] = bias[2, :5] = float("-inf")  # left padding of two rows
    out = kernels.decode_attention(q, keys, values, bias, upto, scale)
    groups = heads // kv
    k64 = keys[..., :upto].double().repeat_interleave(groups, dim=1)  # (rows, heads, d, upto)
    v64 = values[:, :, :upto].double().repeat_interleave(groups, dim=1)
    scores = torch.einsum("rhd,rhdj->rhj", q.double(), k64) * scale + bias[:, None, :upto]
    want = torch.einsum("rhj,rhjd->rhd", scores.softmax(-1), v64).reshape(rows, heads * d)
    assert out.dtype == dtype and not out.isnan().any()
    # float32 sums of `upto` products: a few ulps of the largest term, not of the result
    err = (out.double() - want).abs()
    slack = BF16_ULP * want.abs() if dtype == torch.bfloat16 else 0
    assert bool((err <= slack + 1e-5 * float(v64.abs().max())).all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(kernels, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    """Over the whole range, the extremes included (where exp over- or underflows)."""
    x = torch.cat([torch.linspace(-120, 120, 4801), torch.tensor([-1e4, 1e4, 0.0])])
    up = torch.linspace(-3, 3, x.numel())
    out = kernels.silu_mul(torch.cat([x, up])[None].to(dtype))[0]
    assert out.dtype == dtype and out.isfinite().all()
    if dtype == torch.float32:
        want = torch.nn.functional.silu(x.double()) * up.double()
        err = (out.double() - want).abs()
        assert bool((err <= 1e-6 * want.abs() + 1e-30).all())
    else:  # rounded after the silu and after the product, as the eager pair rounds
        want = torch.nn.functional.silu(x.to(dtype)) * up.to(dtype)
        _within_one_rounding(out, want.float())


@pytest.mark.parametrize("dtype", DTYPES)
def test_lora_add(kernels, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    """out += B(A x) * scale per part, in order, rounded where peft's forward rounds under
    autocast (after A, after B, after the scaling, after the sum); checked against float64 with
    the same roundings. Parts of different ranks, over one and two blocks of outputs; two
    adapters on the first 70 outputs."""
    g = torch.Generator().manual_seed(5)
    rows, width, inner = 3, 110, 64
    # (output offset, outputs, rank, scale): q-like, k-like of another rank, a second adapter
    spec = [(0, 70, 4, 2.0), (70, 40, 2, 0.75), (0, 70, 3, 1.5)]  # in blocks of 64 outputs
    ranks = sum(r for _, _, r, _ in spec)
    x = torch.randn(rows, inner, generator=g).to(dtype)
    a = (torch.randn(ranks, inner, generator=g) / 4).to(dtype)
    bs = [torch.randn(n, r, generator=g).to(dtype) for _, n, r, _ in spec]
    out = (torch.randn(rows, width, generator=g) * 4).to(dtype)
    parts, first, flat = [], 0, 0
    for (offset, n, r, _), b in zip(spec, bs, strict=True):
        parts.append([offset, n, first, r, flat])
        first, flat = first + r, flat + blocked_bt(b.t()).numel()
    bt = torch.cat([blocked_bt(b.t()).view(-1) for b in bs])
    scales = torch.tensor([s for *_, s in spec], dtype=torch.float64)
    want, terms = out.double(), out.double().abs()
    t = (x.double() @ a.double().t()).to(dtype).double()
    for (offset, n, first, r, _), b, (*_, s) in zip(parts, bs, spec, strict=True):
        share = t[:, first : first + r] @ b.double().t()
        share = (share.to(dtype).double() * s).to(dtype).double()
        want = want.clone()
        want[:, offset : offset + n] = (want[:, offset : offset + n] + share).to(dtype).double()
        t_terms = t[:, first : first + r].abs() @ b.double().abs().t()
        terms = terms.clone()
        terms[:, offset : offset + n] += s * t_terms + share.abs()
    ours = out.clone()
    # The kernel takes A^T, its ranks padded to a multiple of 16 by zero columns.
    a_t = torch.cat([a.t(), a.new_zeros(inner, 16 - ranks)], dim=1).contiguous()
    kernels.lora_add(ours, x, a_t, bt, torch.tensor(parts), scales)
    assert ours.dtype == dtype
    # A sum rounded differently can round t, B's product or the scaling the other way: at most
    # one rounding of each term of the result.
    rounding = BF16_ULP if dtype == torch.bfloat16 else 2.0**-20
    _within_one_rounding(ours, want, terms, slack=3 * rounding)
    with pytest.raises(RuntimeError, match="outside"):
        kernels.lora_add(ours, x, a_t, bt, torch.tensor([[50, 70, 0, 4, 0]]), scales[:1])


@pytest.mark.parametrize("rows", [1, 4, 6, 11, 300])  # 300: past the kernel's 256-row passes
@pytest.mark.parametrize("outputs", [16, 45])  # 45: a last block of 13 features
@pytest.mark.parametrize("with_bias", [False, True])
def test_blocked_linear(kernels, rows: int, outputs: int, with_bias: bool) -> None:  # type: ignore[no-untyped-def]
    """x W^T + b in float32, each output a sum of K + 1 terms in some order: within K + 1
    roundings of its terms' magnitude of the float64 product (Higham's bound for a recursive
    sum); the same bits with one thread and two (each output is one thread's sum)."""
    g = torch.Generator().manual_seed(7)
    inner = 72
    weight = torch.randn(outputs, inner, generator=g)
    bias = torch.randn(outputs, generator=g) if with_bias else None
    x = torch.randn(inner, rows, generator=g).t()  # not contiguous: the op takes any stride
    layer = BlockedLinear(weight, bias)
    assert layer.blocks.shape == (-(-outputs // BLOCK), inner, BLOCK)
    ours = layer(x)
    want = x.double() @ weight.double().t()
    terms = x.double().abs() @ weight.double().abs().t()
    if bias is not None:
        want, terms = want + bias.double(), terms + bias.double().abs()
    assert ours.shape == (rows, outputs) and ours.dtype == torch.float32
    err = (ours.double() - want).abs()
    assert bool((err <= (inner + 1) * 2.0**-24 * terms).all())
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(layer(x), ours)
    finally:
        torch.set_num_threads(threads)
    # leading dimensions are kept
    assert torch.equal(layer(x.reshape(1, rows, inner)), ours.reshape(1, rows, outputs))
    with pytest.raises(RuntimeError, match="float32"):
        kernels.blocked_linear(x.double(), layer.blocks, None, outputs)
    with pytest.raises(RuntimeError, match="blocks"):
        kernels.blocked_linear(x, layer.blocks, None, outputs + BLOCK)


def test_build_is_cached(tmp_path: Path) -> None:
    first = build("decode", tmp_path)
    stamp = first.stat().st_mtime_ns
    assert build("decode", tmp_path) == first and first.stat().st_mtime_ns == stamp  # not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary left


def test_a_failed_build_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CXX", "false")  # a compiler that fails
    with pytest.raises(RuntimeError, match="false failed"):
        build("decode", tmp_path)
    assert list(tmp_path.iterdir()) == []
    # the set-up's entry point says so and exits 1 instead of failing the set-up
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path))
    assert main() == 1
    assert "decode kernels not built" in capsys.readouterr().out
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert main() == 1


def test_switched_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPOKIT_FUSED_DECODE", "0")
    decode_kernels.cache_clear()
    try:
        assert decode_kernels() is None
    finally:
        monkeypatch.delenv("GRPOKIT_FUSED_DECODE")
        decode_kernels.cache_clear()
    assert decode_kernels() is not None


def test_bfloat16_rounding_is_torchs(kernels) -> None:  # type: ignore[no-untyped-def]
    """The kernels' own float32 -> bfloat16 rounding gives torch's cast bit for bit: nearest
    even, over the whole range, infinities included (the norm's weight carries them); a NaN
    stays a NaN (torch's own cast gives different NaN bits on different CPUs)."""
    g = torch.Generator().manual_seed(3)
    width = 20_000
    weight = torch.logspace(-40, 38, width) * torch.randn(width, generator=g).sign()
    weight[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    hidden = torch.randn(2, width, generator=g)
    out32 = kernels.add_rms_norm(hidden, None, weight, 1e-6, False)
    out16 = kernels.add_rms_norm(hidden, None, weight, 1e-6, True)
    want = out32.to(torch.bfloat16)
    assert torch.equal(out16.isnan(), want.isnan()) and int(want.isnan().sum()) == 2
    ours, theirs = out16.view(torch.int16), want.view(torch.int16)
    assert torch.equal(ours[~want.isnan()], theirs[~want.isnan()])
