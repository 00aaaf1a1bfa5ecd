"""The tempering schedule and the evidence, on the host in float64.

Every stage's log likelihoods come back as one `(num_particles,)` array; what is computed
from them here (the next temperature, the incremental weights, the evidence and its
variance) is numpy arithmetic in one fixed order, so it is the same on any device count
whenever the log likelihoods are.
"""

import numpy as np


def log_mean_exp(log_w: np.ndarray) -> float:
    """`log(mean(exp(log_w)))`, `-inf` if every entry is `-inf`."""
    top = np.max(log_w)
    if not np.isfinite(top):
        return float(top)
    return float(top + np.log(np.mean(np.exp(log_w - top))))


def ess_fraction(log_w: np.ndarray) -> float:
    """`ESS / N = (sum w)^2 / (N sum w^2)` of unnormalised log weights (0 if all -inf).

    The particles are equally weighted before each reweighting (every stage resamples),
    so this is also the conditional ESS of Zhou, Johansen & Aston (2016).

    Example:
        >>> import numpy as np
        >>> from samplers.smc._schedule import ess_fraction
        >>> ess_fraction(np.zeros(4)), ess_fraction(np.array([0.0, 0.0, -np.inf, -np.inf]))
        (1.0, 0.5)
    """
    top = np.max(log_w)
    if not np.isfinite(top):
        return 0.0
    w = np.exp(log_w - top)
    return float(w.sum() ** 2 / (len(w) * np.sum(w * w)))


def increment(log_likelihood: np.ndarray, delta: float) -> np.ndarray:
    """The incremental log weights `delta * log L`; a zero likelihood stays -inf."""
    ll = np.asarray(log_likelihood, np.float64)
    return np.where(np.isneginf(ll), -np.inf, delta * np.where(np.isneginf(ll), 0.0, ll))


def next_delta(log_likelihood: np.ndarray, beta: float, target: float) -> float:
    """The temperature increment whose incremental weights have `ESS / N = target`, found
    by bisection (the ESS falls as the increment grows); the rest of the way to 1 when
    that keeps the ESS at or above the target.

    Example:
        >>> import numpy as np
        >>> from samplers.smc._schedule import ess_fraction, increment, next_delta
        >>> ll = np.random.default_rng(0).normal(0.0, 10.0, 1000)
        >>> d = next_delta(ll, 0.0, 0.5)
        >>> 0 < d < 1, round(ess_fraction(increment(ll, d)), 6)
        (True, 0.5)
    """
    rest = 1.0 - beta
    if ess_fraction(increment(log_likelihood, rest)) >= target:
        return rest
    lo, hi = 0.0, rest
    for _ in range(100):  # down to 2^-100 of the interval, or no change left
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if ess_fraction(increment(log_likelihood, mid)) >= target:
            lo = mid
        else:
            hi = mid
    return lo if lo > 0 else hi


def lineage_residuals(log_w: np.ndarray, eves: np.ndarray) -> np.ndarray:
    """One stage's first-order terms of `log Z_hat`, summed by lineage.

    To first order, `log(mean w) - log E[w] = sum_i r_i / N` with `r_i = w_i / mean w - 1`.
    This returns, for every particle `k` of the initial population, the sum of `r_i / N`
    over the particles `i` that descend from it (whose Eve is `k`). Summed over the stages
    and squared, lineage by lineage, they give `SMC`'s variance estimate of `log Z_hat`.

    Example:
        >>> import numpy as np
        >>> from samplers.smc._schedule import lineage_residuals
        >>> lineage_residuals(np.log([1.0, 1.0, 3.0, 3.0]), np.array([0, 0, 2, 2])).tolist()
        [-0.25, 0.0, 0.25, 0.0]
    """
    top = np.max(log_w)
    n = len(log_w)
    if not np.isfinite(top):
        return np.zeros(n)
    w = np.exp(log_w - top)
    r = w / w.mean() - 1.0
    return np.bincount(np.asarray(eves), weights=r, minlength=n) / n
