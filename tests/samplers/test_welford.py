"""samplers.welford.Welford: the running moments LAPS and ChainMoments share."""

import jax
import jax.numpy as jnp
import numpy as np

import samplers
from samplers.welford import Welford


def _scan(xs):
    def body(w, x):
        return w.update(x), None

    return jax.lax.scan(body, Welford.zeros_like(xs[0]), xs)[0]


def test_moments_of_draws_far_from_the_origin():
    """Mean and unbiased variance of 500 float32 draws centred at 1000 (where a sum of
    squares would cancel) agree with float64 numpy to float32 rounding."""
    xs = jax.random.normal(jax.random.key(0), (500, 6)) * jnp.arange(1.0, 7.0) + 1000.0
    w = jax.jit(_scan)(xs)
    x64 = np.asarray(xs, np.float64)
    assert int(w.count) == 500
    np.testing.assert_allclose(w.mean, x64.mean(0), rtol=1e-6)
    np.testing.assert_allclose(w.variance(), x64.var(0, ddof=1), rtol=1e-3)


def test_chain_moments_halves_are_welfords_to_the_bit():
    """Each half of `ChainMoments` is a `Welford` of that half's draws, bit for bit."""
    xs = jax.random.normal(jax.random.key(1), (40, 5)) * 3.0 + 7.0

    def moments(xs):
        def body(m, tx):
            t, x = tx
            return m.update(x, (t >= 25).astype(jnp.int32)), None

        return jax.lax.scan(body, samplers.ChainMoments.zeros(5), (jnp.arange(40), xs))[0]

    m = jax.jit(moments)(xs)
    for half, part in ((0, xs[:25]), (1, xs[25:])):
        w = jax.jit(_scan)(part)
        assert int(m.count[half]) == int(w.count)
        np.testing.assert_array_equal(m.mean[half], w.mean)
        np.testing.assert_array_equal(m.m2[half], w.m2)
