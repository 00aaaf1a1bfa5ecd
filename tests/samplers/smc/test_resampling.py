"""samplers.smc resampling: unbiased, equal to a numpy reference, invariant to devices."""

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ensemblenn as enn
import samplers
from samplers.smc import SCHEMES, ancestors, resample
from tests.compile_counter import counting

SORTED_SCHEMES = ("systematic", "stratified", "residual")


def reference(key, log_weights, scheme):
    """Textbook resampling in float64 numpy, with the same uniforms as the library:
    ancestor of slot k = the first particle whose cumulative weight exceeds point k."""
    n = len(log_weights)
    lw = np.asarray(log_weights, np.float64)
    w = np.exp(lw - lw.max())
    w /= w.sum()
    cum = np.cumsum(w)

    def search(cum, points):
        return np.minimum(np.searchsorted(cum, points, side="right"), len(cum) - 1)

    if scheme in ("systematic", "residual"):
        u = float(jax.random.uniform(key, ()))
    elif scheme == "multinomial":  # sorted uniforms from n + 1 exponential spacings
        spacings = np.cumsum(-np.log1p(-np.asarray(jax.random.uniform(key, (n + 1,)), np.float64)))
        u = spacings[:n] / spacings[n]
    else:
        u = np.asarray(jax.random.uniform(key, (n,)), np.float64)
    if scheme in ("systematic", "stratified"):
        return search(cum, (np.arange(n) + u) / n)
    if scheme == "multinomial":
        return search(cum, u)
    floors = np.floor(n * w)
    rest = n - int(floors.sum())
    residual = n * w - floors
    drawn = search(np.cumsum(residual) / residual.sum(), (np.arange(rest) + u) / rest)
    counts = floors.astype(int) + np.bincount(drawn, minlength=n)
    return np.repeat(np.arange(n), counts)


def spread_log_weights(n, seed, impossible=5):
    rng = np.random.default_rng(seed)
    lw = 2.0 * rng.standard_normal(n)
    lw[rng.choice(n, impossible, replace=False)] = -np.inf
    return jnp.asarray(lw, jnp.float32)


def offspring(ancestor_rows, n):
    a = np.asarray(ancestor_rows)
    return np.stack([np.bincount(row, minlength=n) for row in a])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_same_ancestors_as_numpy_reference(scheme):
    n = 64
    for seed in range(4):
        lw = spread_log_weights(n, seed)
        for k in range(3):
            key = jax.random.key(100 * seed + k)
            got = np.asarray(ancestors(key, lw, scheme))
            assert got.dtype == np.int32 and got.shape == (n,)
            np.testing.assert_array_equal(got, reference(key, lw, scheme), err_msg=scheme)


def standard_error(counts, expected, scheme):
    """The standard error of the mean offspring counts over the draws (rows).

    Multinomial counts have the known variance N w (1 - w). For the others, the empirical
    variance, but never below f (1 - f) with f the fractional part of N w: the least
    variance of any integer count with that mean (a rare particle seen once or never in
    the draws would otherwise get a tiny error bar).
    """
    n = counts.shape[1]
    if scheme == "multinomial":
        variance = expected * (1 - expected / n)
    else:
        f = expected - np.floor(expected)
        variance = np.maximum(counts.var(0), f * (1 - f))
    se = np.sqrt(variance / counts.shape[0])
    return np.where(expected > 0, se, 1.0)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_offspring_counts_unbiased(scheme):
    n, draws = 32, 4000
    lw = spread_log_weights(n, seed=7, impossible=3)
    w = np.exp(np.asarray(lw, np.float64) - np.max(lw))
    w /= w.sum()
    keys = jax.random.split(jax.random.key(1), draws)
    rows = jax.jit(jax.vmap(lambda k: ancestors(k, lw, scheme)))(keys)
    counts = offspring(rows, n)
    assert (counts.sum(1) == n).all()
    assert (counts[:, w == 0] == 0).all()  # an impossible particle is never an ancestor
    # The mean count is N w to within its Monte Carlo error (5 standard errors).
    z = np.abs(counts.mean(0) - n * w) / standard_error(counts, n * w, scheme)
    assert z.max() < 5, (scheme, z.max())
    lo, hi = np.floor(n * w), np.ceil(n * w)
    if scheme in ("systematic", "residual"):  # the theory guarantees floor/ceil
        assert (counts >= lo).all() and (counts <= hi).all()
    if scheme == "stratified":  # one stratum either side can be lost or gained
        assert (counts >= lo - 1).all() and (counts <= hi + 1).all()


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES)
def test_offspring_counts_unbiased_many_particles(scheme):
    n, draws = 1000, 3000
    lw = spread_log_weights(n, seed=11, impossible=50)
    w = np.exp(np.asarray(lw, np.float64) - np.max(lw))
    w /= w.sum()
    keys = jax.random.split(jax.random.key(2), draws)
    rows = jax.jit(jax.vmap(lambda k: ancestors(k, lw, scheme)))(keys)
    counts = offspring(rows, n)
    z = np.abs(counts.mean(0) - n * w) / standard_error(counts, n * w, scheme)
    assert z.max() < 6, (scheme, z.max())  # 1000 particles: the max of 1000 |z|
    # The overall fit: the squared z's average to ~1 for unbiased counts (0.7-1.2 over
    # seeds: a systematic scheme's counts are correlated, so the average varies more).
    assert np.mean(z[w > 0] ** 2) < 1.5
    if scheme in ("systematic", "residual"):
        assert (counts >= np.floor(n * w)).all() and (counts <= np.ceil(n * w)).all()


@pytest.mark.parametrize("scheme", ["systematic", "multinomial"])
def test_resample_inside_ensemble_map(mesh, scheme):
    n = 16
    lw = spread_log_weights(n, seed=3, impossible=4)
    particles = {
        "x": jnp.arange(n * 3, dtype=jnp.float32).reshape(n, 3),
        "tag": 10 * jnp.arange(n, dtype=jnp.int32),
    }
    step = enn.ensemble_map(
        lambda k, w, p: resample(k, w, p, scheme=scheme),
        mesh=mesh,
        in_roles=(enn.BROADCAST, enn.PER_CHAIN, enn.PER_CHAIN),
    )
    for seed in range(2):
        key = jax.random.key(seed)
        new, ancestor = step(key, lw, particles)
        expected = np.asarray(ancestors(key, lw, scheme))
        assert ancestor.dtype == jnp.int32 and ancestor.shape == (n,)
        np.testing.assert_array_equal(ancestor, expected)
        np.testing.assert_array_equal(new["x"], np.asarray(particles["x"])[expected])
        np.testing.assert_array_equal(new["tag"], np.asarray(particles["tag"])[expected])
        assert new["x"].dtype == jnp.float32 and new["tag"].dtype == jnp.int32


def test_resample_under_jit_with_numpy_inputs(mesh):
    lw = np.array([-np.inf, 0.0, -np.inf, np.log(3), -np.inf, -np.inf, np.log(2), np.log(2)])
    lw = lw.astype(np.float32)
    x = np.arange(8, dtype=np.float32)
    step = enn.ensemble_map(
        lambda k, w, p: resample(k, w, p, scheme="residual"),
        mesh=mesh,
        in_roles=(enn.BROADCAST, enn.PER_CHAIN, enn.PER_CHAIN),
    )
    key = jax.random.key(4)
    eager, jitted = step(key, lw, x), jax.jit(step)(key, lw, x)
    expected = np.asarray(ancestors(key, lw, "residual"))
    # residual: floor(8 w) = 1, 3, 2, 2 copies are certain, nothing is left to draw.
    np.testing.assert_array_equal(expected, [1, 3, 3, 3, 6, 6, 7, 7])
    for new, ancestor in (eager, jitted):
        np.testing.assert_array_equal(ancestor, expected)
        np.testing.assert_array_equal(new, x[expected])


def test_bitwise_same_on_1_2_4_8_devices(tmp_path):
    program = Path(__file__).parents[2] / "programs" / "resampling_invariance.py"
    runs = {
        d: subprocess.Popen([sys.executable, str(program), str(d), str(tmp_path / f"{d}.npz")])
        for d in (1, 2, 4, 8)
    }
    for d, run in runs.items():
        assert run.wait(timeout=300) == 0, f"the program failed on {d} devices"
    out = {d: np.load(tmp_path / f"{d}.npz") for d in runs}
    assert len(out[1].files) == 2 * len(SCHEMES) * 3 * 5
    for d in (2, 4, 8):
        for name in out[1].files:
            assert out[d][name].tobytes() == out[1][name].tobytes(), (name, d)
    for name in out[1].files:  # inside ensemble_map = the pure function
        if name.endswith("_ancestor"):
            pure = out[1][name.replace("_ancestor", "_pure")]
            np.testing.assert_array_equal(out[1][name], pure, err_msg=name)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_all_weight_on_one_particle(scheme):
    assert ancestors(jax.random.key(0), jnp.zeros(1), scheme).tolist() == [0]  # one particle
    n = 12
    for winner in (0, 5, n - 1):
        lw = jnp.full(n, -jnp.inf).at[winner].set(-3.0)
        got = ancestors(jax.random.key(winner), lw, scheme)
        np.testing.assert_array_equal(got, np.full(n, winner))
        # Finite but overwhelming: exp(-200) underflows to zero in float32.
        lw = jnp.full(n, -200.0).at[winner].set(0.0)
        np.testing.assert_array_equal(ancestors(jax.random.key(1), lw, scheme), winner)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_infinite_and_nan_log_weights(scheme):
    key = jax.random.key(3)
    # -inf and NaN are weight zero; the rest equal: each finite particle once or so.
    lw = jnp.array([-jnp.inf, 0.0, jnp.nan, 0.0, -jnp.inf, 0.0, 0.0, -jnp.inf])
    got = np.asarray(ancestors(key, lw, scheme))
    assert set(got.tolist()) <= {1, 3, 5, 6}
    if scheme in SORTED_SCHEMES:
        np.testing.assert_array_equal(np.bincount(got, minlength=8)[[1, 3, 5, 6]], 2)
    # Every weight -inf: taken as uniform, so systematic keeps every particle.
    got = np.asarray(ancestors(key, jnp.full(8, -jnp.inf), scheme))
    assert got.min() >= 0 and got.max() < 8
    if scheme in ("systematic", "residual"):
        np.testing.assert_array_equal(got, np.arange(8))
    # +inf shares all the weight between the +inf particles.
    got = np.asarray(ancestors(key, jnp.array([0.0, jnp.inf, 5.0, jnp.inf]), scheme))
    assert set(got.tolist()) <= {1, 3}


def test_sorted_and_huge_log_weights():
    # Log weights far from zero are normalised by their maximum, not exponentiated raw.
    lw = jnp.array([1000.0, 1000.0 + np.log(3.0), 999.0, -1000.0])
    for scheme in SCHEMES:
        got = np.asarray(ancestors(jax.random.key(0), lw, scheme))
        assert (np.diff(got) >= 0).all() and 3 not in got


def test_bad_scheme_is_a_clear_error_before_compiling():
    lw, key, x = jnp.zeros(4), jax.random.key(0), jnp.zeros((4, 2))
    step = enn.ensemble_map(
        lambda k, w, x: resample(k, w, x, scheme="Systematic"),
        in_roles=(enn.BROADCAST, enn.PER_CHAIN, enn.PER_CHAIN),
    )
    with counting() as compiles:
        with pytest.raises(samplers.SamplerError) as err:
            ancestors(key, lw, scheme="sytematic")
        message = str(err.value)
        assert "scheme='sytematic'" in message and "'residual'" in message
        assert "fix:" in message
        with pytest.raises(samplers.SamplerError, match="scheme=None"):
            ancestors(key, lw, scheme=None)
        with pytest.raises(samplers.SamplerError, match="(?s)scheme='Systematic'.*fix:"):
            step(key, lw, x)  # raised while the body is traced, before XLA sees it
    # Only the placement of the inputs on the mesh compiled, no program of ours.
    assert not [n for n in compiles.names if "_execute" in n or "ancestors" in n], compiles.names
