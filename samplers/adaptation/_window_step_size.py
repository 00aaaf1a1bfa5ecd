"""WindowAdaptation's step size: the heuristic restart, dual averaging, and the final fit.

One step size for the ensemble. The heuristic (Stan's, for the ensemble) doubles or halves
it until a trial step's ensemble-mean acceptance crosses the target; dual averaging then
follows the ensemble-mean acceptance of every step; the tuned value is where a fit of
acceptance against step size over the last stage reaches the target.
"""

import math
import statistics

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

import ensemblenn as enn

from ..kernels import Sampler, resolve
from ._base import finite_chain_mean
from ._dual_averaging import DualAveraging

__all__ = ["HeuristicTrials", "averaging", "initial_step_size", "step_size_for_target"]

_MAX_TRIALS = 12  # step-size heuristic: at most 2^12 = 4096x up or down
_LOG2 = math.log(2.0)


def initial_step_size(sampler: Sampler, given: float | None) -> Float[Array, ""]:
    """The heuristic's first step size: `given`, else the geometric mean over chains and
    coordinates of the kernel's own (0.1 when that is not a positive number)."""
    if given is not None:
        return jnp.asarray(given, jnp.float32)
    eps = resolve(sampler.step_size, 0).astype(jnp.float32)
    # Per-chain or per-coordinate values: one geometric mean for the ensemble.
    log_eps = jnp.where(eps > 0, jnp.log(jnp.where(eps > 0, eps, 1.0)), jnp.nan)
    mean_log, _ = finite_chain_mean(jnp.mean(log_eps))
    eps0 = jnp.exp(mean_log).astype(jnp.float32)
    return jnp.where(jnp.isfinite(eps0) & (eps0 > 0), eps0, jnp.float32(0.1))


def averaging(log_step_size: Array) -> DualAveraging:
    """Dual averaging restarted at `log_step_size`, shrinking towards 10x it (Stan's)."""
    log_step_size = jnp.asarray(log_step_size, jnp.float32)
    return DualAveraging(
        log_step_size, log_step_size, jnp.float32(0.0), jnp.log(10.0) + log_step_size
    )


class HeuristicTrials(eqx.Module):
    """Where the step-size heuristic stands: it doubles or halves the step size from
    `exp(log_eps)` until a trial step's ensemble-mean acceptance crosses the target (trial
    moves are not kept). The caller runs the trials (`candidate` is the next trial's log
    step size, `after` takes its acceptance) so that they go through its own call of the
    kernel; `result` is the step size found.

    Example:
        >>> import jax.numpy as jnp
        >>> from samplers.adaptation._window_step_size import HeuristicTrials
        >>> h = HeuristicTrials.start(jnp.log(1.0), jnp.bool_(True))
        >>> for acceptance in (0.2, 0.5, 0.9):        # too low: halve until above 0.8
        ...     h = h.after(h.candidate(), jnp.float32(acceptance), 0.8)
        >>> bool(h.active), round(float(jnp.exp(h.result())), 3)
        (False, 0.25)
    """

    active: Bool[Array, ""]  # trials still to run
    stepped: Bool[Array, ""]  # the caller's real step done (its loop's end)
    count: Int[Array, ""]  # trials run
    log_eps: Float[Array, ""]  # the last trial's
    up: Bool[Array, ""]  # direction, decided by the first trial
    first: Float[Array, ""]  # the start, kept when the trials end non-finite

    @classmethod
    def start(cls, log_eps: Array, active: Bool[Array, ""]) -> "HeuristicTrials":
        log_eps = jnp.asarray(log_eps, jnp.float32)
        false = jnp.bool_(False)
        return cls(jnp.asarray(active), false, jnp.int32(0), log_eps, false, log_eps)

    def candidate(self) -> Float[Array, ""]:
        """The next trial's log step size: the start first, then a factor 2 each time."""
        direction = jnp.where(self.up, 1.0, -1.0).astype(jnp.float32)
        return jnp.where(self.count == 0, self.log_eps, self.log_eps + direction * _LOG2)

    def after(self, log_eps: Array, acceptance: Array, target: float) -> "HeuristicTrials":
        """The state after a trial at `log_eps` reached `acceptance` (ensemble mean)."""
        up = jnp.where(self.count == 0, acceptance > target, self.up)
        crossed = jnp.where(up, acceptance <= target, acceptance > target)
        count = self.count + 1
        active = (count <= _MAX_TRIALS) & ~crossed
        return HeuristicTrials(
            active, self.stepped, count, log_eps.astype(jnp.float32), up, self.first
        )

    def result(self) -> Float[Array, ""]:
        """The log step size found: going up, the last that still reached the target is
        one halving back; the start when the trials ended non-finite."""
        log_eps = jnp.where(self.up, self.log_eps - _LOG2, self.log_eps)
        return jnp.where(jnp.isfinite(log_eps), log_eps, self.first)


def step_size_for_target(
    step_sizes: Float[Array, " n"], acceptances: Float[Array, " n"], target: float, fallback
) -> Float[Array, ""]:
    """The step size at which `log(-Phi^-1(acceptance / 2)) = a + b log(step_size)` reaches
    `target`.

    The curve is the high-dimensional limit of the acceptance of every Metropolis-adjusted
    kernel here: `2 Phi(-c h^k)`, with `k` 1 for a random walk, 3 for MALA, 2 for HMC (the
    optimal-scaling limits: Roberts, Gelman and Gilks 1997; Roberts and Rosenthal 1998;
    Beskos et al. 2013); `a` and `b` are fitted, so `k` need not be known. (A logit fit,
    the form used before, is misspecified for that curve: MALA sampled at 0.605-0.617 for
    its 0.574.) The fit is local to the target: weighted least squares with weight
    `exp(-(logit p - logit target)^2 / 2)`, so steps that accepted almost always or almost
    never barely count (HMC's acceptance is not even monotone in the step size far from
    the target). Solved for `target`, kept inside the range of the step sizes seen;
    `fallback` when the fitted acceptance does not fall as the step size grows. Reduced
    with `enn.ordered_sum`: the same bits on every device count.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from samplers.adaptation._window_step_size import step_size_for_target
        >>> eps = jnp.array([0.5, 1.0, 2.0])
        >>> acc = 2 * jax.scipy.stats.norm.cdf(-0.5 * eps**2)   # HMC-like: k = 2, c = 0.5
        >>> round(float(step_size_for_target(eps, acc, 0.8, 1.0)), 3)   # exact: 0.712
        0.712
    """
    log_eps = jnp.log(step_sizes.astype(jnp.float32))
    finite = jnp.isfinite(acceptances) & jnp.isfinite(log_eps)
    p = jnp.where(finite, jnp.clip(acceptances.astype(jnp.float32), 0.005, 0.995), 0.5)
    z = jnp.log(-jax.scipy.special.ndtri(0.5 * p))
    z_target = math.log(-statistics.NormalDist().inv_cdf(0.5 * target))
    logit_distance = jnp.log(p / (1.0 - p)) - math.log(target / (1.0 - target))
    w = jnp.where(finite, jnp.exp(-0.5 * logit_distance**2), 0.0)
    log_eps = jnp.where(finite, log_eps, 0.0)

    def total(v: Array) -> Array:
        return enn.ordered_sum(v, 0)

    weight = total(w)
    mean_x, mean_z = total(w * log_eps) / weight, total(w * z) / weight
    sxx = total(w * (log_eps - mean_x) ** 2)
    slope = total(w * (log_eps - mean_x) * (z - mean_z)) / sxx
    solution = mean_x + (z_target - mean_z) / slope
    seen = jnp.where(finite, log_eps, jnp.nan)
    solution = jnp.clip(solution, jnp.nanmin(seen), jnp.nanmax(seen))
    # z = log(-Phi^-1(p / 2)) rises as the acceptance falls: it must rise with the step,
    # by more than rounding over the steps' spread (flat acceptances leave a slope of
    # rounding noise, of either sign depending on the XLA version, that would send the
    # solution to an end of the range).
    rise = slope * jnp.sqrt(sxx / weight)
    ok = (rise > 1e-4) & (sxx > 0) & jnp.isfinite(solution)
    return jnp.where(ok, jnp.exp(solution), fallback).astype(jnp.float32)
