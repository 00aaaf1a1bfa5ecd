"""Targets: log densities against NumPy formulas, exact samples against the reference
moments, and their layout as broadcast data."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import ensemblenn as enn
from samplers import targets as tg

LOG_2PI = math.log(2 * math.pi)


def np_normal(x, mean=0.0, var=1.0):
    return -0.5 * ((x - mean) ** 2 / var + np.log(2 * np.pi * var))


# Independent float64 formulas of each log density, from the textbook definitions.


def np_icg(t, x):
    variances = np.asarray(t.variances, float)
    rotation = np.eye(t.dim) if t.rotation is None else np.asarray(t.rotation, float)
    cov = rotation @ np.diag(variances) @ rotation.T
    _, logdet = np.linalg.slogdet(2 * np.pi * cov)
    return -0.5 * x @ np.linalg.solve(cov, x) - 0.5 * logdet


def np_banana(t, x):
    return np_normal(x[0], 0, 100.0) + np_normal(x[1], 0.03 * (x[0] ** 2 - 100), 1.0)


def np_rosenbrock(t, x):
    k = t.num_pairs
    return sum(np_normal(x[i], 1.0) + np_normal(x[k + i], x[i] ** 2, 0.1) for i in range(k))


def np_funnel(t, x):
    return np_normal(x[0], 0.0, 9.0) + sum(np_normal(z, 0.0, np.exp(x[0])) for z in x[1:])


def np_bimodal(t, x):
    d = t.dim
    m = np.zeros(d)
    m[0] = 8.0
    pdf0 = np.exp(-0.5 * x @ x) / (2 * np.pi) ** (d / 2)
    pdf1 = np.exp(-0.5 * (x - m) @ (x - m) / 4.0) / (2 * np.pi * 4.0) ** (d / 2)
    return np.log(0.7 * pdf0 + 0.3 * pdf1)


def np_logistic(t, x):
    """Also vectorized: `x` may be `(num_points, dim)`."""
    X, y = np.asarray(t.X, float), np.asarray(t.y, float)
    p = 1 / (1 + np.exp(-x @ X.T))
    return np_normal(x).sum(-1) + np.sum(y * np.log(p) + (1 - y) * np.log(1 - p), axis=-1)


TARGETS = {
    "icg": (lambda: tg.IllConditionedGaussian(6, 1000.0), np_icg),
    "icg-rotated": (lambda: tg.IllConditionedGaussian(6, 1000.0, rotated=True, seed=3), np_icg),
    "banana": (tg.Banana, np_banana),
    "rosenbrock": (lambda: tg.Rosenbrock(num_pairs=3), np_rosenbrock),
    "funnel": (lambda: tg.NealsFunnel(5), np_funnel),
    "bimodal": (
        lambda: tg.BimodalGaussian(dim=4, separation=8.0, weight=0.7, scale=2.0),
        np_bimodal,
    ),
    "logistic": (lambda: tg.LogisticRegression(num_data=50, num_features=3, seed=1), np_logistic),
}


@pytest.fixture(scope="module", params=list(TARGETS))
def target_and_formula(request):
    make, formula = TARGETS[request.param]
    return request.param, make(), formula


def test_logdensity_matches_formula_and_gradients_finite(target_and_formula):
    name, target, formula = target_and_formula
    rng = np.random.default_rng(0)
    points = rng.normal(size=(4, target.dim)) * 1.5
    values = jax.vmap(target)(jnp.asarray(points, jnp.float32))
    expected = [formula(target, p) for p in points]
    np.testing.assert_allclose(values, expected, rtol=2e-5, atol=1e-3, err_msg=name)
    starts = jax.vmap(target.initial_position)(jax.random.split(jax.random.key(1), 8))
    assert starts.shape == (8, target.dim)
    grads = jax.vmap(jax.grad(target))(jnp.concatenate([jnp.asarray(points), starts]))
    assert bool(jnp.isfinite(grads).all()), name


def test_partitions_as_broadcast_data(target_and_formula):
    name, target, _ = target_and_formula
    operands, specs, _ = enn.partition(target, strict=True)  # strict: every array has a role
    spec_leaves = jax.tree.leaves(specs)
    assert spec_leaves and all(spec == P() for spec in spec_leaves), name
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(operands))
    assert enn.role_of(target, "reference") is enn.BROADCAST


@pytest.mark.parametrize("name", ["icg-rotated", "banana", "rosenbrock", "funnel", "bimodal"])
def test_exact_samples_reproduce_reference(name):
    """200k exact draws (fixed key): E[x], E[x²] and Var[x²] of `observable(x)` within 5
    Monte Carlo standard errors of the reference, the errors estimated from the draws."""
    target = TARGETS[name][0]()
    n = 200_000
    draws = jax.vmap(lambda k: target.observable(target.sample(k)))(
        jax.random.split(jax.random.key(0), n)
    )
    x = np.asarray(draws, float)
    ref = jax.tree.map(lambda a: np.asarray(a, float), target.reference)
    sq = x**2
    centred_sq = (sq - sq.mean(0)) ** 2
    checks = [
        (x.mean(0), ref.mean, x.std(0)),
        (sq.mean(0), ref.second_moment, sq.std(0)),
        (centred_sq.mean(0), ref.second_moment_var, centred_sq.std(0)),
    ]
    for estimate, reference, spread in checks:
        assert np.all(np.abs(estimate - reference) < 5 * spread / math.sqrt(n)), (
            name,
            estimate,
            reference,
        )


def test_reference_values():
    # The constants quoted for the benchmarks; ours are exact, theirs Monte Carlo.
    banana = tg.Banana().reference
    np.testing.assert_allclose(banana.second_moment, [100, 19], rtol=1e-6)
    np.testing.assert_allclose(banana.second_moment_var, [20000, 4600.898], rtol=3e-3)
    rosen = tg.Rosenbrock().reference
    assert rosen.mean.shape == (36,)
    pick = lambda a: np.asarray(a)[[0, 18]]  # one x and one y coordinate
    np.testing.assert_allclose(pick(rosen.mean), [1, 2], rtol=1e-6)
    np.testing.assert_allclose(pick(rosen.second_moment), [2, 10.10017429], rtol=1e-4)
    np.testing.assert_allclose(pick(rosen.second_moment_var), [6.00036273, 668.69693635], rtol=2e-3)
    icg = tg.IllConditionedGaussian(5, 1e4, rotated=True, seed=1)
    rotation = np.asarray(icg.rotation, float)
    np.testing.assert_allclose(rotation @ rotation.T, np.eye(5), atol=1e-5)
    cov = rotation @ np.diag(np.logspace(0, 4, 5)) @ rotation.T
    np.testing.assert_allclose(icg.reference.second_moment, np.diag(cov), rtol=1e-4)
    np.testing.assert_allclose(icg.reference.second_moment_var, 2 * np.diag(cov) ** 2, rtol=1e-4)


def test_funnel_gaussianize():
    funnel = tg.NealsFunnel(3)
    x = jnp.array([2.0, 1.0, -3.0])
    np.testing.assert_allclose(
        funnel.gaussianize(x), [2 / 3, np.exp(-1), -3 * np.exp(-1)], rtol=1e-6
    )


def test_logistic_minibatch_is_unbiased():
    target = tg.LogisticRegression(num_data=60, num_features=3, seed=2)
    x = jnp.array([0.3, -1.0, 2.0])
    full = target(x)
    np.testing.assert_allclose(target.minibatch_logdensity(x, jnp.arange(60)), full, rtol=1e-6)
    # The average over a partition into equal batches is exactly the full log density.
    batches = jnp.arange(60).reshape(6, 10)
    estimates = jax.vmap(lambda idx: target.minibatch_logdensity(x, idx))(batches)
    np.testing.assert_allclose(estimates.mean(), full, rtol=1e-5)
    assert target.num_data == 60 and target.X.shape == (60, 3) and target.y.shape == (60,)
    # Same seed, same data.
    again = tg.LogisticRegression(num_data=60, num_features=3, seed=2)
    np.testing.assert_array_equal(again.X, target.X)
    with pytest.raises(NotImplementedError):
        target.sample(jax.random.key(0))


def test_logistic_reference_against_quadrature():
    """Importance-sampling moments vs a dense grid in 2-D (an independent computation)."""
    target = tg.LogisticRegression(num_data=40, num_features=2, seed=3)
    moments = target.compute_reference(50_000, jax.random.key(0))
    draws, log_w = target._importance_sample(50_000, jax.random.key(0), 5)
    w = np.exp(np.asarray(log_w, float) - float(log_w.max()))
    assert w.sum() ** 2 / (w**2).sum() > 0.5 * 50_000  # Kish efficiency of the proposal

    mode, cov = (np.asarray(a, float) for a in target.laplace())
    sd = np.sqrt(np.diag(cov))
    grid = [np.linspace(m - 8 * s, m + 8 * s, 301) for m, s in zip(mode, sd, strict=True)]
    points = np.stack(np.meshgrid(*grid, indexing="ij"), -1).reshape(-1, 2)
    logp = np_logistic(target, points)
    p = np.exp(logp - logp.max())
    p /= p.sum()
    mean, second = p @ points, p @ points**2
    second_var = p @ (points**2 - second) ** 2
    # IS error with ~4e4 effective draws: a few 1e-3 of the posterior scale.
    np.testing.assert_allclose(moments.mean, mean, atol=0.02 * sd.max())
    np.testing.assert_allclose(moments.second_moment, second, rtol=0.02)
    np.testing.assert_allclose(moments.second_moment_var, second_var, rtol=0.08)


def test_targets_inside_ensemble_map(mesh):
    """Broadcast data enter shard_map as operands: works with closures forbidden."""
    target = tg.LogisticRegression(num_data=30, num_features=4)
    positions = jax.random.normal(jax.random.key(0), (8, 4))
    value_and_grad = enn.ensemble_map(
        lambda t, x: jax.value_and_grad(t)(x),
        mesh=mesh,
        in_roles=(None, enn.PER_CHAIN),
        closures="error",
    )
    values, grads = value_and_grad(target, positions)
    np.testing.assert_allclose(values, jax.vmap(target)(positions), rtol=1e-5)
    assert grads.shape == (8, 4)
