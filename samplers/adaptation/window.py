"""Windowed warmup for any kernel with a step size: Stan's schedule, for an ensemble.

One step size for the whole ensemble, tuned by dual averaging of the ensemble-mean
acceptance; a diagonal, gradient-based or dense metric estimated in expanding windows from
every chain's draws in the window (cross-chain and within-window statistics pooled).
"""

import dataclasses
import math
import statistics
from typing import ClassVar, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

import ensemblenn as enn

from .. import random
from .._errors import SamplerTypeError
from ..kernels import AdjustedMCLMC, Logdensity, RandomWalk, Sampler, State, resolve, step_chain
from ._base import AdaptationInfo, finite_chain_mean
from ._bias_monitor import BiasMonitor, monitor_field
from ._dual_averaging import DualAveraging
from ._protocol import Adaptation
from ._restart import is_healthy, restart_unhealthy

__all__ = ["WindowAdaptation", "WindowAdaptationInfo", "window_schedule"]


_MAX_TRIALS = 12  # step-size heuristic: at most 2^12 = 4096x up or down
_REGULARIZE = 5.0  # Stan's shrinkage: n / (n + 5) of the estimate, 5 / (n + 5) of 1e-3


def window_schedule(
    num_steps: int, initial_buffer: int, first_window: int, final_buffer: int
) -> tuple[int, int, list[int]]:
    """Stan's warmup windows: `(initial_buffer, final_buffer, ends of the slow windows)`.

    Steps `[0, initial_buffer)` tune the step size only; slow windows follow, each twice
    as long as the one before (the first `first_window` steps), the last one stretched to
    end at `num_steps - final_buffer`; the final buffer tunes the step size for the last
    metric. When the three do not fit in `num_steps`, they become 15 %, 75 % and 10 % of
    it (Stan's rule); below 20 steps there is no metric window at all.

    Example:
        >>> from samplers.adaptation import window_schedule
        >>> window_schedule(500, 75, 25, 50)
        (75, 50, [100, 150, 250, 450])
        >>> window_schedule(100, 75, 25, 50)
        (15, 10, [90])
        >>> window_schedule(10, 75, 25, 50)
        (10, 0, [])
    """
    if num_steps < 20:
        return num_steps, 0, []
    if initial_buffer + first_window + final_buffer > num_steps:
        initial_buffer = int(0.15 * num_steps)
        final_buffer = int(0.1 * num_steps)
        first_window = num_steps - initial_buffer - final_buffer
    slow_end = num_steps - final_buffer
    ends, start, size = [], initial_buffer, first_window
    while start < slow_end:
        end = start + size
        if end + 2 * size > slow_end:  # the next window would not fit: stretch this one
            end = slow_end
        ends.append(end)
        start, size = end, 2 * size
    return initial_buffer, final_buffer, ends


def _step_size_for_target(
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


class WindowAdaptationInfo(AdaptationInfo):
    """What a `WindowAdaptation` reports (the same in every chain).

    Attributes:
        num_restarted: chain restarts: a chain whose state was not finite before a step
            was moved to a healthy chain's position.
        target_acceptance: the ensemble-mean acceptance the step size was tuned to.
        acceptance: ensemble-mean acceptance over the final buffer (after the last
            metric update).
        step_size_history: the step size used at every adaptation step.
        acceptance_history: the ensemble-mean acceptance at every adaptation step.

    (`num_excluded` counts chain-steps of non-finite chains left out of the statistics;
    `num_grads` includes the step-size heuristic's trial steps.)

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> result = samplers.run(samplers.MALA(0.1), lambda x: -0.5 * jnp.sum(x**2),
        ...                       jnp.zeros((8, 2)), key=jax.random.key(0), num_steps=5,
        ...                       adaptation=samplers.WindowAdaptation(num_steps=30),
        ...                       progress=False)
        >>> info = result.adaptation_info
        >>> info.step_size_history.shape, int(info.num_excluded), int(info.num_restarted)
        ((30,), 0, 0)
        >>> round(float(info.target_acceptance), 3)   # MALA's default_target_acceptance
        0.574
    """

    num_restarted: Int[Array, ""] = enn.broadcast()
    target_acceptance: Float[Array, ""] = enn.broadcast()
    acceptance: Float[Array, ""] = enn.broadcast()
    step_size_history: Float[Array, " steps"] = enn.broadcast()
    acceptance_history: Float[Array, " steps"] = enn.broadcast()


def _has_field(sampler: Sampler, name: str) -> bool:
    return any(f.name == name for f in dataclasses.fields(sampler))


class _Carry(eqx.Module):
    state: State
    averaging: DualAveraging
    iteration: Int[Array, ""]  # dual-averaging iteration since the last restart of it
    metric: Array  # (dim,) or (dim, dim); unused without a metric
    shift: Array  # (dim,): the ensemble mean at the window start, for stable sums
    sum1: Array  # this chain's window sums of (x - shift), ((x - shift)^2 or outer)
    sum2: Array
    gsum1: Array | None  # (dim,): this chain's window sums of the gradient and its
    gsum2: Array | None  # square (metric="gradient" only, else None: nothing carried)
    count: Float[Array, ""]  # this chain's healthy draws in the window
    excluded: Int[Array, ""]
    restarted: Int[Array, ""]
    grads: Int[Array, ""]
    final_acceptance: Float[Array, ""]


class WindowAdaptation(Adaptation):
    """Stan-style windowed warmup of the step size and metric, for the whole ensemble.

    Works with any kernel that has a `step_size` field: `MALA`, `HMC`, `GHMC`, `NUTS`,
    `AdjustedMCLMC`, `RandomWalk` and user subclasses. Every other field of the kernel is
    kept. Schedule (`window_schedule`; with the defaults and `num_steps=500`: steps 0-74,
    slow windows 75-99, 100-149, 150-249, 250-449, final buffer 450-499):

    * **initial buffer** (`initial_buffer` steps): the chains move towards the typical set
      while only the step size adapts;
    * **slow windows** (the first `first_window` steps, each next one twice as long, the
      last stretched to the final buffer): every healthy chain adds each of its draws to
      window sums; at the window's end the metric is the variance (`"diagonal"`) or the
      covariance (`"dense"`) of all the ensemble's draws in the window, i.e. within-chain
      and between-chain spread pooled, or (`"gradient"`) the diagonal
      `sqrt(Var[x] / Var[grad log p])` of the draws and the gradients the kernel's state
      keeps (nutpie's estimator: the variance for any Gaussian, much smaller than the
      marginal variance along a curved ridge, where the variance overstates how far a
      step can go), shrunk like Stan's towards `1e-3` by `5 / (n + 5)` with `n` the
      number of draws;
    * **final buffer** (`final_buffer` steps): the step size adapts to the last metric.

    When `initial_buffer + first_window + final_buffer > num_steps` the three become
    15 %, 75 % and 10 % of `num_steps` (one slow window); below 20 steps only the step
    size adapts.

    **Step size**: one for the ensemble. At the start and after each metric update it is
    re-initialised by a heuristic (Stan's, for the ensemble): from the current states, a
    trial step (not kept) with step size `h` gives an ensemble-mean acceptance; `h` is
    doubled (or halved) until that acceptance falls below (or rises above) the target,
    then dual averaging (Hoffman and Gelman 2014; `gamma=0.05, t0=10, kappa=0.75`,
    shrinking towards `10 h`) restarts on the ensemble-mean acceptance of every step. The
    tuned kernel gets the step size at which a fit of the acceptance against the step
    size over the last stage (the final buffer; without a metric, the run's second half)
    reaches the target: `log(-Phi^-1(acceptance / 2)) = a + b log(h)`, weighted least
    squares (the optimal-scaling limit of every adjusted kernel's acceptance). Dual
    averaging's iterates swing across the acceptance cliff, so the acceptance at their
    mean step size is not the target (it lands high, e.g. 0.74 for MALA's 0.574), and its
    own average still weighs the stage's first, wide iterates; the ensemble-mean
    acceptance of every step is precise enough to fit.

    **Metric**, per kernel: a kernel with an `inverse_mass_matrix` field gets the
    estimate there (starting from the identity; `"dense"` needs a kernel that takes a
    `(dim, dim)` matrix: MALA, HMC, GHMC, NUTS, not AdjustedMCLMC). A `RandomWalk` (or
    subclass), which has no metric, gets a per-coordinate step size
    `step_size * sqrt(variance)` instead (diagonal only). Any other kernel has only its
    step size tuned, whatever `metric` says. `metric=None` tunes only the
    step size for every kernel.

    **Non-finite chains**: a chain whose log density, gradient or squared position is
    not finite before a step is left out of every statistic (acceptance, window sums)
    and counted in `num_excluded`; before the step it is restarted at the position of a
    healthy chain (round robin over the healthy chains, a fresh `init` there) and counted
    in `num_restarted`, so it does not freeze. Restarted chains start as copies and
    separate through their own keys. Everything is reduced with the device-count
    invariant collectives and run through `step_chain` (the driver's blocks), so the
    result is bitwise identical on 1, 2, 4 or 8 devices.

    Attributes:
        num_steps: warmup steps.
        target_acceptance: the ensemble-mean acceptance to reach; None uses the kernel's
            `default_target_acceptance` (0.234 RandomWalk, 0.574 MALA, 0.8 HMC, GHMC and
            NUTS, 0.9 AdjustedMCLMC).
        metric: `"diagonal"`, `"gradient"` (a kernel whose state has a `grad`), `"dense"`
            or None.
        initial_buffer, first_window, final_buffer: the schedule (Stan's 75, 25, 50).
        initial_step_size: the heuristic's first step size (default: the kernel's).
        bias_monitor: a `BiasMonitor` that `samplers.run(..., track_bias=True)` attaches
            (`with_bias_monitor`) to record b² after every step; None otherwise.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> target = samplers.targets.IllConditionedGaussian(dim=4, condition_number=10.0)
        >>> result = samplers.run(samplers.HMC(step_size=0.1, num_integration_steps=5),
        ...                       target, jnp.zeros((16, 4)), key=jax.random.key(0),
        ...                       num_steps=100, progress=False,
        ...                       adaptation=samplers.WindowAdaptation(num_steps=200))
        >>> tuned = result.sampler
        >>> tuned.inverse_mass_matrix.shape, bool(tuned.step_size > 0.1)
        ((4,), True)
        >>> ratio = tuned.inverse_mass_matrix / target.variances   # near 1
        >>> bool(jnp.all((ratio > 0.5) & (ratio < 2.0)))
        True
    """

    num_steps: int = eqx.field(static=True, default=500)
    target_acceptance: float | None = eqx.field(static=True, default=None)
    metric: Literal["diagonal", "gradient", "dense"] | None = eqx.field(
        static=True, default="diagonal"
    )
    initial_buffer: int = eqx.field(static=True, default=75)
    first_window: int = eqx.field(static=True, default=25)
    final_buffer: int = eqx.field(static=True, default=50)
    initial_step_size: float | None = eqx.field(static=True, default=None)
    bias_monitor: BiasMonitor | None = monitor_field()

    _METRICS: ClassVar[tuple] = ("diagonal", "gradient", "dense", None)

    def __check_init__(self) -> None:
        def fail(message: str, error: type = enn.EnsembleError) -> None:
            raise error(f"WindowAdaptation {message}")

        for name, low in (
            ("num_steps", 1),
            ("initial_buffer", 0),
            ("first_window", 1),
            ("final_buffer", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                fail(
                    f"{name} must be an int, got {value!r}.\n  fix: e.g. {name}=50",
                    SamplerTypeError,
                )
            if value < low:
                fail(f"{name} must be >= {low}, got {value!r}.")
        if self.target_acceptance is not None:
            t = self.target_acceptance
            if isinstance(t, bool) or not isinstance(t, int | float | np.floating):
                fail(f"target_acceptance must be a float or None, got {t!r}.", SamplerTypeError)
            if not 0.0 < t < 1.0:
                fail(
                    f"target_acceptance must be in (0, 1), got {t!r}.\n  fix: e.g. 0.8, or "
                    "None for the kernel's default_target_acceptance."
                )
        if not any(self.metric == m and type(self.metric) is type(m) for m in self._METRICS):
            fail(
                f"metric must be 'diagonal', 'gradient', 'dense' or None, got "
                f"{self.metric!r}.\n  fix: "
                "metric='diagonal' (the default)."
            )
        eps = self.initial_step_size
        if eps is not None and not (
            isinstance(eps, int | float | np.floating)
            and not isinstance(eps, bool)
            and math.isfinite(eps)
            and eps > 0
        ):
            fail(f"initial_step_size must be a finite number > 0 or None, got {eps!r}.")

    # -- setting up ------------------------------------------------------------------------

    def _check_sampler(self, sampler: Sampler | None) -> None:
        if not isinstance(sampler, Sampler) or not _has_field(sampler, "step_size"):
            raise enn.EnsembleError(
                "WindowAdaptation tunes a kernel's step_size field, got "
                f"{type(sampler).__name__}.\n  fix: samplers.run(samplers.HMC(step_size=0.1, "
                "num_integration_steps=10), ..., adaptation=samplers.WindowAdaptation())."
            )
        if self.metric == "dense" and (
            isinstance(sampler, AdjustedMCLMC) or not _has_field(sampler, "inverse_mass_matrix")
        ):
            raise enn.EnsembleError(
                f"WindowAdaptation(metric='dense') needs a kernel that takes a dense "
                f"inverse_mass_matrix, and {type(sampler).__name__} does not.\n  fix: "
                "metric='diagonal', or a kernel such as samplers.HMC."
            )

    def target_for(self, sampler: Sampler) -> float:
        """The acceptance the step size is tuned to for `sampler`."""
        if self.target_acceptance is not None:
            return float(self.target_acceptance)
        return float(type(sampler).default_target_acceptance)

    def _metric_mode(self, sampler: Sampler) -> str | None:
        """Where the metric goes: `"imm"`, `"step"` (RandomWalk) or None."""
        if self.metric is None:
            return None
        if _has_field(sampler, "inverse_mass_matrix"):
            return "imm"
        if isinstance(sampler, RandomWalk) and self.metric != "dense":
            return "step"
        return None

    def _kernel(self, sampler: Sampler, step_size: Array, metric: Array) -> Sampler:
        mode = self._metric_mode(sampler)
        if mode == "imm":
            return eqx.tree_at(
                lambda k: (k.step_size, k.inverse_mass_matrix),
                sampler,
                (step_size, metric),
                is_leaf=lambda x: x is None,
            )
        if mode == "step":
            step_size = step_size * jnp.sqrt(metric)
        return eqx.tree_at(lambda k: k.step_size, sampler, step_size, is_leaf=lambda x: x is None)

    def initial_state(
        self, sampler: Sampler | None, logdensity: Logdensity, position: Array, key: PRNGKeyArray
    ) -> State:
        self._check_sampler(sampler)
        return sampler.init(logdensity, position, key)

    def _check_state(self, sampler: Sampler, state: State) -> None:
        if self.metric == "gradient" and getattr(state, "grad", None) is None:
            raise enn.EnsembleError(
                f"WindowAdaptation(metric='gradient') estimates the metric from the "
                f"gradients the kernel's state keeps, and {type(sampler).__name__}'s state "
                f"({type(state).__name__}) has no `grad` field.\n  fix: metric='diagonal' "
                "(variances only), or a gradient kernel such as samplers.HMC."
            )

    # -- the run ---------------------------------------------------------------------------

    def run(
        self, sampler: Sampler, logdensity: Logdensity, state: State, key: PRNGKeyArray
    ) -> tuple[Sampler, State, WindowAdaptationInfo]:
        self._check_sampler(sampler)
        self._check_state(sampler, state)
        target = self.target_for(sampler)
        dtype = jnp.result_type(state.position)
        dim = state.position.shape[-1]
        dense = self.metric == "dense"
        initial, _, ends = window_schedule(
            self.num_steps, self.initial_buffer, self.first_window, self.final_buffer
        )
        if self._metric_mode(sampler) is None:
            ends = []  # no metric to estimate: one step-size stage
        # Static per-step flags: inside a slow window, last step of one, heuristic first.
        steps = np.arange(self.num_steps)
        in_window = (steps >= initial) & (steps < (ends[-1] if ends else 0))
        window_end = np.isin(steps + 1, ends)
        window_start = in_window & ((steps == initial) | np.isin(steps, ends))
        reinit = (steps == 0) | np.isin(steps, ends)
        last_stage = ends[-1] if ends else 0  # the final buffer, or the whole run

        if self.initial_step_size is not None:
            eps0 = jnp.asarray(self.initial_step_size, jnp.float32)
        else:
            given = resolve(sampler.step_size, 0).astype(jnp.float32)
            # Per-chain or per-coordinate values: one geometric mean for the ensemble.
            log_given = jnp.where(given > 0, jnp.log(jnp.where(given > 0, given, 1.0)), jnp.nan)
            mean_log, _ = finite_chain_mean(jnp.mean(log_given))
            eps0 = jnp.exp(mean_log).astype(jnp.float32)
            eps0 = jnp.where(jnp.isfinite(eps0) & (eps0 > 0), eps0, jnp.float32(0.1))
        metric0 = jnp.eye(dim, dtype=dtype) if dense else jnp.ones((dim,), dtype)
        zeros = jnp.zeros((dim,), dtype)
        carry = _Carry(
            state=state,
            averaging=self._averaging(jnp.log(eps0)),
            iteration=jnp.int32(0),
            metric=metric0,
            shift=zeros,
            sum1=zeros,
            sum2=jnp.zeros_like(metric0),
            gsum1=zeros if self.metric == "gradient" else None,
            gsum2=zeros if self.metric == "gradient" else None,
            count=jnp.zeros((), dtype),
            excluded=jnp.int32(0),
            restarted=jnp.int32(0),
            grads=jnp.int32(0),
            final_acceptance=jnp.float32(0.0),
        )
        k_step, k_trial, k_restart = random.split(key, 3)

        def body(c: _Carry, xs: tuple) -> tuple:
            t, in_window_t, window_start_t, window_end_t, reinit_t = xs
            # 1. Restart non-finite chains at healthy positions (counted as excluded too).
            healthy = is_healthy(c.state)
            excluded = c.excluded + enn.chain_sum((~healthy).astype(jnp.int32))
            state, restarted = restart_unhealthy(
                self._kernel(sampler, jnp.exp(c.averaging.log_step_size), c.metric),
                logdensity,
                c.state,
                random.fold_in(k_restart, t),
            )
            c = eqx.tree_at(
                lambda c: (c.state, c.excluded, c.restarted),
                c,
                (state, excluded, c.restarted + restarted),
            )
            # 2. Re-initialise the step size (at the start and after each metric update).
            c = jax.lax.cond(
                reinit_t,
                lambda c: self._reinitialise(sampler, logdensity, c, k_trial, t, target),
                lambda c: c,
                c,
            )
            # 3. A window's sums are taken around the ensemble mean at its start.
            c = jax.lax.cond(window_start_t, self._new_window, lambda c: c, c)
            # 4. One step, and dual averaging on the ensemble-mean acceptance.
            eps = jnp.exp(c.averaging.log_step_size).astype(jnp.float32)
            kernel = self._kernel(sampler, eps, c.metric)
            was_healthy = is_healthy(c.state)
            new, info = step_chain(kernel, logdensity, c.state, random.fold_in(k_step, t))
            acc = jnp.where(was_healthy, info.acceptance_rate, jnp.nan)
            mean_acc, _ = finite_chain_mean(acc)
            iteration = c.iteration + 1
            averaging = c.averaging.update(mean_acc, target, iteration)
            # 5. Window sums of the chain's new position, when healthy.
            ok = is_healthy(new) & in_window_t
            d = (new.position - c.shift).astype(dtype)
            sq = (d[:, None] * d[None, :]) if dense else d * d
            sum1 = jnp.where(ok, c.sum1 + d, c.sum1)
            sum2 = jnp.where(ok, c.sum2 + sq, c.sum2)
            gsum1, gsum2 = c.gsum1, c.gsum2
            if self.metric == "gradient":
                g = new.grad.astype(dtype)
                gsum1 = jnp.where(ok, gsum1 + g, gsum1)
                gsum2 = jnp.where(ok, gsum2 + enn.rounded(g * g), gsum2)  # no FMA: same bits
            count = c.count + ok.astype(dtype)
            in_final = t >= last_stage
            final_acc = c.final_acceptance + jnp.where(in_final, mean_acc, 0.0)
            c = _Carry(
                new,
                averaging,
                iteration,
                c.metric,
                c.shift,
                sum1,
                sum2,
                gsum1,
                gsum2,
                count,
                c.excluded,
                c.restarted,
                c.grads + info.num_grads,
                final_acc.astype(jnp.float32),
            )
            # 6. At a window's end: the new metric.
            c = jax.lax.cond(
                window_end_t, lambda c: self._update_metric(c, self.metric), lambda c: c, c
            )
            row = None
            if self.bias_monitor is not None:  # read-only: b² of the new positions
                row = self.bias_monitor.row(logdensity, new.position, c.grads)
            return c, (eps, mean_acc.astype(jnp.float32), row)

        xs = (
            jnp.arange(self.num_steps, dtype=jnp.int32),
            jnp.asarray(in_window),
            jnp.asarray(window_start),
            jnp.asarray(window_end),
            jnp.asarray(reinit),
        )
        c, (eps_history, acc_history, bias_history) = jax.lax.scan(body, carry, xs)
        # Dual averaging's own average still weighs the stage's first, wide iterates, and
        # its iterates swing across the acceptance cliff (their mean acceptance is the
        # target, the acceptance at their mean step size is not): the tuned step size is
        # where a fit of acceptance against step size over the stage reaches the target.
        averaged = jnp.exp(c.averaging.log_averaged).astype(jnp.float32)
        step_size = averaged
        if self.num_steps > last_stage:  # else final_buffer=0: no stage after the metric
            start = max(last_stage, self.num_steps // 2)  # no metric: skip the transient
            step_size = _step_size_for_target(
                eps_history[start:], acc_history[start:], target, averaged
            )
        tuned = self._kernel(sampler, step_size, c.metric)
        # Chains that are non-finite after the last step would not move while sampling.
        excluded = c.excluded + enn.chain_sum((~is_healthy(c.state)).astype(jnp.int32))
        state, restarted = restart_unhealthy(
            tuned, logdensity, c.state, random.fold_in(k_restart, self.num_steps)
        )
        info = WindowAdaptationInfo(
            num_steps=jnp.int32(self.num_steps),
            num_excluded=excluded,
            num_grads=enn.chain_sum(c.grads) // enn.num_chains(),
            num_restarted=c.restarted + restarted,
            target_acceptance=jnp.float32(target),
            acceptance=c.final_acceptance / max(self.num_steps - last_stage, 1),
            step_size_history=eps_history,
            acceptance_history=acc_history,
            bias_history=bias_history,
        )
        return tuned, state, info

    @staticmethod
    def _averaging(log_step_size: Array) -> DualAveraging:
        log_step_size = jnp.asarray(log_step_size, jnp.float32)
        return DualAveraging(
            log_step_size, log_step_size, jnp.float32(0.0), jnp.log(10.0) + log_step_size
        )

    def _reinitialise(
        self,
        sampler: Sampler,
        logdensity: Logdensity,
        c: _Carry,
        key: PRNGKeyArray,
        t: Int[Array, ""],
        target: float,
    ) -> _Carry:
        """Double or halve the step size until a trial step's ensemble-mean acceptance
        crosses the target; restart dual averaging there. Trial moves are not kept."""
        healthy = is_healthy(c.state)
        key = random.fold_in(key, t)

        def acceptance(log_eps: Array, i: Array) -> tuple[Array, Array]:
            kernel = self._kernel(sampler, jnp.exp(log_eps).astype(jnp.float32), c.metric)
            _, info = step_chain(kernel, logdensity, c.state, random.fold_in(key, i))
            mean, _ = finite_chain_mean(jnp.where(healthy, info.acceptance_rate, jnp.nan))
            return mean, info.num_grads

        log_eps = c.averaging.log_step_size
        a0, grads = acceptance(log_eps, jnp.int32(0))
        up = a0 > target  # accepting more than the target: longer steps
        direction = jnp.where(up, 1.0, -1.0).astype(jnp.float32)
        log2 = jnp.float32(math.log(2.0))

        def cond(loop: tuple) -> Bool[Array, ""]:
            i, _, a, _ = loop
            crossed = jnp.where(up, a <= target, a > target)
            return (i < _MAX_TRIALS) & ~crossed

        def body(loop: tuple) -> tuple:
            i, log_eps, _, grads = loop
            log_eps = log_eps + direction * log2
            a, g = acceptance(log_eps, i + 1)
            return i + 1, log_eps, a, grads + g

        _, log_eps, _, grads = jax.lax.while_loop(cond, body, (jnp.int32(0), log_eps, a0, grads))
        # Going up, the last step size that still reached the target is one halving back.
        log_eps = jnp.where(up, log_eps - log2, log_eps)
        log_eps = jnp.where(jnp.isfinite(log_eps), log_eps, c.averaging.log_step_size)
        return eqx.tree_at(
            lambda c: (c.averaging, c.iteration, c.grads),
            c,
            (self._averaging(log_eps), jnp.int32(0), c.grads + grads),
        )

    @staticmethod
    def _update_metric(c: _Carry, metric: str) -> _Carry:
        """The pooled window estimate (every healthy chain's draws), shrunk like Stan's."""
        n = enn.chain_sum(c.count)
        s1, s2 = enn.chain_sum(c.sum1), enn.chain_sum(c.sum2)
        # Divides by n as a multiply by one reciprocal, and rounds each product that an
        # addition follows: XLA:CPU may turn divisions into reciprocal multiplies, or a
        # multiply and an add into one FMA, in one program and not another (the number of
        # chains per device changes it).
        inv_n = 1.0 / jnp.maximum(n, 1.0)
        mean = enn.rounded(s1 * inv_n)
        shrink = n / (n + _REGULARIZE)
        floor = 1e-3 * (_REGULARIZE / (n + _REGULARIZE))
        if metric == "dense":
            cov = enn.rounded(s2 * inv_n) - enn.rounded(mean[:, None] * mean[None, :])
            cov = 0.5 * (cov + cov.T)
            eye = jnp.eye(cov.shape[0], dtype=cov.dtype)
            new = enn.rounded(shrink * cov) + enn.rounded(floor * eye)
            ok = jnp.all(jnp.isfinite(new)) & jnp.all(jnp.diagonal(new) > 0) & (n > 1)
        else:
            var = enn.rounded(s2 * inv_n) - enn.rounded(mean * mean)
            if metric == "gradient":  # sqrt(Var[x] / Var[grad]): exact for any Gaussian's
                g_mean = enn.rounded(enn.chain_sum(c.gsum1) * inv_n)
                g_var = enn.rounded(enn.chain_sum(c.gsum2) * inv_n) - enn.rounded(g_mean * g_mean)
                var = jnp.sqrt(var / g_var)
            new = enn.rounded(shrink * var) + floor
            ok = jnp.all(jnp.isfinite(new)) & jnp.all(new > 0) & (n > 1)
        return eqx.tree_at(
            lambda c: c.metric, c, jnp.where(ok, new.astype(c.metric.dtype), c.metric)
        )

    @staticmethod
    def _new_window(c: _Carry) -> _Carry:
        """Empty window sums around the healthy chains' mean (sums of small deviations
        keep the variance's cancellation error small)."""
        x = jnp.where(is_healthy(c.state), c.state.position, jnp.nan)
        shift, _ = finite_chain_mean(x)
        shift = jnp.where(jnp.isfinite(shift), shift, 0.0).astype(c.shift.dtype)

        def zero(x: Array | None) -> Array | None:
            return None if x is None else jnp.zeros_like(x)

        return dataclasses.replace(
            c,
            shift=shift,
            sum1=zero(c.sum1),
            sum2=zero(c.sum2),
            gsum1=zero(c.gsum1),
            gsum2=zero(c.gsum2),
            count=zero(c.count),
        )
