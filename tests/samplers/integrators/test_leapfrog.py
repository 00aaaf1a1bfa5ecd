"""The leapfrog integrator and the Gaussian momentum (samplers.integrators): reversible,
second order, the scalar, diagonal and dense mass forms in agreement, per-chain traced step
counts, and momenta with the mass matrix's covariance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from samplers import integrators
from samplers.integrators import kinetic_energy, sample_momentum, value_and_grad

COV = jnp.array([[1.0, 0.8], [0.8, 2.0]])
PRECISION = jnp.linalg.inv(COV)


def quartic(x):
    """A non-Gaussian log-density with a non-linear gradient."""
    return -0.25 * jnp.sum(x**4) - 0.5 * jnp.sum(x**2) + 0.3 * x[0] * x[-1]


def test_leapfrog_is_reversible_second_order_and_mass_forms_agree():
    vg = value_and_grad(quartic)
    leapfrog = jax.jit(integrators.leapfrog, static_argnums=0)  # traced step size and count
    x = jnp.array([0.5, -1.0, 0.3])
    p = jnp.array([1.0, 0.2, -0.7])
    logp, grad = vg(x)
    diag = jnp.array([0.5, 1.0, 2.0])

    x1, p1, logp1, g1 = leapfrog(vg, x, p, grad, 0.1, diag, 20)
    x0, p0, _, _ = leapfrog(vg, x1, -p1, g1, 0.1, diag, 20)
    np.testing.assert_allclose(x0, x, atol=1e-5)
    np.testing.assert_allclose(-p0, p, atol=1e-5)
    np.testing.assert_allclose(logp1, quartic(x1), rtol=1e-6)

    # Diagonal and the same dense matrix integrate identically.
    x2, p2, _, _ = leapfrog(vg, x, p, grad, 0.1, jnp.diag(diag), 20)
    np.testing.assert_allclose(x2, x1, rtol=1e-5)
    np.testing.assert_allclose(p2, p1, rtol=1e-5)

    # Energy error over a fixed time falls ~4x when the step halves (second order).
    def energy_error(eps, n):
        xe, pe, lpe, _ = leapfrog(vg, x, p, grad, eps, diag, n)
        return abs(float(kinetic_energy(pe, diag) - lpe - kinetic_energy(p, diag) + logp))

    ratio = energy_error(0.1, 10) / energy_error(0.05, 20)
    assert 3.0 < ratio < 5.0, ratio


def test_leapfrog_counts_traced_per_chain_and_zero_steps():
    """A traced count, different per chain under vmap (HMC's jitter), gives each chain what
    its own Python-int count gives; 0 steps returns the start, the given log-density
    included; the loop carries position and momentum only (the gradient fuses into the
    kick, and the log-density is computed once, at the end)."""
    vg = value_and_grad(quartic)
    x = jnp.array([0.5, -1.0, 0.3])
    p = jnp.array([1.0, 0.2, -0.7])
    logp, grad = vg(x)
    counts = jnp.array([0, 1, 2, 7])
    batched = jax.jit(
        jax.vmap(lambda n: integrators.leapfrog(vg, x, p, grad, 0.1, 1.0, n, logdensity=logp))
    )(counts)
    for i, n in enumerate(counts.tolist()):
        alone = integrators.leapfrog(vg, x, p, grad, 0.1, 1.0, n, logdensity=logp)
        for got, want in zip(batched, alone, strict=True):
            np.testing.assert_allclose(got[i], want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(batched[0][0], x)
    assert float(batched[2][0]) == float(logp)
    _, g = vg(batched[0][3])
    np.testing.assert_allclose(batched[3][3], g, rtol=1e-6)
    jaxpr = jax.make_jaxpr(lambda: integrators.leapfrog(vg, x, p, grad, 0.1, 1.0, 10))()
    (loop,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name in ("scan", "while")]
    carried = [v for v in loop.outvars if v.aval.shape == (3,)]
    assert len(carried) == 2, loop


@pytest.mark.parametrize("form", ["scalar", "diagonal", "dense"])
def test_momentum_covariance_is_the_mass_matrix(form):
    inverse_mass = {"scalar": jnp.float32(0.25), "diagonal": jnp.diag(COV), "dense": COV}[form]
    keys = jax.random.split(jax.random.key(4), 20000)
    p = jax.vmap(lambda k: sample_momentum(jnp.zeros(2), inverse_mass, k))(keys)
    mass = {
        "scalar": 4.0 * jnp.eye(2),
        "diagonal": jnp.diag(1 / jnp.diag(COV)),
        "dense": PRECISION,
    }[form]
    np.testing.assert_allclose(jnp.cov(p.T), mass, atol=0.04 * float(jnp.max(mass)))
