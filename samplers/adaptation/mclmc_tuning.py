"""MCLMCTuning: unadjusted MCLMC tuned by LAPS's unadjusted phase (phases 0-1 of `LAPS`).

The command line's default tuning for `--sampler mclmc`: no new tuning rule, the one `LAPS`
already uses and tests, on the identity metric LAPS's phase 1 uses; the tuned kernel stays
unadjusted (no Metropolis phase 2).
"""

import math
from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

import ensemblenn as enn

from ..kernels import MCLMC, Sampler
from ._bias_monitor import BiasMonitor, monitor_field
from ._protocol import Adaptation
from .laps import LAPS

__all__ = ["MCLMCTuning", "MCLMCTuningInfo"]


class MCLMCTuningInfo(eqx.Module):
    """What an `MCLMCTuning` adaptation reports (the same in every chain).

    Attributes:
        num_steps: unadjusted (phase-1) steps taken.
        stopped_early: phase 1 ended by LAPS's drift criterion, before `num_steps`.
        step_size: the tuned MCLMC step size (also in the returned sampler).
        L: the tuned momentum decoherence length (also in the returned sampler).
        num_excluded: chain-steps left out of the cross-chain means as non-finite.
        num_grads: gradient evaluations per chain over the whole adaptation.
        bias_history: with `track_bias=True` and a reference, `(num_steps, 3)` rows of
            (b² max, b² mean, gradients per chain so far); None otherwise.

    Example:
        >>> import jax, samplers
        >>> target = samplers.targets.IllConditionedGaussian(dim=4, condition_number=10.0)
        >>> result = samplers.run(None, target, jax.random.normal(jax.random.key(0), (8, 4)),
        ...                       key=jax.random.key(1), num_steps=5, progress=False,
        ...                       adaptation=samplers.MCLMCTuning(num_steps=20))
        >>> info = result.adaptation_info
        >>> type(info).__name__, bool(info.num_steps <= 20), int(info.num_excluded)
        ('MCLMCTuningInfo', True, 0)
    """

    num_steps: Int[Array, ""] = enn.broadcast()
    stopped_early: Any = enn.broadcast()
    step_size: Float[Array, ""] = enn.broadcast()
    L: Float[Array, ""] = enn.broadcast()
    num_excluded: Int[Array, ""] = enn.broadcast()
    num_grads: Int[Array, ""] = enn.broadcast()
    bias_history: Float[Array, "steps 3"] | None = enn.broadcast(default=None)


class MCLMCTuning(Adaptation):
    """Tune unadjusted MCLMC with LAPS's phase 1, and sample with the tuned MCLMC.

    Runs phases 0-1 of `LAPS` (`LAPS(num_steps1=num_steps)`): every chain's velocity
    starts along its gradient with the ensemble's equipartition flips, then unadjusted
    ensemble MCLMC runs with its step size driven by the energy error per dimension and
    `L` from the ensemble's spread, stopping early once the ensemble's `E[x²]` stops
    drifting. The result is an `MCLMC` with the tuned `step_size`, `L` (`sqrt(d)` if the
    spread gave no finite `L`), phase 1's inverse mass matrix and integrator; it stays
    unadjusted, so it keeps MCLMC's small asymptotic bias (use `LAPS` to remove it).

    The `sampler` passed to `samplers.run` is ignored (pass None): the kernel is built
    here. This is the command line's default for `--sampler mclmc`.

    Attributes:
        num_steps: maximum number of unadjusted tuning steps (static).
        bias_monitor: a `BiasMonitor` that `samplers.run(..., track_bias=True)` attaches
            (`with_bias_monitor`) to record b² after every step; None otherwise.

    Example:
        >>> import jax, samplers
        >>> target = samplers.targets.IllConditionedGaussian(dim=4, condition_number=10.0)
        >>> result = samplers.run(None, target, jax.random.normal(jax.random.key(0), (8, 4)),
        ...                       key=jax.random.key(1), num_steps=5, progress=False,
        ...                       adaptation=samplers.MCLMCTuning(num_steps=20))
        >>> type(result.sampler).__name__, bool(result.sampler.step_size > 0)
        ('MCLMC', True)
    """

    num_steps: int = eqx.field(static=True, default=500)
    bias_monitor: BiasMonitor | None = monitor_field()

    @property
    def laps(self) -> LAPS:
        return LAPS(num_steps1=self.num_steps, bias_monitor=self.bias_monitor)

    def initial_state(self, sampler: Sampler | None, logdensity: Any, position: Any, key: Any):
        return self.laps.initial_state(sampler, logdensity, position, key)

    def run(self, sampler: Sampler | None, logdensity: Any, state: Any, key: Any) -> tuple:
        laps = self.laps
        state, excluded = laps._equipartition_velocity(state)
        p1 = laps._phase1(logdensity, state, key, excluded)
        step_size = jnp.exp2(p1.log2_step_size)
        L = jnp.where(jnp.isfinite(p1.L), p1.L, math.sqrt(state.position.shape[-1]))
        tuned = MCLMC(step_size=step_size, L=L, inverse_mass_matrix=p1.imm,
                      integrator=laps.burn_in_integrator)  # fmt: skip
        info = MCLMCTuningInfo(p1.t, p1.stopped, step_size, L, p1.excluded, 1 + p1.t, p1.bias)
        return tuned, p1.state, info
