"""WindowAdaptation's step size: the heuristic restart, dual averaging, and the final fit.

One step size for the ensemble. The heuristic (Stan's, for the ensemble) doubles or halves
it until a trial step's ensemble-mean acceptance crosses the target; dual averaging then
follows the ensemble-mean acceptance of every step; the tuned value is where a fit of
acceptance against step size over the last stage reaches the target.
"""

import math
import statistics
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

import ensemblenn as enn

from .. import random
from ..kernels import Logdensity, Sampler, State, resolve, step_chain
from ._base import finite_chain_mean
from ._dual_averaging import DualAveraging
from ._restart import is_healthy

__all__ = ["averaging", "heuristic_step_size", "initial_step_size", "step_size_for_target"]

_MAX_TRIALS = 12  # step-size heuristic: at most 2^12 = 4096x up or down


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


def heuristic_step_size(
    kernel_at: Callable[[Array], Sampler],
    logdensity: Logdensity,
    state: State,
    log_eps: Float[Array, ""],
    key: PRNGKeyArray,
    target: float,
) -> tuple[Float[Array, ""], Int[Array, ""]]:
    """Double or halve the step size from `exp(log_eps)` until a trial step's
    ensemble-mean acceptance crosses the target (trial moves are not kept).

    `kernel_at(step_size)` is the kernel with that step size (and the current metric).
    Returns `(log step size, this chain's gradients spent on trials)`.
    """
    healthy = is_healthy(state)

    def acceptance(log_eps: Array, i: Array) -> tuple[Array, Array]:
        kernel = kernel_at(jnp.exp(log_eps).astype(jnp.float32))
        _, info = step_chain(kernel, logdensity, state, random.fold_in(key, i))
        mean, _ = finite_chain_mean(jnp.where(healthy, info.acceptance_rate, jnp.nan))
        return mean, info.num_grads

    start = log_eps
    log2 = jnp.float32(math.log(2.0))

    # One loop, one call of the kernel: evaluation 0 at the start decides the direction
    # (up: accepting more than the target, so longer steps), each later one moves a factor
    # 2 first. A second call site would compile the kernel's step (a whole NUTS tree) twice.
    def cond(loop: tuple) -> Bool[Array, ""]:
        i, _, a, _, up = loop
        crossed = jnp.where(up, a <= target, a > target)
        return (i == 0) | ((i <= _MAX_TRIALS) & ~crossed)

    def body(loop: tuple) -> tuple:
        i, log_eps, _, grads, up = loop
        direction = jnp.where(up, 1.0, -1.0).astype(jnp.float32)
        log_eps = jnp.where(i == 0, log_eps, log_eps + direction * log2)
        a, g = acceptance(log_eps, i)
        return i + 1, log_eps, a, grads + g, jnp.where(i == 0, a > target, up)

    no_acceptance = jnp.zeros((), jnp.result_type(state.position))  # the Info floats' dtype
    first = (jnp.int32(0), log_eps, no_acceptance, jnp.int32(0), jnp.bool_(False))
    _, log_eps, _, grads, up = jax.lax.while_loop(cond, body, first)
    # Going up, the last step size that still reached the target is one halving back.
    log_eps = jnp.where(up, log_eps - log2, log_eps)
    return jnp.where(jnp.isfinite(log_eps), log_eps, start), grads


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
