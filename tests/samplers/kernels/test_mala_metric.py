"""MALA with a metric: one leapfrog step of HMC, exact on a Gaussian with a diagonal or
dense metric and with a vector step size, and its metric's shape checked up front.

Exactness works as in test_kernels_classic: chains started from exact draws of a
correlated, badly scaled 2-d Gaussian must stay exact after K transitions; each final
moment's Monte Carlo standard error is known, so every moment is a z-score, |z| < 5.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ensemblenn as enn
import samplers
from samplers.integrators import kinetic_energy, leapfrog, value_and_grad

COV = jnp.array([[1.0, 1.8], [1.8, 4.0]])  # variances 1 and 4, correlation 0.9
PRECISION = jnp.linalg.inv(COV)
NUM_CHAINS = 4096
NUM_STEPS = 10


def gaussian(x):
    return -0.5 * x @ PRECISION @ x


def quartic(x):
    """A non-Gaussian log-density with a non-linear gradient."""
    return -0.25 * jnp.sum(x**4) - 0.5 * jnp.sum(x**2) + 0.3 * x[0] * x[-1]


def _chains(kernel, position, key):
    k_init, k_steps = jax.random.split(key)
    state = kernel.init(gaussian, position, k_init)
    return jax.lax.scan(
        lambda s, k: kernel.step(gaussian, s, k), state, jax.random.split(k_steps, NUM_STEPS)
    )


run_chains = enn.ensemble_map(
    _chains, in_roles=(None, enn.PER_CHAIN, enn.PER_CHAIN), out_roles=enn.PER_CHAIN
)


def moment_z_scores(x):
    """z-scores of the sample mean and of E[x_i x_j] (i <= j) against the exact values."""
    x, cov = np.asarray(x, np.float64), np.asarray(COV, np.float64)
    n = x.shape[0]
    z_mean = x.mean(0) / np.sqrt(np.diag(cov) / n)
    products = x[:, :, None] * x[:, None, :]
    z_second = (products.mean(0) - cov) / (products.std(0) / np.sqrt(n))
    return np.concatenate([z_mean, z_second[np.triu_indices(2)]])


@pytest.fixture(scope="module")
def exact_draws():
    return jax.random.multivariate_normal(jax.random.key(0), jnp.zeros(2), COV, (NUM_CHAINS,))


KERNELS = {
    "diagonal": samplers.MALA(step_size=0.4, inverse_mass_matrix=jnp.diag(COV)),
    "dense": samplers.MALA(step_size=0.9, inverse_mass_matrix=COV),
    # Per-coordinate steps in the ratio of the scales: the density must divide each
    # coordinate by its own h (the sum was once divided by the vector h², a wrong target).
    "vector_step": samplers.MALA(step_size=jnp.array([0.3, 0.6])),
    "vector_step_dense": samplers.MALA(step_size=jnp.array([0.9, 0.45]), inverse_mass_matrix=COV),
}


@pytest.mark.parametrize("name", list(KERNELS))
def test_preconditioned_and_vector_step_mala_keep_exact_draws_exact(name, exact_draws):
    kernel = KERNELS[name]
    keys = enn.chain_keys(jax.random.key(1), NUM_CHAINS)
    state, info = run_chains(kernel, exact_draws, keys)
    z = moment_z_scores(state.position)
    assert np.abs(z).max() < 5, (name, z)
    # The chains moved (an always-rejecting kernel would pass trivially)...
    assert 0.3 < float(info.acceptance_rate.mean()) < 1.0, float(info.acceptance_rate.mean())
    assert np.mean(np.any(np.asarray(state.position) != np.asarray(exact_draws), axis=1)) > 0.9
    assert not np.any(np.asarray(info.is_divergent))
    # ... and the state's cache is that of its position.
    logp, grad = jax.vmap(value_and_grad(gaussian))(state.position)
    np.testing.assert_allclose(state.logdensity, logp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state.grad, grad, rtol=1e-5, atol=1e-5)


def test_metric_makes_a_badly_scaled_gaussian_easy(exact_draws):
    """The metric is used: at a step size the identity cannot take on this Gaussian
    (acceptance collapses), the dense metric still accepts most proposals."""
    keys = enn.chain_keys(jax.random.key(2), NUM_CHAINS)
    _, plain = run_chains(samplers.MALA(step_size=1.2), exact_draws, keys)
    _, dense = run_chains(samplers.MALA(step_size=1.2, inverse_mass_matrix=COV), exact_draws, keys)
    assert float(plain.acceptance_rate.mean()) < 0.3 < 0.6 < float(dense.acceptance_rate.mean())


@pytest.mark.parametrize(
    "metric",
    [jnp.array([0.5, 2.0, 1.5]), jnp.array([[2.0, 0.3, 0.1], [0.3, 1.0, 0.2], [0.1, 0.2, 0.7]])],
    ids=["diagonal", "dense"],
)
@pytest.mark.parametrize("step_size", [0.7, jnp.array([0.7, 0.4, 0.9])], ids=["scalar", "vector"])
def test_mala_is_one_leapfrog_step_of_hmc(metric, step_size):
    """Same momentum draw: MALA's proposal is HMC's one-step end point, and its
    Metropolis-Hastings log-ratio is minus HMC's energy change (non-Gaussian target)."""
    mala = samplers.MALA(step_size=step_size, inverse_mass_matrix=metric)
    hmc = samplers.HMC(step_size=step_size, num_integration_steps=1, inverse_mass_matrix=metric)
    vg, zero = value_and_grad(quartic), jnp.int32(0)

    @jax.jit
    def both(key):
        kx, kp = jax.random.split(key)
        x = jax.random.normal(kx, (3,))
        logp, grad = vg(x)
        proposed = mala.proposal(x, grad, zero, kp)
        logp1, grad1 = vg(proposed)
        log_ratio = (
            logp1
            - logp
            + mala.log_proposal_density(x, proposed, grad1, zero)
            - mala.log_proposal_density(proposed, x, grad, zero)
        )
        p0 = hmc.momentum(x, zero, kp)  # HMC's draw from the same key
        x1, p1, logp_hmc, _ = leapfrog(vg, x, p0, grad, step_size, metric, 1)
        energy = kinetic_energy(p1, metric) - logp_hmc - kinetic_energy(p0, metric) + logp
        return proposed, x1, log_ratio, energy

    for key in jax.random.split(jax.random.key(3), 4):
        proposed, x1, log_ratio, energy = both(key)
        np.testing.assert_allclose(proposed, x1, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(-log_ratio, energy, rtol=1e-4, atol=1e-5)
        assert abs(float(energy)) > 1e-3  # a real correction, not 0 = 0


def test_mala_proposal_draws_hmc_momentum():
    """Key for key, the proposal's noise is HMC's momentum draw pushed through `D A p`."""
    metric = jnp.array([[2.0, 0.5], [0.5, 1.0]])
    mala = samplers.MALA(step_size=0.5, inverse_mass_matrix=metric)
    hmc = samplers.HMC(step_size=0.5, num_integration_steps=1, inverse_mass_matrix=metric)
    x, key = jnp.array([0.3, -0.2]), jax.random.key(4)
    moved = mala.proposal(x, jnp.zeros(2), jnp.int32(0), key)
    expected = x + 0.5 * metric @ hmc.momentum(x, jnp.int32(0), key)
    np.testing.assert_allclose(moved, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "metric, fragment",
    [
        (jnp.ones(5), "MALA.inverse_mass_matrix has shape (5,), but the positions have dim 3"),
        (jnp.eye(4), "MALA.inverse_mass_matrix has shape (4, 4), but the positions have dim 3"),
        (jnp.ones((3, 3, 1)), "MALA.inverse_mass_matrix has shape (3, 3, 1)"),
    ],
    ids=["diagonal", "dense", "rank3"],
)
def test_bad_metric_shape_is_named_before_compiling(metric, fragment):
    kernel = samplers.MALA(step_size=0.1, inverse_mass_matrix=metric)
    with pytest.raises(samplers.SamplerError, match="fix:") as err:
        samplers.run(kernel, lambda x: -0.5 * jnp.sum(x**2), jnp.zeros((8, 3)),
                     key=jax.random.key(0), num_steps=2, progress=False)  # fmt: skip
    assert fragment in str(err.value)


def test_bad_metric_values_are_refused_at_construction():
    with pytest.raises(samplers.SamplerError, match="MALA.inverse_mass_matrix must be positive"):
        samplers.MALA(step_size=0.1, inverse_mass_matrix=jnp.array([1.0, -1.0]))
    with pytest.raises(samplers.SamplerTypeError, match="MALA.inverse_mass_matrix must be"):
        samplers.MALA(step_size=0.1, inverse_mass_matrix="identity")


def test_none_metric_is_the_identity():
    logdensity = lambda x: -0.5 * jnp.sum(x**2)  # noqa: E731
    state = samplers.MALA(0.5).init(logdensity, jnp.ones(3), jax.random.key(0))
    a = samplers.MALA(0.5).step(logdensity, state, jax.random.key(1))[0].position
    b = samplers.MALA(0.5, inverse_mass_matrix=None).step(logdensity, state, jax.random.key(1))
    np.testing.assert_array_equal(a, b[0].position)


def test_vector_step_size_is_a_diagonal_metric():
    """`D A D` is all that matters: h = (0.3, 0.6) with the identity makes the same
    transitions as h = 0.3 with A = diag(1, 4), key for key."""
    x = jnp.array([0.4, -1.1])
    vector = samplers.MALA(step_size=jnp.array([0.3, 0.6]))
    metric = samplers.MALA(step_size=0.3, inverse_mass_matrix=jnp.array([1.0, 4.0]))
    state = vector.init(quartic, x, jax.random.key(0))
    for key in jax.random.split(jax.random.key(5), 4):
        (a, info_a), (b, info_b) = (
            vector.step(quartic, state, key),
            metric.step(quartic, state, key),
        )
        np.testing.assert_allclose(a.position, b.position, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(info_a.energy_change, info_b.energy_change, rtol=1e-4, atol=1e-6)
