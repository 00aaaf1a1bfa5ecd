"""SMC finds both modes of a bimodal posterior with the right weights (the moves alone
never cross between them: the weights come from the tempering and resampling)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import samplers

DIM, WEIGHT, SEPARATION, PRIOR_SD = 5, 0.8, 8.0, 5.0
NUM_PARTICLES, NUM_SEEDS = 1024, 8


@pytest.mark.slow
def test_bimodal_gaussian_mode_weights_and_evidence():
    # The target is the (normalised) mixture WEIGHT N(0, I) + (1 - WEIGHT) N(8 e1, I),
    # split as a wide normalised prior N(0, 5^2 I) times likelihood target / prior: the
    # posterior is the mixture itself, and Z = 1 (log Z = 0).
    target = samplers.targets.BimodalGaussian(DIM, SEPARATION, WEIGHT)

    def log_prior(x):
        return -0.5 * jnp.sum(x**2) / PRIOR_SD**2 - 0.5 * DIM * np.log(2 * np.pi * PRIOR_SD**2)

    def log_likelihood(x):
        return target(x) - log_prior(x)

    smc = samplers.SMC(samplers.HMC(step_size=0.5, num_integration_steps=4), num_mutation_steps=5)
    fractions, mcse, log_z, se = [], [], [], []
    for seed in range(NUM_SEEDS):
        start = PRIOR_SD * jax.random.normal(jax.random.key(seed), (NUM_PARTICLES, DIM))
        result = smc.run(log_prior, log_likelihood, start, key=jax.random.key(50 + seed))
        in_second = np.asarray(result.particles[:, 0] > SEPARATION / 2, np.float64)
        fractions.append(in_second.mean())
        mcse.append(float(result.mcse(in_second)))
        log_z.append(result.log_evidence)
        se.append(result.log_evidence_se)
    # The second mode's weight, 0.2, from the mean of the seeds, within 4 Monte Carlo
    # standard errors of that mean (each run's from its lineages).
    fraction, error = np.mean(fractions), np.sqrt(np.mean(np.square(mcse)) / NUM_SEEDS)
    assert abs(fraction - (1 - WEIGHT)) < 4 * error, (fraction, error, fractions)
    assert 0.005 < error < 0.02  # the test has teeth: 4 errors are < 0.08 of 0.2
    # Every run holds both modes.
    assert min(fractions) > 0.1 and max(fractions) < 0.3, fractions
    # log Z = 0, within 3 standard errors of the mean over seeds.
    assert abs(np.mean(log_z)) < 3 * np.sqrt(np.mean(np.square(se)) / NUM_SEEDS), log_z
