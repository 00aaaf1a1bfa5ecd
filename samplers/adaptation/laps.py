"""LAPS: late-adjusted parallel sampler (Robnik & Seljak, arXiv:2601.16696).

"Metropolis adjustment is best served warm": an ensemble first runs unadjusted MCLMC, which
reaches the typical set fast but keeps an asymptotic bias, and only then switches to the
Metropolis-adjusted kernel (MAMS), which removes that bias. Both phases are tuned from
cross-chain statistics, so they need no per-chain warmup history.

Phases (all inside the one `ensemble_map` call that `samplers.run` makes for adaptation,
so the whole scheme compiles once and runs under an outer `jax.jit`):

0. Every chain's unit velocity points along its gradient; the ensemble's diagonal
   equipartition `E_ii = <-x_i d_i log p>` (1 at stationarity) flips the components where
   the ensemble is too concentrated (`E_ii < 1`), so those coordinates first move outwards.
1. Unadjusted ensemble MCLMC. After every step the ensemble averages `x`, `x²`, `x⁴`, the
   equipartition and the energy error; from them come the diagonal metric, the momentum
   decoherence length `L` and the step size, which is driven towards the energy error per
   dimension that the equipartition bias can tolerate. Phase 1 ends after `num_steps1`
   steps, or earlier once the ensemble mean of `x²` stops drifting.
2. Adjusted MCLMC with the phase-1 ensemble variances as diagonal metric; its step size is
   bisected to the target ensemble acceptance for `num_adaptation_steps` steps, then frozen.
"""

import math
import typing
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

import ensemblenn as enn

from .. import diagnostics as diag
from .. import random
from .._errors import SamplerError, SamplerTypeError
from ..integrators.isokinetic import IntegratorName, get_integrator
from ..kernels import (
    MCLMC,
    AdjustedMCLMC,
    AdjustedMCLMCState,
    Logdensity,
    MCLMCState,
    Sampler,
    init_chain,
    step_chain,
)
from ..welford import Welford
from ._base import finite_chain_mean
from ._bias_monitor import BiasMonitor, monitor_field
from ._protocol import Adaptation
from ._restart import is_healthy
from ._ticks import tick

__all__ = ["LAPS", "LAPSInfo"]

_GRID = 64  # phase-1 step sizes live on the grid 2^(k / _GRID)


class LAPSInfo(eqx.Module):
    """What a LAPS adaptation reports (the same in every chain).

    Attributes:
        num_steps1: unadjusted (phase-1) steps taken.
        stopped_early: phase 1 ended by the drift criterion, before `num_steps1`.
        stopping_statistic: the last value of that criterion (see `LAPS`).
        step_size1: the final phase-1 (MCLMC) step size.
        L: the final phase-1 momentum decoherence length.
        step_size: the tuned phase-2 step size (also in the returned sampler).
        num_integration_steps: integrator steps per phase-2 proposal.
        acceptance: ensemble-mean acceptance of the last phase-2 adaptation step.
        num_excluded: chain-steps left out of the cross-chain means as non-finite.
        num_divergent: chain-steps that diverged from a finite state (a phase-1 step that
            was reverted, or a phase-2 proposal flagged divergent).
        num_restarted: chains that were non-finite after phase 1 and were restarted from
            a healthy chain's position.
        num_grads: gradient evaluations per chain over the whole adaptation.
        nested_rhat1: nested R-hat per dimension over the last complete window of
            `save_frac * num_steps1` phase-1 steps (None with fewer than 2 superchains).
        nested_rhat2: nested R-hat per dimension over the phase-2 adaptation steps.
        step_size_history1, L_history, stopping_history: phase-1 values per step
            (entries after `num_steps1` steps are 0).
        step_size_history2, acceptance_history2: phase-2 values per adaptation step.
        bias_history: with `track_bias=True` and a reference, `(num_steps1 +
            num_adaptation_steps, 3)` rows of (b² max, b² mean, gradients per chain so far,
            the initialisations included) after each phase-1 then phase-2 step; the rows
            of phase-1 steps not taken (early stop) are NaN. Else None.

    A run's `result.adaptation_info` holds it.

    Example:
        >>> import jax, samplers
        >>> target = samplers.targets.IllConditionedGaussian(dim=4, condition_number=10.0)
        >>> laps = samplers.LAPS(num_steps1=60, num_adaptation_steps=10)
        >>> positions = jax.random.normal(jax.random.key(0), (16, 4))
        >>> result = samplers.run(None, target, positions, key=jax.random.key(1),
        ...                       num_steps=20, adaptation=laps, progress=False)
        >>> info = result.adaptation_info
        >>> int(info.num_excluded), int(info.num_restarted), info.step_size_history2.shape
        (0, 0, (10,))
        >>> bool(info.step_size == result.sampler.step_size)
        True
    """

    num_steps1: Int[Array, ""] = enn.broadcast()
    stopped_early: Bool[Array, ""] = enn.broadcast()
    stopping_statistic: Float[Array, ""] = enn.broadcast()
    step_size1: Float[Array, ""] = enn.broadcast()
    L: Float[Array, ""] = enn.broadcast()
    step_size: Float[Array, ""] = enn.broadcast()
    num_integration_steps: Int[Array, ""] = enn.broadcast()
    acceptance: Float[Array, ""] = enn.broadcast()
    num_excluded: Int[Array, ""] = enn.broadcast()
    num_divergent: Int[Array, ""] = enn.broadcast()
    num_restarted: Int[Array, ""] = enn.broadcast()
    num_grads: Int[Array, ""] = enn.broadcast()
    nested_rhat1: Float[Array, " dim"] | None = enn.broadcast()
    nested_rhat2: Float[Array, " dim"] | None = enn.broadcast()
    step_size_history1: Float[Array, " num_steps1"] = enn.broadcast()
    L_history: Float[Array, " num_steps1"] = enn.broadcast()
    stopping_history: Float[Array, " num_steps1"] = enn.broadcast()
    step_size_history2: Float[Array, " num_adaptation_steps"] = enn.broadcast()
    acceptance_history2: Float[Array, " num_adaptation_steps"] = enn.broadcast()
    bias_history: Float[Array, "steps 3"] | None = enn.broadcast(default=None, kw_only=True)


class _Phase1(eqx.Module):
    """The phase-1 loop carry (per-chain and ensemble-wide leaves together)."""

    t: Int[Array, ""]
    state: MCLMCState
    log2_step_size: Float[Array, ""]  # on the grid of `_GRID`
    L: Float[Array, ""]
    imm: Float[Array, " dim"]
    second: Float[Array, "window dim"]  # ensemble means of x², last `window` steps
    second_var: Float[Array, "window dim"]  # cross-chain variances of x²
    first: Float[Array, "window dim"]  # ensemble means of x
    statistic: Float[Array, ""]
    stopped: Bool[Array, ""]
    excluded: Int[Array, ""]
    divergent: Int[Array, ""]
    block: Welford  # this chain, current window-sized block of steps
    last_block: Welford  # this chain, last complete block
    history: Float[Array, "3 num_steps1"]
    bias: Float[Array, "num_steps1 3"] | None  # b² rows, with a bias monitor


class _Phase2(eqx.Module):
    state: AdjustedMCLMCState
    log_step_size: Float[Array, ""]
    low: Float[Array, ""]  # bisection bracket on log step size
    high: Float[Array, ""]
    excluded: Int[Array, ""]
    divergent: Int[Array, ""]
    grads: Int[Array, ""]
    moments: Welford


def _mean(x: Array, axis: int = -1) -> Array:
    return enn.ordered_sum(x, axis) / x.shape[axis]


def _snap(x: Array) -> Array:
    """Round a positive `x` to the grid `2^(k / _GRID)` (relative spacing 1.1 %)."""
    return jnp.exp2(jnp.round(jnp.log2(x) * _GRID) / _GRID)


def _gradient_direction(g: Array, fallback: Array) -> Array:
    """`g / |g|`, or `fallback` where that is not finite."""
    # Scale by max|g| first: |g| itself overflows float32 for |g| ~ 1e20.
    scale = jnp.max(jnp.abs(g))
    u = g / jnp.where(scale > 0, scale, 1.0)
    u = u / jnp.linalg.norm(u)
    return jnp.where(jnp.all(jnp.isfinite(u)) & (scale > 0), u, fallback)


def _keep_valid(new: Array, old: Array) -> Array:
    """`new` where it is a finite positive hyperparameter, else `old`."""
    return jnp.where(jnp.isfinite(new) & (new > 0), new, old)


INTEGRATOR_NAMES = typing.get_args(IntegratorName)


class LAPS(Adaptation):
    """Late-adjusted parallel sampler: ensemble MCLMC burn-in, then tuned adjusted MCLMC.

    `run` returns a tuned `samplers.AdjustedMCLMC` (its step size, number of integration
    steps and diagonal inverse mass matrix are arrays, identical in every chain), the
    chains' phase-2 states, and a `LAPSInfo`. Pass `sampler=None` to `samplers.run`.

    Phase 1 (unadjusted MCLMC, up to `num_steps1` steps, leapfrog by default):

    * Metric: the identity by default, as in BlackJAX. `precondition_burn_in=True` uses the
      current cross-chain variances instead; on the 100-d Gaussian of condition number 100
      that gives a better phase-2 metric (within ~25 % of the truth rather than 0.8-2.2x)
      and ~15 % more ESS, but the step size then chases a moving metric, and in one seed of
      eight it threw a few chains far out in one coordinate just before the early stop,
      leaving b² at 0.013. The identity was stable in every seed, hence the default.
    * `L = alpha sqrt(sum_i Var x_i / m_i)` in the metric's coordinates (`alpha sqrt(d)` once
      preconditioned); infinite, i.e. no noise, on the first step.
    * Step size: starts at `initial_step_size * sqrt(d)` and is multiplied after every step
      by `clip((C bias^(3/8) / EEVPD)^(1/6), 0.3, 3)`, where `EEVPD = Var(E) / d` is the
      cross-chain variance of the energy error per dimension and `bias = mean_i (1 -
      E_ii)²` the equipartition bias. It is halved after a step in which some chain
      diverged *from a finite state*: a chain that is already non-finite is excluded rather
      than allowed to ratchet the step size down for everyone. The update is snapped to the
      grid `2^(k/64)`, so last-bit differences in the energy errors (XLA compiles the user's
      log density differently for different numbers of chains per device) almost never
      change it, and the run is the same on any device count.
    * Non-finite chains are left out of every mean (`finite_chain_mean`) and counted; an
      update that is not finite and positive is skipped.
    * Early stop: the ensemble means of `x²` over the last `window = round(save_frac *
      num_steps1)` steps are kept. The statistic is their variance over that window in
      units of the cross-chain variance of `x²` (a b²-like drift), averaged over
      coordinates, minus the `1 / num_chains` that a stationary ensemble of independent
      chains would show; phase 1 ends once it is below `r_end`. BlackJAX's default (the
      relative fluctuation of the ensemble mean of `x`) divides by a mean near zero and
      never stops on centred targets; this one measures `x²` on the scale of the final b².

    Between the phases, chains that are still non-finite are restarted at the position of a
    healthy chain (`restart_diverged`), so one diverged chain does not stay in the samples.

    Phase 2 (adjusted MCLMC, `num_adaptation_steps` steps):

    * Metric: the ensemble variance averaged over the last phase-1 window (less noisy than
      one step's), snapped to the same grid.
    * Trajectory: the phase-1 `L` in the coordinates whitened by that metric,
      `trajectory_factor * alpha * sqrt(sum_i Var x_i / m_i)` (about `alpha sqrt(d)`), so
      `num_integration_steps = clip(round(length / step_size), 1, max_integration_steps)`
      follows the step size, where BlackJAX fixes 15 steps per proposal. Once the metric
      whitens the target the tuned step is itself about `L` long: both test targets end
      with one McLachlan step (2 gradients) per proposal instead of 30 gradients.
    * Step size: starts at the phase-1 one rescaled to the new metric, then bisection in log
      space on the ensemble-mean acceptance: double or halve until the target is bracketed,
      then split the bracket; a step within `acceptance_tolerance` of the target leaves it
      unchanged, and a bracket that noise collapsed is reopened by 25 %. The tuned value is
      the geometric mean over the second half of the steps, since with `n` chains the
      acceptance is only known to about `0.5 / sqrt(n)`.
    * Integrator and target acceptance: McLachlan and 0.7 for `d <= 200`, Omelyan and 0.9
      above (as BlackJAX).

    Attributes:
        num_steps1: maximum number of phase-1 steps (static).
        num_adaptation_steps: phase-2 step-size tuning steps (static).
        alpha: `L` in units of the ensemble's total standard deviation.
        C: energy-error-per-dimension scale of the phase-1 step-size rule.
        r_end: early-stop threshold on the drift statistic.
        save_frac: the early-stop window as a fraction of `num_steps1` (static).
        early_stop: whether phase 1 may stop before `num_steps1` (static).
        initial_step_size: the first phase-1 step size divided by `sqrt(d)`.
        burn_in_integrator: phase-1 integrator (static; leapfrog: one gradient per step).
        precondition_burn_in: also use the running ensemble variances as the phase-1
            metric (static; BlackJAX keeps the identity there).
        integrator: phase-2 integrator, None for the dimension-based default (static).
        target_acceptance: phase-2 target, None for the integrator's default.
        acceptance_tolerance: half-width of the accepted band around the target.
        trajectory_factor: phase-2 trajectory length in units of the whitened `L`.
        max_integration_steps: cap on integrator steps per proposal (static).
        L_proposal_factor: in-trajectory refresh length in units of the trajectory length.
        superchain_size: consecutive chains per superchain for nested R-hat (static).
        restart_diverged: restart chains that are non-finite after phase 1 (static).
        bias_monitor: a `BiasMonitor` that `samplers.run(..., track_bias=True)` attaches
            (`with_bias_monitor`) to record b² after every step; None otherwise.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> target = samplers.targets.IllConditionedGaussian(dim=4, condition_number=10.0)
        >>> laps = samplers.LAPS(num_steps1=60, num_adaptation_steps=10)
        >>> positions = jax.random.normal(jax.random.key(0), (16, 4))
        >>> result = samplers.run(None, target, positions, key=jax.random.key(1),
        ...                       num_steps=20, adaptation=laps, progress=False)
        >>> type(result.sampler).__name__, result.sampler.inverse_mass_matrix.shape
        ('AdjustedMCLMC', (4,))
        >>> bool(result.adaptation_info.num_steps1 <= 60)
        True
    """

    num_steps1: int = eqx.field(static=True, default=500)
    num_adaptation_steps: int = eqx.field(static=True, default=30)
    alpha: float = 1.9
    C: float = 0.1
    r_end: float = 0.01
    save_frac: float = eqx.field(static=True, default=0.2)
    early_stop: bool = eqx.field(static=True, default=True)
    initial_step_size: float = 0.01
    burn_in_integrator: IntegratorName = eqx.field(static=True, default="leapfrog")
    precondition_burn_in: bool = eqx.field(static=True, default=False)
    integrator: IntegratorName | None = eqx.field(static=True, default=None)
    target_acceptance: float | None = None
    acceptance_tolerance: float = 0.03
    trajectory_factor: float = 1.0
    max_integration_steps: int = eqx.field(static=True, default=64)
    L_proposal_factor: float = 1.25
    superchain_size: int = eqx.field(static=True, default=1)
    restart_diverged: bool = eqx.field(static=True, default=True)
    bias_monitor: BiasMonitor | None = monitor_field()

    def __check_init__(self):
        for name in (
            "num_steps1",
            "num_adaptation_steps",
            "max_integration_steps",
            "superchain_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise SamplerTypeError(
                    f"LAPS: {name} must be an int >= 1, got {value!r} ({type(value).__name__})."
                )
            if value < 1:
                raise SamplerError(f"LAPS: {name} must be an int >= 1, got {value!r}.")
        for name in ("early_stop", "precondition_burn_in", "restart_diverged"):
            if not isinstance(getattr(self, name), bool):
                raise SamplerTypeError(
                    f"LAPS: {name} must be True or False, got {getattr(self, name)!r}."
                )
        self._check_numbers()
        for name in ("burn_in_integrator", "integrator"):
            value = getattr(self, name)
            if value is not None and value not in INTEGRATOR_NAMES:
                raise SamplerError(
                    f"LAPS: {name} must be one of {INTEGRATOR_NAMES}"
                    f"{' or None' if name == 'integrator' else ''}, got {value!r}."
                )

    def _check_numbers(self) -> None:
        # (name, low, high): open intervals, except save_frac's (0, 1].
        numbers = [
            ("alpha", 0.0, math.inf),
            ("C", 0.0, math.inf),
            ("r_end", 0.0, math.inf),
            ("initial_step_size", 0.0, math.inf),
            ("acceptance_tolerance", 0.0, 1.0),
            ("trajectory_factor", 0.0, math.inf),
            ("L_proposal_factor", 0.0, math.inf),
            ("save_frac", 0.0, 1.0 + 1e-12),
        ]
        if self.target_acceptance is not None:
            numbers.append(("target_acceptance", 0.0, 1.0))
        for name, low, high in numbers:
            value = getattr(self, name)
            if isinstance(value, jax.core.Tracer):
                continue
            if isinstance(value, bool | str) or not isinstance(
                value, int | float | np.number | jax.Array
            ):
                raise SamplerTypeError(
                    f"LAPS: {name} must be a number, got {value!r} ({type(value).__name__})."
                )
            if not (low < float(value) < high):
                interval = "(0, 1]" if name == "save_frac" else (
                    f"({low:g}, {high:g})" if high < math.inf else "> 0 and finite"
                )  # fmt: skip
                raise SamplerError(
                    f"LAPS: {name} must be {interval}, "
                    f"got {value!r}.\n  fix: leave it out for the default "
                    f"({type(self).__dataclass_fields__[name].default!r})."
                )

    @property
    def window(self) -> int:
        """Phase-1 steps the early-stop statistic looks back over."""
        return max(1, min(self.num_steps1, round(self.save_frac * self.num_steps1)))

    def phase2_settings(self, dim: int) -> tuple[IntegratorName, float]:
        """`(integrator, target acceptance)` of phase 2 for dimension `dim`."""
        name = self.integrator or ("mclachlan" if dim <= 200 else "omelyan")
        target = self.target_acceptance
        if target is None:
            target = 0.9 if name == "omelyan" else 0.7
        return name, target

    def initial_state(
        self,
        sampler: Sampler | None,
        logdensity: Logdensity,
        position: Float[Array, " dim"],
        key: PRNGKeyArray,
    ) -> MCLMCState:
        """An MCLMC state at `position` (one gradient); phase 0 sets its velocity."""
        if sampler is not None:
            raise enn.EnsembleError(
                f"LAPS builds its own kernels (MCLMC, then AdjustedMCLMC); got sampler "
                f"{type(sampler).__name__}.\n  fix: samplers.run(None, logdensity, positions, "
                "adaptation=samplers.LAPS(...), ...)."
            )
        return init_chain(MCLMC(step_size=1.0, L=math.inf), logdensity, position, key)

    # --- phase 0 -------------------------------------------------------------------------

    def _equipartition_velocity(self, state: MCLMCState) -> tuple[MCLMCState, Array]:
        x, g = state.position, state.grad
        u = enn.batch_invariant(_gradient_direction)(g, state.velocity)
        equipartition, excluded = finite_chain_mean(-x * g)
        signs = jnp.where(equipartition >= 1.0, 1.0, -1.0).astype(u.dtype)
        return eqx.tree_at(lambda s: s.velocity, state, signs * u), excluded

    # --- phase 1 -------------------------------------------------------------------------

    def _phase1_step(self, logdensity: Logdensity, key: PRNGKeyArray, c: _Phase1) -> _Phase1:
        dim = c.state.position.shape[-1]
        window = self.window
        kernel = MCLMC(
            step_size=jnp.exp2(c.log2_step_size),
            L=c.L,
            inverse_mass_matrix=c.imm,
            integrator=self.burn_in_integrator,
        )
        tick(c.t)
        was_healthy = is_healthy(c.state)
        state, info = step_chain(kernel, logdensity, c.state, random.fold_in(key, c.t))
        x, g = state.position, state.grad
        x2 = x * x
        energy = info.energy_change.astype(x.dtype)
        # One concatenated vector: one cross-chain reduction per step instead of six.
        stats = jnp.concatenate([x, x2, x2 * x2, -x * g, jnp.stack([energy, energy * energy])])
        flat, bad = finite_chain_mean(stats)
        parts = jnp.split(flat, [dim, 2 * dim, 3 * dim, 4 * dim, 4 * dim + 1])
        means = dict(zip(("x", "x2", "x4", "equipartition", "energy", "energy2"), parts))
        means["energy"], means["energy2"] = means["energy"][0], means["energy2"][0]
        # Only divergences that the step itself caused say the step size is too large.
        fresh = enn.chain_sum((info.is_divergent & was_healthy).astype(jnp.int32))
        any_ok = bad < enn.num_chains()

        var = jnp.maximum(means["x2"] - enn.rounded(means["x"] ** 2), 0.0)
        bias = _mean((1.0 - means["equipartition"]) ** 2)
        eevpd = jnp.maximum(means["energy2"] - enn.rounded(means["energy"] ** 2), 0.0) / dim
        wanted = self.C * bias**0.375
        log2_factor = jnp.clip(jnp.log2(wanted / eevpd) / 6.0, math.log2(0.3), math.log2(3.0))
        log2_factor = jnp.where(jnp.isfinite(log2_factor), log2_factor, 0.0)  # 0/0: no info
        # Snap the update to the grid: the energy errors carry the last bits of the user's
        # log density, which XLA may round differently for another number of chains per
        # device; on the grid such differences (almost always) vanish, so the whole run is
        # the same on any device count.
        log2_factor = jnp.round(log2_factor * _GRID) / _GRID - jnp.where(fresh > 0, 1.0, 0.0)
        log2_step_size = jnp.where(
            any_ok, jnp.clip(c.log2_step_size + log2_factor, -60, 60), c.log2_step_size
        )
        step_size = jnp.exp2(log2_step_size)
        imm = c.imm
        if self.precondition_burn_in:
            imm = jnp.where(any_ok & jnp.isfinite(var) & (var > 0), var, imm)
        # Identical chains (e.g. all started at one point) have no spread to set L from;
        # they would stay identical without noise, so then refresh on the step-size scale.
        fallback = jnp.where(jnp.isfinite(c.L), c.L, step_size)
        L = jnp.where(
            any_ok, _keep_valid(self.alpha * jnp.sqrt(enn.ordered_sum(var / imm)), fallback), c.L
        )

        slot = c.t % window
        second = c.second.at[slot].set(jnp.where(any_ok, means["x2"], c.second[slot - 1]))
        second_var = c.second_var.at[slot].set(
            jnp.where(
                any_ok,
                jnp.maximum(means["x4"] - enn.rounded(means["x2"] ** 2), 0.0),
                c.second_var[slot - 1],
            )
        )
        first = c.first.at[slot].set(jnp.where(any_ok, means["x"], c.first[slot - 1]))
        full = c.t + 1 >= window
        drift = _mean((second - _mean(second, 0)) ** 2, 0)
        scale = _mean(second_var, 0)
        ratio = jnp.where(scale > 0, drift / jnp.where(scale > 0, scale, 1.0), 0.0)
        floor = 1.0 / jnp.maximum(enn.num_chains() - bad, 1).astype(ratio.dtype)
        statistic = jnp.where(full, _mean(ratio) - floor, jnp.inf)
        stopped = full & (statistic < self.r_end) if self.early_stop else jnp.asarray(False)

        block = c.block.update(x)
        complete = (c.t + 1) % window == 0
        last_block = jax.tree.map(
            lambda new, old: jnp.where(complete, new, old), block, c.last_block
        )
        block = jax.tree.map(lambda z, b: jnp.where(complete, z, b), Welford.zeros_like(x), block)
        history = c.history.at[:, c.t].set(
            jnp.stack([step_size, L, jnp.where(full, statistic, 0.0)]).astype(jnp.float32)
        )
        bias = c.bias
        if self.bias_monitor is not None:  # + 1: the initial state's gradient
            grads = 1 + (c.t + 1) * get_integrator(self.burn_in_integrator).grads_per_step
            bias = self.bias_monitor.record(bias, c.t, logdensity, x, grads)
        return _Phase1(
            c.t + 1,
            state,
            log2_step_size,
            L,
            imm,
            second,
            second_var,
            first,
            statistic,
            stopped,
            c.excluded + bad,
            c.divergent + fresh,
            block,
            last_block,
            history,
            bias,
        )

    def _phase1(
        self, logdensity: Logdensity, state: MCLMCState, key: PRNGKeyArray, excluded: Int[Array, ""]
    ) -> _Phase1:
        x = state.position
        dim, dtype, window = x.shape[-1], x.dtype, self.window
        empty = jnp.zeros((window, dim), dtype)
        zero = Welford.zeros_like(x)
        start = _Phase1(
            t=jnp.int32(0),
            state=state,
            log2_step_size=jnp.round(
                jnp.log2(jnp.asarray(self.initial_step_size * math.sqrt(dim), dtype)) * _GRID
            )
            / _GRID,
            L=jnp.asarray(jnp.inf, dtype),
            imm=jnp.ones(dim, dtype),
            second=empty,
            second_var=empty,
            first=empty,
            statistic=jnp.asarray(jnp.inf, dtype),
            stopped=jnp.asarray(False),
            excluded=excluded,
            divergent=jnp.int32(0),
            block=zero,
            last_block=zero,
            history=jnp.zeros((3, self.num_steps1), jnp.float32),
            bias=None if self.bias_monitor is None else BiasMonitor.empty(self.num_steps1),
        )
        return jax.lax.while_loop(
            lambda c: (c.t < self.num_steps1) & ~c.stopped,
            lambda c: self._phase1_step(logdensity, key, c),
            start,
        )

    # --- between the phases --------------------------------------------------------------

    def _restart(
        self, position: Float[Array, " dim"], healthy: Bool[Array, ""]
    ) -> tuple[Array, Int[Array, ""]]:
        """Move every unhealthy chain to a healthy chain's position (round robin)."""

        def restart(position: Array) -> Array:
            every_ok = enn.chain_all_gather(healthy)
            every_x = enn.chain_all_gather(position)
            num_ok = every_ok.sum()
            # The k-th unhealthy chain takes the (k mod num_ok)-th healthy chain's position.
            rank = (jnp.cumsum(~every_ok)[enn.chain_index()] - 1) % jnp.maximum(num_ok, 1)
            donor = jnp.argmax(every_ok & (jnp.cumsum(every_ok) - 1 == rank))
            return jnp.where(~healthy & (num_ok > 0), every_x[donor], position)

        num_bad = enn.chain_sum((~healthy).astype(jnp.int32))
        num_ok = enn.num_chains() - num_bad
        # The same branch on every device (num_bad is ensemble-wide): the gather of every
        # position, (num_chains, dim) per device, happens only when a chain needs it.
        new = jax.lax.cond(num_bad > 0, restart, lambda p: p, position)
        return new, jnp.where(num_ok > 0, num_bad, 0)

    def _nested_rhat(self, moments: Welford) -> Float[Array, " dim"] | None:
        num = enn.num_chains()
        k = self.superchain_size
        if num % k:
            raise enn.EnsembleError(
                f"LAPS: superchain_size={k} does not divide num_chains={num}; superchains "
                "are consecutive groups of equal size."
            )
        if num // k < 2:
            return None
        n = moments.count.astype(moments.mean.dtype)
        var = moments.m2 / jnp.maximum(n, 1.0)
        mean, var, count = enn.chain_all_gather((moments.mean, var, moments.count))
        return diag.nested_rhat_from_moments(mean, var, count.min(), superchain_size=k)

    # --- phase 2 -------------------------------------------------------------------------

    def _phase2_step(
        self,
        logdensity: Logdensity,
        key: PRNGKeyArray,
        kernel_for: Any,
        target: float,
        grads_before: Int[Array, ""],
        c: _Phase2,
        t: Int[Array, ""],
    ) -> tuple[_Phase2, tuple[Array, Array, Array | None]]:
        kernel = kernel_for(jnp.exp(c.log_step_size))
        tick(self.num_steps1 + t)  # the bar counts phase 1's whole length
        was_healthy = is_healthy(c.state)
        state, info = step_chain(kernel, logdensity, c.state, random.fold_in(key, t))
        means, bad = finite_chain_mean(
            {"acceptance": info.acceptance_rate, "x2": state.position * state.position}
        )
        acceptance = means["acceptance"]
        divergent = enn.chain_sum((info.is_divergent & was_healthy).astype(jnp.int32))

        # Log-space bisection: bracket the target (doubling/halving), then split the bracket.
        # A bracket that noise (or the ensemble moving) has collapsed is reopened on that
        # side by a modest factor: doubling from a tuned value rejects nearly everything.
        log_h, low, high = c.log_step_size, c.low, c.high
        tiny, reopen = math.log(1.01), math.log(1.25)
        inside = jnp.abs(acceptance - target) <= self.acceptance_tolerance
        too_small = acceptance > target  # accepting too often: increase the step
        low = jnp.where(~inside & too_small, log_h, low)
        high = jnp.where(~inside & ~too_small, log_h, high)
        collapsed = ~inside & (high - low < tiny)
        high = jnp.where(collapsed & too_small, log_h + reopen, high)
        low = jnp.where(collapsed & ~too_small, log_h - reopen, low)
        bracketed = jnp.isfinite(low) & jnp.isfinite(high)
        proposal = jnp.where(
            bracketed,
            0.5 * (low + high),
            jnp.where(too_small, log_h + math.log(2.0), log_h - math.log(2.0)),
        )
        any_ok = bad < enn.num_chains()
        log_h = jnp.where(inside | ~any_ok | ~jnp.isfinite(proposal), log_h, proposal)

        grads = info.num_grads  # the same in every chain: num_steps is ensemble-wide
        new = _Phase2(
            state,
            log_h,
            low,
            high,
            c.excluded + bad,
            c.divergent + divergent,
            c.grads + grads,
            c.moments.update(state.position),
        )
        row = None
        if self.bias_monitor is not None:
            row = self.bias_monitor.row(logdensity, state.position, grads_before + new.grads)
        return new, (c.log_step_size, acceptance.astype(jnp.float32), row)

    # --- the whole adaptation ------------------------------------------------------------

    def run(
        self, sampler: Sampler | None, logdensity: Logdensity, state: MCLMCState, key: PRNGKeyArray
    ) -> tuple[AdjustedMCLMC, AdjustedMCLMCState, LAPSInfo]:
        """Phases 0-2 for one chain (inside `ensemble_map`); see the class docstring."""
        x0 = state.position
        dim, dtype = x0.shape[-1], x0.dtype
        k1, k2, k_init = random.split(key, 3)

        state, excluded0 = self._equipartition_velocity(state)
        p1 = self._phase1(logdensity, state, k1, excluded0)

        # Phase-2 metric: the ensemble variance averaged over the last phase-1 window.
        # Snapped to the grid like the phase-1 step size (0.5 % is far below the metric's
        # statistical error), so that the tuned sampler is the same on any device count.
        var = jnp.maximum(_mean(p1.second, 0) - enn.rounded(_mean(p1.first, 0) ** 2), 0.0)
        imm = jnp.where(jnp.isfinite(var) & (var > 0), _snap(var), 1.0)
        length = self.trajectory_factor * self.alpha * jnp.sqrt(enn.ordered_sum(var / imm))
        length = _keep_valid(length, jnp.asarray(self.alpha * math.sqrt(dim), dtype))
        # The phase-1 step moves a distance ~ step_size * sqrt(m1); keep that distance.
        step_size1 = jnp.exp2(p1.log2_step_size)
        step_size = _snap(step_size1 / jnp.sqrt(_mean(imm / p1.imm)))
        step_size = _keep_valid(step_size, jnp.asarray(0.1, dtype))

        position = p1.state.position
        restarted = jnp.int32(0)
        if self.restart_diverged:
            healthy = is_healthy(p1.state)
            position, restarted = self._restart(position, healthy)

        name, target = self.phase2_settings(dim)

        def steps_for(h: Array) -> Array:
            n = jnp.round(length / h)
            n = jnp.where(jnp.isfinite(n), n, self.max_integration_steps)
            return jnp.clip(n, 1, self.max_integration_steps).astype(jnp.int32)

        def kernel_for(h: Array) -> AdjustedMCLMC:
            return AdjustedMCLMC(
                step_size=h,
                num_integration_steps=steps_for(h),
                inverse_mass_matrix=imm,
                L_proposal_factor=self.L_proposal_factor,
                integrator=name,
                # The fixed length of the LAPS paper: its in-trajectory velocity refresh
                # (a finite L_proposal_factor) is what breaks the resonance.
                jitter=False,
            )

        kernel = kernel_for(step_size)
        state2 = init_chain(kernel, logdensity, position, k_init)
        start = _Phase2(
            state2,
            jnp.log(step_size),
            jnp.asarray(-jnp.inf, dtype),
            jnp.asarray(jnp.inf, dtype),
            jnp.int32(0),
            jnp.int32(0),
            jnp.int32(0),
            Welford.zeros_like(position),
        )
        grads1 = p1.t * get_integrator(self.burn_in_integrator).grads_per_step
        before = 2 + grads1  # the two initialisations and phase 1
        p2, (log_h_history, acc_history, bias2) = jax.lax.scan(
            lambda c, t: self._phase2_step(logdensity, k2, kernel_for, target, before, c, t),
            start,
            jnp.arange(self.num_adaptation_steps),
        )

        # The ensemble acceptance is noisy (about 0.5 / sqrt(num_chains)), so the bisection
        # ends up hopping around the target: average the log step sizes of the second half.
        half = log_h_history[self.num_adaptation_steps // 2 :]
        final_h = _snap(jnp.exp(_mean(half, 0)))
        final_h = _keep_valid(final_h, jnp.exp(p2.log_step_size))
        tuned = kernel_for(final_h)
        info = LAPSInfo(
            num_steps1=p1.t,
            stopped_early=p1.stopped,
            stopping_statistic=p1.statistic,
            step_size1=step_size1,
            L=p1.L,
            step_size=final_h,
            num_integration_steps=steps_for(final_h),
            acceptance=acc_history[-1],
            num_excluded=p1.excluded + p2.excluded,
            num_divergent=p1.divergent + p2.divergent,
            num_restarted=restarted,
            num_grads=2 + grads1 + p2.grads,  # + the two initialisations
            nested_rhat1=self._nested_rhat(p1.last_block),
            nested_rhat2=self._nested_rhat(p2.moments),
            step_size_history1=p1.history[0],
            L_history=p1.history[1],
            stopping_history=p1.history[2],
            step_size_history2=jnp.exp(log_h_history).astype(jnp.float32),
            acceptance_history2=acc_history,
            bias_history=None if bias2 is None else jnp.concatenate([p1.bias, bias2]),
        )
        return tuned, p2.state, info

    @property
    def total_steps(self) -> int:
        return self.num_steps1 + self.num_adaptation_steps

    @property
    def grads_per_chain(self) -> int | None:
        return None  # early stopping and the adaptive trajectory make it data dependent
