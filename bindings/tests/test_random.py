"""The device generator: random ops run on the engine (no CPU fallback),
reproducibly for a seed, with the right distributions (moments and
Kolmogorov-Smirnov tests, not bits: the stream differs from the CPU's)."""

import math

import deferfuse
import pytest
import torch

N = 20000
# The Kolmogorov-Smirnov statistic's critical value at the 0.1% level.
KS_CRITICAL = 1.95 / math.sqrt(N)


def _ks(sample: torch.Tensor, cdf) -> float:
    x, _ = torch.sort(sample.double())
    n = x.numel()
    f = cdf(x)
    above = torch.arange(1, n + 1, dtype=torch.float64) / n - f
    below = f - torch.arange(0, n, dtype=torch.float64) / n
    return max(above.max().item(), below.max().item())


def _normal_cdf(x):
    return 0.5 * (1 + torch.erf(x / math.sqrt(2)))


def test_uniform_is_uniform(mode, no_fallback):
    u = torch.rand(N, device="tpu").cpu()
    assert 0.0 <= u.min().item() and u.max().item() < 1.0
    assert _ks(u, lambda x: x) < KS_CRITICAL
    assert abs(u.mean().item() - 0.5) < 0.01
    assert abs(u.var().item() - 1 / 12) < 0.004


def test_normal_is_normal(mode, no_fallback):
    z = torch.randn(N, device="tpu").cpu()
    assert _ks(z, _normal_cdf) < KS_CRITICAL
    assert abs(z.mean().item()) < 0.03
    assert abs(z.std().item() - 1.0) < 0.03


def test_normal_halves_are_independent_normals_at_any_size(no_fallback):
    # One normal from the cosine and one from the sine of each Box-Muller
    # pair: both halves normal, uncorrelated with each other (elementwise,
    # pair by pair) and squared (the radius they share); odd sizes drop
    # the last sine.
    z = torch.randn(2 * N + 1, device="tpu").cpu()
    assert z.shape == (2 * N + 1,) and torch.isfinite(z).all()
    first, second = z[:N], z[N + 1 :]
    for half in (first, second):
        assert _ks(half, _normal_cdf) < KS_CRITICAL
    assert abs(torch.corrcoef(torch.stack([first, second]))[0, 1].item()) < 0.05
    squares = torch.stack([first * first, second * second])
    assert abs(torch.corrcoef(squares)[0, 1].item()) < 0.05
    assert _ks(torch.randn(3, 5, 7, device="tpu").cpu().flatten(), _normal_cdf) < 0.4


def test_normal_with_mean_and_std(no_fallback):
    x = torch.empty(N, device="tpu").normal_(3.0, 0.5).cpu()
    assert _ks((x - 3.0) / 0.5, _normal_cdf) < KS_CRITICAL


def test_uniform_with_bounds_and_low_precision(no_fallback):
    x = torch.empty(N, device="tpu").uniform_(-2.0, 6.0).cpu()
    assert -2.0 <= x.min().item() and x.max().item() < 6.0
    assert _ks((x + 2.0) / 8.0, lambda v: v) < KS_CRITICAL
    b = torch.rand(N, device="tpu", dtype=torch.bfloat16).cpu()
    assert b.dtype == torch.bfloat16 and b.max().item() < 1.0 and b.min().item() >= 0.0


def test_consecutive_draws_are_independent(no_fallback):
    a, b = torch.rand(N, device="tpu").cpu(), torch.rand(N, device="tpu").cpu()
    assert not torch.equal(a, b)
    corr = torch.corrcoef(torch.stack([a, b]))[0, 1].item()
    assert abs(corr) < 0.05
    # Neighbouring elements of one draw too.
    lag = torch.corrcoef(torch.stack([a[:-1], a[1:]]))[0, 1].item()
    assert abs(lag) < 0.05


def test_bernoulli_and_exponential(no_fallback):
    b = torch.empty(N, device="tpu").bernoulli_(0.3).cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0}
    assert abs(b.mean().item() - 0.3) < 0.02
    probs = torch.full((N,), 0.8, device="tpu")
    assert abs(torch.bernoulli(probs).cpu().mean().item() - 0.8) < 0.02
    e = torch.empty(N, device="tpu").exponential_(2.0).cpu()
    assert e.min().item() >= 0.0
    assert _ks(e, lambda x: 1 - torch.exp(-2.0 * x)) < KS_CRITICAL


def test_manual_seed_reproduces_a_sequence(mode, no_fallback):
    torch.manual_seed(1234)
    first = [torch.rand(64, device="tpu").cpu(), torch.randn(8, 8, device="tpu").cpu()]
    torch.manual_seed(1234)
    second = [torch.rand(64, device="tpu").cpu(), torch.randn(8, 8, device="tpu").cpu()]
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    torch.manual_seed(4321)
    assert not torch.equal(torch.rand(64, device="tpu").cpu(), first[0])


def test_same_numbers_in_every_mode():
    draws = []
    for m in ("strict", "debug", "defer_and_fuse"):
        with deferfuse.mode(m):
            torch.manual_seed(5)
            draws.append(torch.randn(1000, device="tpu").cpu())
    assert torch.equal(draws[0], draws[1]) and torch.equal(draws[0], draws[2])


def test_rng_state_round_trip(no_fallback):
    torch.tpu.manual_seed(99)
    torch.rand(10, device="tpu")
    state = torch.tpu.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    a = torch.randn(100, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    b = torch.randn(100, device="tpu").cpu()
    assert torch.equal(a, b)
    assert torch.tpu.initial_seed() == 99


def test_bad_rng_state_is_a_clear_error():
    with pytest.raises(RuntimeError, match="16 bytes"):
        torch.tpu.set_rng_state(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="range"):
        torch.tpu.manual_seed(1 << 70)


def test_dropout_training_step_runs_without_fallback(mode, no_fallback):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.25), torch.nn.Linear(32, 1)).to(
        "tpu"
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16, device="tpu"), torch.randn(8, 1, device="tpu")
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)


def test_dropout_rate_scale_and_mask(no_fallback):
    torch.manual_seed(3)
    x = torch.ones(N, device="tpu")
    out, mask = torch.ops.aten.native_dropout(x, 0.2, True)
    out, mask = out.cpu(), mask.cpu()
    assert mask.dtype == torch.bool
    assert abs(mask.float().mean().item() - 0.8) < 0.02
    torch.testing.assert_close(out[mask], torch.full((int(mask.sum()),), 1.25))
    assert (out[~mask] == 0).all()


def test_an_explicit_cpu_generator_falls_back_to_it():
    g = torch.Generator().manual_seed(0)
    a = torch.empty(16, device="tpu").uniform_(generator=g).cpu()
    g.manual_seed(0)
    b = torch.empty(16).uniform_(generator=g)
    assert torch.equal(a, b)


def test_randint_and_random_are_uniform_integers(mode, no_fallback):
    r = torch.randint(0, 10, (N,), device="tpu").cpu()
    assert r.dtype == torch.int64 and r.min().item() == 0 and r.max().item() == 9
    counts = torch.bincount(r, minlength=10).double()
    chi2 = ((counts - N / 10) ** 2 / (N / 10)).sum().item()
    assert chi2 < 27.88  # chi-square, 9 degrees of freedom, 0.1% level
    small = torch.randint(-5, 3, (1000,), device="tpu", dtype=torch.int32).cpu()
    assert small.dtype == torch.int32 and small.min().item() >= -5 and small.max().item() < 3
    f = torch.empty(1000, device="tpu").random_(3, 7).cpu()
    assert set(f.unique().tolist()) == {3.0, 4.0, 5.0, 6.0}
    assert torch.empty(1000, device="tpu").random_(4).cpu().max().item() == 3.0


def test_opinfo_harness_compares_random_samples_by_dtype_and_shape():
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "conformance"))
    import opinfo

    result = opinfo.run("defer_and_fuse", torch.float32, ["nn.functional.dropout", "add"], max_samples=6)
    assert result["random"] > 0
    assert result["mismatched"] == 0 and result["errored"] == 0
    rows = {r.name: r for r in result["rows"]}
    assert rows["add"].random == 0  # an op that draws nothing is compared by value


def test_seeding_and_state_restores_leave_the_draw_count_alone():
    from deferfuse import _generator

    before = _generator.draws()
    state = torch.tpu.get_rng_state()
    torch.rand(4, device="tpu")
    torch.tpu.set_rng_state(state)
    torch.manual_seed(0)
    assert _generator.draws() == before + 1


def test_a_device_generator_draws_its_own_reproducible_stream(mode, no_fallback):
    # `torch.Generator(device="tpu")` keeps its own seed and offset: seeded
    # like the default generator it draws the same numbers, without moving
    # the default one; every random op takes it.
    g = torch.Generator(device="tpu").manual_seed(5)
    assert (g.device, g.initial_seed(), g.get_offset()) == (torch.device("tpu", 0), 5, 0)
    torch.tpu.manual_seed(11)
    default_state = torch.tpu.get_rng_state()
    first = torch.randn(1000, device="tpu", generator=g).cpu()
    assert g.get_offset() == 2  # Box-Muller takes two draws
    assert torch.equal(torch.tpu.get_rng_state(), default_state)
    g.manual_seed(5)
    assert torch.equal(torch.randn(1000, device="tpu", generator=g).cpu(), first)
    torch.tpu.manual_seed(5)
    assert torch.equal(torch.randn(1000, device="tpu").cpu(), first)
    x = torch.empty(N, device="tpu")
    draws = [
        lambda: x.uniform_(-1.0, 1.0, generator=g),
        lambda: x.normal_(2.0, 0.5, generator=g),
        lambda: x.exponential_(3.0, generator=g),
        lambda: x.bernoulli_(0.25, generator=g),
        lambda: torch.bernoulli(torch.full((N,), 0.25, device="tpu"), generator=g),
        lambda: torch.randint(0, 8, (N,), device="tpu", generator=g),
    ]
    for draw in draws:
        state = g.get_state()
        a = draw().cpu().clone()
        g.set_state(state)
        assert torch.equal(draw().cpu(), a)
    assert abs(x.uniform_(generator=g).cpu().mean().item() - 0.5) < 0.01
    copy = torch.Generator(device="tpu")
    copy.set_state(g.get_state())
    assert torch.equal(
        torch.rand(64, device="tpu", generator=copy).cpu(), torch.rand(64, device="tpu", generator=g).cpu()
    )


def test_a_device_generator_state_is_checked():
    g = torch.Generator(device="tpu")
    with pytest.raises(RuntimeError, match="CPU uint8 tensor of 16 bytes"):
        g.set_state(torch.zeros(3, dtype=torch.uint8))


def test_normal_with_tensor_mean_or_std(mode, no_fallback):
    mean = torch.full((N,), 2.0, device="tpu")
    std = torch.full((N,), 0.5, device="tpu")
    for x in (torch.normal(mean, std), torch.normal(mean, 0.5), torch.normal(2.0, std)):
        x = x.cpu()
        assert x.shape == (N,) and x.dtype == torch.float32
        assert _ks((x - 2.0) / 0.5, _normal_cdf) < KS_CRITICAL
    # Broadcast, per element: a row of means against a column of stds.
    rows = torch.normal(torch.tensor([0.0, 100.0], device="tpu"), torch.ones(500, 1, device="tpu")).cpu()
    assert rows.shape == (500, 2)
    assert abs(rows[:, 0].mean().item()) < 0.2 and abs(rows[:, 1].mean().item() - 100.0) < 0.2


def test_a_negative_std_tensor_raises_pytorchs_error():
    with pytest.raises(RuntimeError, match="std"):
        torch.normal(torch.zeros(4, device="tpu"), torch.tensor([1.0, -1.0, 1.0, 1.0], device="tpu")).cpu()


def test_log_normal_cauchy_and_geometric(no_fallback):
    x = torch.empty(N, device="tpu").log_normal_(1.0, 0.5).cpu()
    assert x.min().item() > 0 and _ks((x.log() - 1.0) / 0.5, _normal_cdf) < KS_CRITICAL
    c = torch.empty(N, device="tpu").cauchy_(1.0, 2.0).cpu()
    assert _ks(c, lambda v: 0.5 + torch.atan((v - 1.0) / 2.0) / math.pi) < KS_CRITICAL
    g = torch.empty(N, device="tpu").geometric_(0.25).cpu()
    assert g.min().item() == 1.0 and torch.equal(g, g.round())
    assert abs(g.mean().item() - 4.0) < 0.15  # mean 1/p, sd sqrt(1-p)/p = 3.5
    assert abs((g == 1).double().mean().item() - 0.25) < 0.02


@pytest.mark.parametrize(
    "dtype,top",
    [(torch.int64, 2**63 - 1), (torch.int32, 2**31 - 1), (torch.float32, 2**24), (torch.bfloat16, 256)],
)
def test_random_without_bounds_covers_the_dtypes_range(dtype, top, no_fallback):
    r = torch.empty(N, device="tpu", dtype=dtype).random_().cpu()
    assert r.dtype == dtype
    assert r.min().item() >= 0 and r.max().item() <= top
    # Uniform over [0, top]: the mean of value / top is 1/2, and the top
    # bits are used (the largest draw is near the top).
    scaled = r.double() / top
    assert abs(scaled.mean().item() - 0.5) < 0.01
    assert scaled.max().item() > 0.99
    if dtype.is_floating_point:
        assert torch.equal(r, r.round())
    b = torch.empty(1000, device="tpu", dtype=torch.bool).random_().cpu()
    assert 0.4 < b.double().mean().item() < 0.6


@pytest.mark.parametrize("n", [1, 7, 1000, 2049, 5000])
def test_randperm_is_a_permutation(n, mode, no_fallback):
    torch.manual_seed(8)
    p = torch.randperm(n, device="tpu").cpu()
    assert p.dtype == torch.int64 and torch.equal(p.sort().values, torch.arange(n))
    torch.manual_seed(8)
    assert torch.equal(torch.randperm(n, device="tpu").cpu(), p)
    assert torch.randperm(0, device="tpu").cpu().shape == (0,)


def test_randperm_places_each_element_uniformly(no_fallback):
    # Where element 0 lands over many permutations of 6: uniform over the
    # six slots (chi-square, 5 degrees of freedom, 0.1% level: 20.52); 600
    # uniform draws of the 720 permutations show about 407 distinct ones.
    draws = torch.stack([torch.randperm(6, device="tpu", dtype=torch.int32) for _ in range(600)]).cpu()
    assert draws.dtype == torch.int32
    slots = (draws == 0).int().argmax(dim=1)
    counts = torch.bincount(slots, minlength=6).double()
    assert ((counts - 100) ** 2 / 100).sum().item() < 20.52
    assert len({tuple(row.tolist()) for row in draws}) > 370


def test_large_randperm_places_each_element_uniformly(no_fallback):
    # Past the ranks' size the sorting network orders the draws: where the
    # first 8 elements land over 40 permutations of 4096, in eighths of the
    # range, is uniform (chi-square, 7 degrees of freedom, 0.1%: 24.32).
    draws = torch.stack([torch.randperm(4096, device="tpu") for _ in range(40)]).cpu()
    slots = torch.stack([(draws == v).int().argmax(dim=1) for v in range(8)]).flatten()
    counts = torch.bincount(slots // 512, minlength=8).double()
    assert ((counts - 40) ** 2 / 40).sum().item() < 24.32
    assert len({tuple(row.tolist()) for row in draws}) == 40


def test_multinomial_draws_categories_by_weight(mode, no_fallback):
    weights = torch.tensor([[1.0, 0.0, 3.0, 4.0], [0.0, 0.0, 1.0, 1.0]], device="tpu")
    draws = torch.multinomial(weights, 5000, replacement=True).cpu()
    assert draws.shape == (2, 5000) and draws.dtype == torch.int64
    counts = torch.stack([torch.bincount(r, minlength=4) for r in draws]).double()
    expected = torch.tensor([[625.0, 0.0, 1875.0, 2500.0], [0.0, 0.0, 2500.0, 2500.0]])
    assert counts[0, 1] == 0 and counts[1, :2].sum() == 0
    keep = expected > 0
    chi2 = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum().item()
    assert chi2 < 22.46  # chi-square, 4 degrees of freedom, 0.1% level: 18.47 (+ margin for 2 rows)
    one = torch.multinomial(torch.tensor([0.0, 2.0, 0.0], device="tpu"), 1).cpu()
    assert one.tolist() == [1]


def test_multinomial_without_replacement_draws_distinct_categories(no_fallback):
    torch.manual_seed(2)
    w = torch.tensor([5.0, 1.0, 1.0, 1.0, 0.0, 2.0], device="tpu")
    draws = torch.stack([torch.multinomial(w, 3) for _ in range(400)]).cpu()
    assert all(len(set(row.tolist())) == 3 for row in draws)
    assert (draws != 4).all()  # weight 0 is never drawn
    # The heaviest category comes first most often: P = 5/10.
    assert abs((draws[:, 0] == 0).double().mean().item() - 0.5) < 0.1
    # Fewer positive weights than draws: then the zero ones in order, as on CPU.
    assert torch.multinomial(torch.tensor([1.0, 0.0, 0.0], device="tpu"), 2).cpu().tolist() == [0, 1]
    full = torch.multinomial(torch.ones(3, 5, device="tpu"), 5).cpu()
    assert torch.equal(full.sort(dim=1).values, torch.arange(5).expand(3, 5))


@pytest.mark.parametrize(
    "weights,k,replacement",
    [([1.0, -1.0], 1, True), ([0.0, 0.0], 1, True), ([1.0, float("nan")], 1, False), ([0.0, 0.0], 2, False)],
)
def test_invalid_multinomial_weights_raise_pytorchs_error(weights, k, replacement):
    with pytest.raises(RuntimeError):
        torch.multinomial(torch.tensor(weights, device="tpu"), k, replacement).cpu()
