"""SMC on a NumPyro model (eight schools, non-centred) against a long NUTS run."""

import jax
import numpy as np
import pytest

import samplers

numpyro = pytest.importorskip("numpyro")
dist = pytest.importorskip("numpyro.distributions")

Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0], np.float32)
SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0], np.float32)

# Posterior means from NumPyro 0.22.0's NUTS (jax 0.10.2, CPU, float32): one chain,
# target_accept_prob=0.95, 5000 warmup and 100000 kept draws, seed
# jax.random.key(20261204), the model below. Monte Carlo standard errors (sd / sqrt(ESS),
# NumPyro's effective_sample_size): mu 0.0095, tau 0.011, theta_tilde ~0.0027 each;
# negligible beside the SMC's (~0.1 for mu and tau at 1024 particles).
REFERENCE = {
    "mu": 4.3932,
    "tau": 3.6058,
    "theta_tilde": np.array(
        [0.32299, 0.10086, -0.08829, 0.05981, -0.15966, -0.07253, 0.35408, 0.07832]
    ),
}
REFERENCE_MCSE = {"mu": 0.0095, "tau": 0.011, "theta_tilde": 0.0027}


def eight_schools(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("J", 8):
        theta_tilde = numpyro.sample("theta_tilde", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu + tau * theta_tilde, sigma), obs=y)


@pytest.mark.slow
def test_eight_schools_posterior_means_against_nuts():
    target = samplers.targets.from_numpyro(eight_schools, SIGMA, y=Y)
    smc = samplers.SMC(samplers.HMC(step_size=0.5, num_integration_steps=4), num_mutation_steps=5)
    particles = target.prior_particles(jax.random.key(0), 1024)
    result = smc.run(target.log_prior, target.log_likelihood, particles, key=jax.random.key(1))
    assert result.verdict.converged, result.summary(print_it=False)
    constrained = jax.vmap(target.observable)(result.particles)  # tau = exp(log tau)
    for name, reference in REFERENCE.items():
        values = np.asarray(constrained[name], np.float64)
        error = np.hypot(result.mcse(values), REFERENCE_MCSE[name])
        assert np.all(error < 0.2), (name, error)  # tight enough to mean something
        np.testing.assert_array_less(np.abs(values.mean(axis=0) - reference), 4 * error,
                                     err_msg=name)  # fmt: skip


def test_numpyro_target_splits_its_log_density_into_prior_and_likelihood():
    target = samplers.targets.from_numpyro(eight_schools, SIGMA, y=Y)
    position = target.prior_particles(jax.random.key(3), 4)
    one = jax.tree.map(lambda x: x[0], position)
    total = float(target(one))
    parts = float(target.log_prior(one)) + float(target.log_likelihood(one))
    assert np.isclose(total, parts, rtol=1e-5, atol=1e-4)
    # The likelihood is the data's density at the constrained values.
    c = target.observable(one)
    mean = c["mu"] + c["tau"] * c["theta_tilde"]
    expected = np.sum(-0.5 * ((Y - mean) / SIGMA) ** 2 - np.log(SIGMA * np.sqrt(2 * np.pi)))
    assert np.isclose(float(target.log_likelihood(one)), expected, rtol=1e-5)
    # SMC takes the target itself (log_likelihood=None), and refuses a plain function so.
    smc = samplers.SMC(samplers.RandomWalk(0.5), num_mutation_steps=1, schedule=[1.0])
    result = smc.run(target, None, position, key=jax.random.key(0))
    assert result.particles["theta_tilde"].shape == (4, 8)
    with pytest.raises(samplers.SamplerTypeError, match="with log_likelihood=None"):
        smc.run(lambda p: 0.0, None, position, key=jax.random.key(0))
    # Prior draws: the right shapes, and the prior's moments (mu ~ N(0, 5)).
    draws = target.prior_particles(jax.random.key(4), 4096)
    assert draws["theta_tilde"].shape == (4096, 8) and draws["tau"].shape == (4096,)
    assert abs(float(np.mean(draws["mu"]))) < 4 * 5.0 / 64
    assert abs(float(np.std(draws["mu"])) - 5.0) < 0.3
    # tau is HalfCauchy(5): its unconstrained log has median log 5.
    assert abs(float(np.median(draws["tau"])) - np.log(5.0)) < 0.1
