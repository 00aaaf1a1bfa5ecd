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
        >>> ess_fraction(np.zeros(4)), round(ess_fraction(np.log([1.0, 1.0, 0.0, 0.0])), 3)
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


def relative_variance(log_w: np.ndarray, families: np.ndarray | None) -> float:
    """The estimated variance of `log(mean(w))` at one stage, to first order
    `Var(mean w) / mean(w)^2`, with the particles grouped in `families` (each particle's
    ancestor at the previous resampling; None: independent particles).

    The variance of a mean over families (cluster-robust, as for clustered samples):
    `sum_f (sum_{i in f} (w_i / mean w - 1))^2 / N^2`, which for singleton families is
    `(N / ESS - 1) / N`. Grouping by family counts the correlation that mutation steps
    leave between copies of one resampled particle.

    Example:
        >>> import numpy as np
        >>> from samplers.smc._schedule import relative_variance
        >>> lw = np.log([1.0, 1.0, 3.0, 3.0])
        >>> relative_variance(lw, None), relative_variance(lw, np.array([0, 0, 2, 2]))
        (0.0625, 0.125)
    """
    top = np.max(log_w)
    if not np.isfinite(top):
        return float("inf")
    w = np.exp(log_w - top)
    r = w / w.mean() - 1.0
    n = len(w)
    if families is None:
        return float(np.sum(r * r) / n**2)
    sums = np.bincount(np.asarray(families), weights=r, minlength=n)
    return float(np.sum(sums * sums) / n**2)
