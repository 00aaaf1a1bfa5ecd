"""Diagnostics against ArviZ, against NumPy formulas written here, and under sharding."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import ensemblenn as enn
from samplers import diagnostics as dg


def ar1(num_chains, num_draws, dim, rho, seed, shift=None):
    """Stationary AR(1) chains (unit marginal variance); chain c shifted by c * shift."""
    rng = np.random.default_rng(seed)
    x = np.empty((num_chains, num_draws, dim))
    x[:, 0] = rng.normal(size=(num_chains, dim))
    noise = rng.normal(size=(num_chains, num_draws, dim)) * np.sqrt(1 - rho**2)
    for t in range(1, num_draws):
        x[:, t] = rho * x[:, t - 1] + noise[:, t]
    if shift is not None:
        x += np.arange(num_chains)[:, None, None] * np.asarray(shift)
    return x.astype(np.float32)


# Fixed arrays exercising every branch of the rank and Geyer code: an odd number of draws
# (the middle one is dropped when splitting) and a single chain; per coordinate, moderate
# autocorrelation, chains with shifted means, many ties (rounded values) and strong
# autocorrelation (the Geyer sum is truncated late).
CASES = {"three-chains": (3, 101), "one-chain": (1, 80)}


def case(name):
    chains, draws = CASES[name]
    x = ar1(chains, draws, 4, 0.5, seed=len(name), shift=[0.0, 0.4, 0.0, 0.0])
    x[..., 2] = np.round(x[..., 2])
    x[..., 3] = ar1(chains, draws, 1, 0.95, seed=draws)[..., 0]
    return x


# --- NumPy references ----------------------------------------------------------------------


def np_split_rhat(x):
    half = x.shape[1] // 2
    halves = np.concatenate([x[:, :half], x[:, x.shape[1] - half :]], axis=0).astype(float)
    n = half
    w = halves.var(axis=1, ddof=1).mean(axis=0)
    b = n * halves.mean(axis=1).var(axis=0, ddof=1)
    return np.sqrt(((n - 1) / n * w + b / n) / w)


def np_nested_rhat(x, size):
    x = x.astype(float)
    k = x.shape[0] // size
    means = x.mean(axis=1)
    out = []
    for j in range(x.shape[2]):
        super_means, within = [], []
        for s in range(k):
            chains = x[s * size : (s + 1) * size, :, j]
            super_means.append(chains.mean())
            b = means[s * size : (s + 1) * size, j].var(ddof=1) if size > 1 else 0.0
            w = chains.var(axis=1, ddof=1).mean() if x.shape[1] > 1 else 0.0
            within.append(b + w)
        out.append(np.sqrt(1 + np.var(super_means, ddof=1) / np.mean(within)))
    return np.array(out)


# --- against ArviZ -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def az():
    with warnings.catch_warnings():  # ArviZ announces its refactor on import
        warnings.simplefilter("ignore", FutureWarning)
        return pytest.importorskip("arviz")


@pytest.mark.parametrize("name", list(CASES))
def test_matches_arviz(az, name):
    x = case(name)
    data = az.convert_to_dataset(x.astype(float))
    # float32 here vs float64 in ArviZ.
    np.testing.assert_allclose(dg.ess(x), az.ess(data, method="bulk").x.values, rtol=2e-3)
    # ArviZ 1.x computes the tail ESS otherwise than ArviZ 0.x (up to 2x apart on these
    # draws, bulk and R-hat agree): ours follows 0.x; which is right is an open question.
    if int(az.__version__.split(".")[0]) < 1:
        tail = az.ess(data, method="tail").x.values
        np.testing.assert_allclose(dg.ess(x, "tail"), tail, rtol=2e-3)
    if x.shape[0] > 1:  # ArviZ requires two chains for R-hat
        np.testing.assert_allclose(dg.rhat(x), az.rhat(data, method="rank").x.values, rtol=1e-4)
        np.testing.assert_allclose(
            dg.split_rhat(x), az.rhat(data, method="split").x.values, rtol=1e-4
        )


@pytest.mark.parametrize("name", list(CASES))
def test_split_rhat_matches_numpy(name):
    x = case(name)
    np.testing.assert_allclose(dg.split_rhat(x), np_split_rhat(x), rtol=1e-5)


@pytest.mark.parametrize("chains,draws,size", [(12, 30, 3), (8, 1, 2), (6, 5, 1), (64, 1, 8)])
def test_nested_rhat_matches_numpy(chains, draws, size):
    x = ar1(chains, draws, 2, 0.3, seed=chains + draws, shift=[0.0, 0.1])
    np.testing.assert_allclose(dg.nested_rhat(x, size), np_nested_rhat(x, size), rtol=1e-5)


def test_nested_rhat_errors():
    x = np.zeros((10, 4, 2), np.float32)
    with pytest.raises(enn.EnsembleError, match="not divisible"):
        dg.nested_rhat(x, 4)
    with pytest.raises(enn.EnsembleError, match="at least 2"):
        dg.nested_rhat(x, 10)
    with pytest.raises(enn.EnsembleError, match="not divisible"):
        dg.nested_rhat_from_moments(x[:, 0], x[:, 0], 4, 3)


def test_bad_inputs():
    with pytest.raises(enn.EnsembleError, match="at least 4 draws"):
        dg.rhat(np.zeros((4, 3)))
    with pytest.raises(enn.EnsembleError, match="num_chains, num_draws"):
        dg.ess(np.zeros(10))
    with pytest.raises(enn.EnsembleError, match="kind"):
        dg.ess(np.zeros((2, 10)), kind="median")


# --- behaviour -----------------------------------------------------------------------------


def test_rhat_iid_near_one_and_shifted_chains_flagged():
    x = np.asarray(jax.random.normal(jax.random.key(0), (8, 400, 2)))
    for fn in (dg.rhat, dg.split_rhat):
        assert np.all(np.abs(fn(x) - 1) < 0.01)
    shifted = x + np.array([0.0, 1.0])[None, None] * (np.arange(8) % 2)[:, None, None]
    for fn in (dg.rhat, dg.split_rhat):
        r = fn(shifted)
        assert r[0] < 1.01 and r[1] > 1.1
    # Chains agreeing in location but not in scale: only the folded (tail) part sees it.
    scaled = x * np.where(np.arange(8) % 2, 3.0, 1.0)[:, None, None]
    assert np.all(dg.rhat(scaled) > 1.1)


def test_nested_rhat_many_short_chains():
    x = np.array(jax.random.normal(jax.random.key(1), (1024, 1, 2)))
    # Converged: B / W ~ 1 / (chains per superchain * draws), so nR-hat ~ sqrt(1 + 1/32).
    np.testing.assert_allclose(dg.nested_rhat(x, 32), np.sqrt(1 + 1 / 32), atol=0.015)
    # Superchains that still remember different starting points.
    x[..., 1] += np.repeat(np.arange(32) * 0.3, 32)[:, None]
    r = dg.nested_rhat(x, 32)
    assert r[0] < 1.04 and r[1] > 1.1


def test_ess_iid_and_autocorrelated():
    # Coordinate 0 iid, coordinate 1 AR(1) with rho = 0.5, whose integrated
    # autocorrelation time is (1 + rho) / (1 - rho) = 3.
    x = ar1(4, 1200, 2, 0.5, seed=3)
    x[..., 0] = np.asarray(jax.random.normal(jax.random.key(2), (4, 1200)))
    np.testing.assert_allclose(dg.ess(x), [4800, 1600], rtol=0.2)
    # The tail indicators of an AR(1) chain are less autocorrelated than the chain.
    tail = dg.ess(x, "tail")
    assert abs(tail[0] - 4800) < 0.2 * 4800 and 1600 < tail[1] < tail[0]
    assert np.all(dg.ess(np.ones((2, 10, 1), np.float32)) == 20)  # constant: every draw


def test_bias_squared_matches_numpy():
    rng = np.random.default_rng(0)
    est, ref, var = rng.normal(size=(5, 7)), rng.uniform(1, 2, 7), rng.uniform(1, 3, 7)
    b2 = (est - ref) ** 2 / var
    b2_max, b2_mean = dg.bias_squared(est, ref, var)
    np.testing.assert_allclose(b2_max, b2.max(-1), rtol=1e-5)
    np.testing.assert_allclose(b2_mean, b2.mean(-1), rtol=1e-5)
    assert b2_max.shape == (5,)


# --- moment versions agree with draw versions ----------------------------------------------


@pytest.mark.parametrize("draws", [50, 51])
def test_split_rhat_from_moments(draws):
    x = case("three-chains")[:, :draws]
    half = draws // 2
    halves = np.concatenate([x[:, :half], x[:, draws - half :]], axis=0)
    r = dg.split_rhat_from_moments(halves.mean(1), halves.var(1, ddof=1), half)
    np.testing.assert_allclose(r, dg.split_rhat(x), rtol=1e-5)


@pytest.mark.parametrize("draws", [1, 7])
def test_nested_rhat_from_moments(draws):
    x = ar1(16, draws, 3, 0.2, seed=4, shift=[0.0, 0.05, 0.0])
    # Unbiased variances, as a Welford accumulator gives (NaN for one draw: ignored).
    var = x.var(1, ddof=1) if draws > 1 else np.full_like(x[:, 0], np.nan)
    r = dg.nested_rhat_from_moments(x.mean(1), var, draws, 4)
    np.testing.assert_allclose(r, dg.nested_rhat(x, 4), rtol=1e-5)
    traced = jax.jit(dg.nested_rhat_from_moments, static_argnums=3)(
        x.mean(1), var, jnp.int32(draws), 4
    )
    np.testing.assert_allclose(traced, r, rtol=1e-6)


def test_ess_from_moments():
    # Many chains, as the estimator assumes; iid and autocorrelated.
    x = np.asarray(jax.random.normal(jax.random.key(5), (256, 150, 1)))
    y = ar1(256, 150, 1, 0.5, seed=6)
    for draws, expected in ((x, 256 * 150), (y, 256 * 150 / 3)):
        from_moments = dg.ess_from_moments(draws.mean(1), draws.var(1, ddof=1), draws.shape[1])
        np.testing.assert_allclose(from_moments, expected, rtol=0.2)
        np.testing.assert_allclose(from_moments, dg.ess(draws), rtol=0.2)
    # Identical chains count every draw (not capped at the draws otherwise: see
    # tests/samplers/driver/test_summary_table.py).
    same = np.zeros((8, 1), np.float32)
    assert dg.ess_from_moments(same, same, 5) == 40


# --- jit and sharding ----------------------------------------------------------------------


def all_statistics(x):
    """Every statistic of `(8, 20, event)` draws, in one program (one compilation)."""
    halves = jnp.concatenate([x[:, :10], x[:, 10:]])
    return {
        "rhat": dg.rhat(x),
        "split_rhat": dg.split_rhat(x),
        "nested_rhat": dg.nested_rhat(x, 2),
        "ess_bulk": dg.ess(x),
        "ess_tail": dg.ess(x, "tail"),
        "split_rhat_from_moments": dg.split_rhat_from_moments(
            halves.mean(1), halves.var(1, ddof=1), 10
        ),
        "nested_rhat_from_moments": dg.nested_rhat_from_moments(x.mean(1), x.var(1, ddof=1), 20, 2),
        "ess_from_moments": dg.ess_from_moments(x.mean(1), x.var(1, ddof=1), 20),
    }


def test_jit_sharded_matches_unsharded(mesh):
    x = ar1(8, 20, 3, 0.5, seed=7, shift=[0.0, 0.2, 0.0])
    expected = jax.jit(all_statistics)(x)
    sharded = jax.device_put(x, NamedSharding(mesh, P("chains")))
    got = jax.jit(all_statistics)(sharded)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # The eager entry points accept sharded draws too.
    np.testing.assert_allclose(dg.rhat(sharded), expected["rhat"], rtol=1e-5)
