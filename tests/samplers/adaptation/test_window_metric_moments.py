"""WindowAdaptation's metric is the target's (co)variance, not its raw second moment.

Every other target in the adaptation tests has mean zero, where `E[x²]` and `Var[x]` are
the same: a metric computed as the raw second moment (or centred on a wrong mean) passes
them. Here the targets have means 5 to 50 and standard deviations 0.5 to 5, so such a
metric is off by a factor of ~100 and a scale error of a few per cent shows.

Tolerances are Monte Carlo errors from the number of chains alone. The chains start at
exact draws and every kernel of the warmup leaves the target invariant, so each chain's
draws in the last window are draws from the target (up to the O(1/chains) pull of the
shared step size and metric on one chain). The window's estimate is the mean over chains
of each chain's window average of `(x - mean)²` (or of the products, dense); the chains
are independent, and a window average of correlated draws varies no more than one draw,
whatever the autocorrelation. For Gaussian coordinates `Var[(x - μ)²] = 2σ⁴`, so the
relative error of a variance is at most `sqrt(2 / chains)`; after whitening by the true
covariance a covariance entry off the diagonal has `Var[z_i z_j] = 1`, so its error is at
most `sqrt(1 / chains)`. Allowed: 5 such bounds (p < 1e-6 per entry, far below it in
practice: the bounds ignore the ~100 draws per chain). Stan's shrinkage towards 1e-3,
weight 5 / (chains x window + 5), is far below them.
"""

import jax
import numpy as np
import pytest

import samplers

DIM = 10
MEANS = np.linspace(5.0, 50.0, DIM).astype(np.float32)
SDS = np.geomspace(0.5, 5.0, DIM).astype(np.float32)
NUM_CHAINS = 1024
TOLERANCE = 5.0  # in units of the bounds above

# One sampling step after the warmup: only the tuned metric is read, not the verdict.
pytestmark = pytest.mark.filterwarnings("ignore::samplers.ConvergenceWarning")


def _rotation(dim: int, seed: int = 0) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((dim, dim)))
    return (q * np.sign(np.diag(r))).astype(np.float32)


def _gaussian(scale: np.ndarray):
    """A Gaussian with mean MEANS and covariance `scale @ scale.T`, its log density and
    NUM_CHAINS exact draws (numpy constants: compile-time constants of the programs)."""
    precision = np.linalg.inv(scale @ scale.T).astype(np.float32)

    def logdensity(x):
        d = x - MEANS
        return -0.5 * d @ precision @ d

    z = np.asarray(jax.random.normal(jax.random.key(0), (NUM_CHAINS, DIM)))
    return logdensity, MEANS + z @ scale.T


def _tuned_metric(kernel, logdensity, positions, metric: str) -> np.ndarray:
    result = samplers.run(
        kernel,
        logdensity,
        positions,
        key=jax.random.key(1),
        num_steps=1,
        adaptation=samplers.WindowAdaptation(num_steps=300, metric=metric),
        progress=False,
    )
    return np.asarray(result.sampler.inverse_mass_matrix, np.float64)


def test_diagonal_metric_is_the_variance():
    logdensity, positions = _gaussian(np.diag(SDS))
    metric = _tuned_metric(samplers.MALA(step_size=0.1), logdensity, positions, "diagonal")
    ratio = metric / SDS.astype(np.float64) ** 2
    bound = np.sqrt(2.0 / NUM_CHAINS)
    assert np.all(np.abs(ratio - 1.0) < TOLERANCE * bound), (ratio, bound)


@pytest.mark.slow
def test_dense_metric_is_the_covariance():
    # Correlated: the unequal scales rotated, so the covariance has no zero entry.
    scale = _rotation(DIM) @ np.diag(SDS)
    logdensity, positions = _gaussian(scale)
    kernel = samplers.MALA(step_size=0.1)
    metric = _tuned_metric(kernel, logdensity, positions, "dense")
    # Whitened by the true covariance: the identity, up to the Monte Carlo error.
    inverse = np.linalg.inv(scale.astype(np.float64))
    white = inverse @ metric @ inverse.T
    bound = np.where(np.eye(DIM, dtype=bool), np.sqrt(2.0 / NUM_CHAINS), np.sqrt(1.0 / NUM_CHAINS))
    error = np.abs(white - np.eye(DIM))
    assert np.all(error < TOLERANCE * bound), (np.max(error / bound), white)
