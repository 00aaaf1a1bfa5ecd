"""Windowed warmup for any kernel with a step size: Stan's schedule, for an ensemble.

One step size for the whole ensemble, tuned by dual averaging of the ensemble-mean
acceptance; a diagonal, gradient-based or dense metric estimated in expanding windows from
every chain's draws in the window (cross-chain and within-window statistics pooled).

The stages live in their own files: the schedule (`_window_schedule`), the step size
(`_window_step_size`), the metric (`_window_metric`), the detection of stuck chains
(`_window_repair`) and their restart (`_restart`); this file holds the public class and
the scan that runs them.
"""

import dataclasses
import math
from typing import ClassVar, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

import ensemblenn as enn

from .. import random
from .._errors import SamplerTypeError
from ..kernels import AdjustedMCLMC, Logdensity, RandomWalk, Sampler, State, step_chain
from ._base import AdaptationInfo, finite_chain_mean
from ._bias_monitor import BiasMonitor, monitor_field
from ._dual_averaging import DualAveraging
from ._protocol import Adaptation
from ._restart import is_healthy, restart_at_donors, restart_unhealthy
from ._ticks import tick
from ._window_metric import WindowSums
from ._window_repair import ChainHealth, outliers
from ._window_schedule import phases, window_schedule
from ._window_step_size import HeuristicTrials, averaging, initial_step_size
from ._window_step_size import step_size_for_target as _step_size_for_target

__all__ = ["WindowAdaptation", "WindowAdaptationInfo", "window_schedule"]

_MIN_AVERAGED = 10  # the end-of-warmup repair needs a final buffer at least this long


class WindowAdaptationInfo(AdaptationInfo):
    """What a `WindowAdaptation` reports (the same in every chain).

    Attributes:
        num_restarted: chain restarts: a chain whose state was not finite before a step
            was moved to a healthy chain's position.
        num_repaired: chain repairs: a chain stuck far from the ensemble at a window's
            end (its log density or acceptance far below the others') was left out of
            the metric and moved to a healthy chain's position.
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
        >>> int(info.num_repaired)
        0
        >>> round(float(info.target_acceptance), 3)   # MALA's default_target_acceptance
        0.574
    """

    num_restarted: Int[Array, ""] = enn.broadcast()
    num_repaired: Int[Array, ""] = enn.broadcast()
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
    sums: WindowSums
    health: ChainHealth  # moving averages of log density and acceptance, for repairs
    excluded: Int[Array, ""]
    restarted: Int[Array, ""]
    repaired: Int[Array, ""]
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

    **Stuck chains** (`repair=True`): each chain keeps a ~10-step moving average of its
    log density and acceptance. At each window's end (and the warmup's) a chain whose
    average log density lies more than `max(6 * 1.4826 * MAD, sqrt(2 dim))` below the
    healthy chains' median, or whose acceptance is below a tenth of theirs, is left out
    of the window's metric and restarted at the position of a healthy chain drawn with its
    own key; counted in `num_repaired`.

    Attributes:
        num_steps: warmup steps.
        target_acceptance: the ensemble-mean acceptance to reach; None uses the kernel's
            `default_target_acceptance` (0.234 RandomWalk, 0.574 MALA, 0.8 HMC and GHMC,
            0.9 NUTS and AdjustedMCLMC).
        metric: `"diagonal"`, `"gradient"` (a kernel whose state has a `grad`), `"dense"`
            or None.
        initial_buffer, first_window, final_buffer: the schedule (Stan's 75, 25, 50).
        initial_step_size: the heuristic's first step size (default: the kernel's).
        repair: repair chains stuck far from the ensemble at each window end (see
            **Stuck chains**); False leaves them (e.g. well-separated modes of unequal
            height, where a lower mode is not a mistake).
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
    repair: bool = eqx.field(static=True, default=True)
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
        has_metric = self._metric_mode(sampler) is not None
        p = phases(
            self.num_steps, self.initial_buffer, self.first_window, self.final_buffer, has_metric
        )
        eps0 = initial_step_size(sampler, self.initial_step_size)
        metric0 = jnp.eye(dim, dtype=dtype) if self.metric == "dense" else jnp.ones((dim,), dtype)
        carry = _Carry(
            state=state,
            averaging=averaging(jnp.log(eps0)),
            iteration=jnp.int32(0),
            metric=metric0,
            sums=WindowSums.empty(metric0, gradient=self.metric == "gradient"),
            health=ChainHealth.empty(),
            excluded=jnp.int32(0),
            restarted=jnp.int32(0),
            repaired=jnp.int32(0),
            grads=jnp.int32(0),
            final_acceptance=jnp.float32(0.0),
        )
        k_step, k_trial, k_restart = random.split(key, 3)
        k_repair = random.fold_in(k_restart, -1)  # (k_restart folds in steps >= 0)

        def body(c: _Carry, xs: tuple) -> tuple:
            t, in_window, window_start, window_end, reinit = xs
            tick(t)
            c = self._repair_non_finite(sampler, logdensity, c, random.fold_in(k_restart, t))
            c = jax.lax.cond(window_start, lambda c: self._new_window(c), lambda c: c, c)
            # At the start and after each metric update, the step-size heuristic's trials
            # run first, through the same call of the kernel as the step.
            c, eps, mean_acc = self._step(
                sampler,
                logdensity,
                c,
                random.fold_in(k_step, t),
                target,
                in_window,
                trials=(reinit, random.fold_in(k_trial, t)),
            )
            c = dataclasses.replace(  # the final stage's acceptance, for the report
                c,
                final_acceptance=(
                    c.final_acceptance + jnp.where(t >= p.last_stage, mean_acc, 0.0)
                ).astype(jnp.float32),
            )
            c = jax.lax.cond(
                window_end,
                lambda c: self._end_window(sampler, logdensity, c, random.fold_in(k_repair, t)),
                lambda c: c,
                c,
            )
            row = None
            if self.bias_monitor is not None:  # read-only: b² of the new positions
                row = self.bias_monitor.row(logdensity, c.state.position, c.grads)
            return c, (eps, mean_acc.astype(jnp.float32), row)

        xs = tuple(
            jnp.asarray(x)
            for x in (
                np.arange(self.num_steps, dtype=np.int32),
                p.in_window,
                p.window_start,
                p.window_end,
                p.reinit,
            )
        )
        c, (eps_history, acc_history, bias_history) = jax.lax.scan(body, carry, xs)
        step_size = self._tuned_step_size(c, eps_history, acc_history, target, p.last_stage)
        tuned = self._kernel(sampler, step_size, c.metric)
        if self.repair and self.num_steps - p.last_stage >= _MIN_AVERAGED:
            # Chains still stuck at the end of the final buffer would bias every draw.
            key = random.fold_in(k_repair, self.num_steps)
            c = self._repair_outliers(tuned, logdensity, c, key)
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
            num_repaired=c.repaired,
            target_acceptance=jnp.float32(target),
            acceptance=c.final_acceptance / max(self.num_steps - p.last_stage, 1),
            step_size_history=eps_history,
            acceptance_history=acc_history,
            bias_history=bias_history,
        )
        return tuned, state, info

    # -- the stages of one step ---------------------------------------------------------

    def _repair_non_finite(
        self, sampler: Sampler, logdensity: Logdensity, c: _Carry, key: PRNGKeyArray
    ) -> _Carry:
        """Restart non-finite chains at healthy positions (counted as excluded too)."""
        excluded = c.excluded + enn.chain_sum((~is_healthy(c.state)).astype(jnp.int32))
        kernel = self._kernel(sampler, jnp.exp(c.averaging.log_step_size), c.metric)
        state, restarted = restart_unhealthy(kernel, logdensity, c.state, key)
        return dataclasses.replace(
            c, state=state, excluded=excluded, restarted=c.restarted + restarted
        )

    @staticmethod
    def _new_window(c: _Carry) -> _Carry:
        return dataclasses.replace(c, sums=c.sums.restart(c.state))

    def _step(
        self,
        sampler: Sampler,
        logdensity: Logdensity,
        c: _Carry,
        key: PRNGKeyArray,
        target: float,
        in_window: Array,
        trials: tuple[Bool[Array, ""], PRNGKeyArray],
    ) -> tuple[_Carry, Float[Array, ""], Float[Array, ""]]:
        """One step of every chain, dual averaging on the ensemble-mean acceptance of the
        healthy chains, and the new position in the window sums when healthy.

        When `trials[0]`, the step-size heuristic's trial steps (`HeuristicTrials`, keys
        from `trials[1]`) come first and dual averaging restarts where they end. Trials
        and step share one loop around one `step_chain`: a second call site would compile
        the kernel's step (for NUTS, a whole tree) twice.
        """
        was_healthy = is_healthy(c.state)
        start = HeuristicTrials.start(c.averaging.log_step_size, trials[0])

        def body(loop: tuple) -> tuple:
            c, h_in, _, _ = loop
            log_eps = jnp.where(h_in.active, h_in.candidate(), c.averaging.log_step_size)
            eps = jnp.exp(log_eps).astype(jnp.float32)
            step_key = jax.lax.cond(
                h_in.active, lambda: random.fold_in(trials[1], h_in.count), lambda: key
            )
            new, info = step_chain(
                self._kernel(sampler, eps, c.metric), logdensity, c.state, step_key
            )
            acc = jnp.where(was_healthy, info.acceptance_rate, jnp.nan)
            mean_acc, _ = finite_chain_mean(acc)
            c = dataclasses.replace(c, grads=c.grads + info.num_grads)

            def trial(c: _Carry) -> tuple:
                h = h_in.after(log_eps, mean_acc, target)
                keep = lambda old, new: jnp.where(h.active, old, new)  # noqa: E731
                c = dataclasses.replace(  # trials over: dual averaging restarts there
                    c,
                    averaging=jax.tree.map(keep, c.averaging, averaging(h.result())),
                    iteration=keep(c.iteration, jnp.int32(0)),
                )
                return c, h, eps, mean_acc.astype(jnp.float32)

            def step(c: _Carry) -> tuple:
                iteration = c.iteration + 1
                c = dataclasses.replace(
                    c,
                    state=new,
                    averaging=c.averaging.update(mean_acc, target, iteration),
                    iteration=iteration,
                    sums=c.sums.add(new, is_healthy(new) & in_window),
                    health=c.health.add(new.logdensity, acc),
                )
                h = dataclasses.replace(h_in, stepped=jnp.bool_(True))
                return c, h, eps, mean_acc.astype(jnp.float32)

            return jax.lax.cond(h_in.active, trial, step, c)

        zero = jnp.zeros((), jnp.float32)
        c, _, eps, mean_acc = jax.lax.while_loop(
            lambda loop: ~loop[1].stepped, body, (c, start, zero, zero)
        )
        return c, eps, mean_acc

    def _end_window(
        self, sampler: Sampler, logdensity: Logdensity, c: _Carry, key: PRNGKeyArray
    ) -> _Carry:
        """At a window's end: the new metric from the chains that are not outliers, and
        the outliers restarted at healthy chains (with the new metric)."""
        if not self.repair:
            return dataclasses.replace(c, metric=c.sums.estimate(c.metric, self.metric))
        flagged = outliers(c.health, is_healthy(c.state), c.state.position.shape[-1])
        c = dataclasses.replace(c, metric=c.sums.estimate(c.metric, self.metric, ~flagged))
        kernel = self._kernel(sampler, jnp.exp(c.averaging.log_step_size), c.metric)
        return self._repair_outliers(kernel, logdensity, c, key, flagged)

    @staticmethod
    def _repair_outliers(
        kernel: Sampler,
        logdensity: Logdensity,
        c: _Carry,
        key: PRNGKeyArray,
        flagged: Array | None = None,
    ) -> _Carry:
        """Restart the outliers at donor chains; every chain's averages start afresh."""
        if flagged is None:
            flagged = outliers(c.health, is_healthy(c.state), c.state.position.shape[-1])
        state, repaired = restart_at_donors(kernel, logdensity, c.state, flagged, key)
        return dataclasses.replace(
            c, state=state, repaired=c.repaired + repaired, health=ChainHealth.empty()
        )

    def _tuned_step_size(
        self,
        c: _Carry,
        eps_history: Array,
        acc_history: Array,
        target: float,
        last_stage: int,
    ) -> Float[Array, ""]:
        """Dual averaging's own average still weighs the stage's first, wide iterates, and
        its iterates swing across the acceptance cliff (their mean acceptance is the
        target, the acceptance at their mean step size is not): the tuned step size is
        where a fit of acceptance against step size over the stage reaches the target."""
        averaged = jnp.exp(c.averaging.log_averaged).astype(jnp.float32)
        if self.num_steps <= last_stage:  # final_buffer=0: no stage after the metric
            return averaged
        start = max(last_stage, self.num_steps // 2)  # no metric: skip the transient
        return _step_size_for_target(eps_history[start:], acc_history[start:], target, averaged)
