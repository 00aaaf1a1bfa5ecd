"""SMC's log evidence against a closed form, and its standard error against the spread
over independent seeds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import samplers

PRIOR_SD, NOISE_SD = 2.0, 1.0  # prior N(0, 2^2 I); one observation per coordinate, sd 1
NUM_PARTICLES, NUM_SEEDS = 512, 16
KERNEL = samplers.HMC(step_size=0.5, num_integration_steps=4)


def conjugate_gaussian(dim):
    """`(log_prior, log_likelihood, exact log Z)`: y | x ~ N(x, NOISE_SD^2 I), x ~ N(0,
    PRIOR_SD^2 I), so Z = N(y; 0, (PRIOR_SD^2 + NOISE_SD^2) I)."""
    total = PRIOR_SD**2 + NOISE_SD**2
    y_host = np.random.default_rng(dim).normal(0.0, np.sqrt(total), dim).astype(np.float32)
    y = jnp.asarray(y_host)

    def log_prior(x):
        return -0.5 * jnp.sum(x**2) / PRIOR_SD**2 - 0.5 * dim * np.log(2 * np.pi * PRIOR_SD**2)

    def log_likelihood(x):
        norm = 0.5 * dim * np.log(2 * np.pi * NOISE_SD**2)
        return -0.5 * jnp.sum((x - y) ** 2) / NOISE_SD**2 - norm

    y64 = y_host.astype(np.float64)
    exact = float(np.sum(-0.5 * y64**2 / total) - 0.5 * dim * np.log(2 * np.pi * total))
    return log_prior, log_likelihood, exact


@pytest.mark.slow
@pytest.mark.parametrize("dim", [10, 100])
def test_log_evidence_of_a_conjugate_gaussian_and_its_standard_error(dim):
    log_prior, log_likelihood, exact = conjugate_gaussian(dim)
    smc = samplers.SMC(KERNEL, num_mutation_steps=5)
    log_z, se = [], []
    for seed in range(NUM_SEEDS):
        start = PRIOR_SD * jax.random.normal(jax.random.key(seed), (NUM_PARTICLES, dim))
        result = smc.run(log_prior, log_likelihood, start, key=jax.random.key(1000 + seed))
        assert result.temperatures[-1] == 1.0 and result.verdict.converged, result.summary()
        log_z.append(result.log_evidence)
        se.append(result.log_evidence_se)
    log_z, se = np.array(log_z), np.array(se)
    # One run: within 3 of its own standard errors.
    assert abs(log_z[0] - exact) < 3 * se[0], (log_z[0], exact, se[0])
    # The mean of the seeds: within 3 standard errors of a mean of 16 (plus log Z_hat's
    # own bias, -Var/2, which is small here).
    bias = 0.5 * np.mean(se**2)
    assert abs(log_z.mean() + bias - exact) < 3 * np.sqrt(np.mean(se**2) / NUM_SEEDS), (
        log_z.mean(), exact,
    )  # fmt: skip
    # The standard error against the spread over seeds: with the right variance, the
    # sample variance of 16 seeds is variance * chi2(15) / 15; outside its 0.1% and 99.9%
    # quantiles (0.23x and 2.5x) the estimate is wrong by more than sampling allows.
    ratio = log_z.var(ddof=1) / np.mean(se**2)
    dof = NUM_SEEDS - 1
    low, high = stats.chi2.ppf([0.001, 0.999], dof) / dof
    assert low < ratio < high, (ratio, low, high, log_z.std(ddof=1), se.mean())


@pytest.mark.slow
def test_standard_error_counts_what_few_moves_leave_correlated():
    # Two MALA steps per stage barely renew the resampled copies: the spread of log Z over
    # seeds is then ~2x what independent particles would give (sum_t (N / ESS_t - 1) / N).
    # The genealogy's standard error counts it; the independent-particle formula does not.
    log_prior, log_likelihood, exact = conjugate_gaussian(10)
    smc = samplers.SMC(samplers.MALA(step_size=0.5), num_mutation_steps=2)
    log_z, se, independent = [], [], []
    for seed in range(NUM_SEEDS):
        start = PRIOR_SD * jax.random.normal(jax.random.key(seed), (NUM_PARTICLES, 10))
        result = smc.run(log_prior, log_likelihood, start, key=jax.random.key(1000 + seed))
        log_z.append(result.log_evidence)
        se.append(result.log_evidence_se)
        independent.append(np.sqrt(np.sum((NUM_PARTICLES / result.ess - 1) / NUM_PARTICLES)))
    log_z, se, independent = np.array(log_z), np.array(se), np.array(independent)
    dof = NUM_SEEDS - 1
    low, high = stats.chi2.ppf([0.001, 0.999], dof) / dof
    assert low < log_z.var(ddof=1) / np.mean(se**2) < high, (log_z.std(ddof=1), se.mean())
    assert log_z.var(ddof=1) / np.mean(independent**2) > high  # would be refused
    assert abs(log_z.mean() - exact) < 3 * np.sqrt(np.mean(se**2) / NUM_SEEDS)
