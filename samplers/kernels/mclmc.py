"""MCLMC: unadjusted microcanonical Langevin Monte Carlo (Robnik, De Luca, Silverstein & Seljak).

Isokinetic (unit-speed) dynamics with a partial velocity refresh after every step. There is
no Metropolis test: the step size controls the bias, and the energy error of each step
(whose variance per dimension is the usual tuning signal) is reported in `Info`.
"""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from ..integrators import value_and_grad
from ..integrators.isokinetic import (
    IntegratorName,
    IntegratorState,
    IsokineticIntegrator,
    get_integrator,
    partially_refresh_velocity,
    random_unit_vector,
)
from ._base import Hyper, Info, Logdensity, Sampler, State, hyperparameter, resolve
from ._transition import all_finite, select

__all__ = ["MCLMC", "MCLMCState"]


class MCLMCState(State):
    """One chain of MCLMC: `State` plus the unit velocity and the cached gradient.

    Attributes:
        velocity: unit-norm velocity in the coordinates whitened by the preconditioner.
        grad: `grad log p(position)`.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> state = samplers.MCLMC(step_size=0.5, L=2.0).init(
        ...     lambda x: -0.5 * jnp.sum(x**2), jnp.ones(3), jax.random.key(0))
        >>> state.grad.tolist(), round(float(jnp.linalg.norm(state.velocity)), 5)
        ([-1.0, -1.0, -1.0], 1.0)
    """

    velocity: Float[Array, " dim"]
    grad: Float[Array, " dim"]


class MCLMC(Sampler):
    """Unadjusted microcanonical Langevin Monte Carlo for one chain.

    Each step integrates the isokinetic dynamics for time `step_size` (McLachlan's
    minimal-norm integrator by default), then partially refreshes the velocity,
    `u <- normalise(c u + sqrt(1 - c^2) z / sqrt(d))` with `c = exp(-step_size / L)`.
    A step that produces a non-finite position, velocity, log density, gradient or energy
    is reverted (position kept, velocity refreshed), flagged `is_divergent` and reported
    with acceptance 0, so one bad chain cannot poison ensemble statistics.

    Attributes:
        step_size: integration step size `eps`.
        L: momentum decoherence length (`inf`: no refresh, pure deterministic dynamics).
        inverse_mass_matrix: diagonal preconditioner `m` (scalar or shape `(dim,)`); the
            position moves by `eps * sqrt(m) * u`, so `m` ~ the target's variances.
        integrator: `"mclachlan"` (2 gradients/step), `"leapfrog"` (1), `"omelyan"` (4) or an
            `IsokineticIntegrator` (static).

    Every hyperparameter may be a number, a broadcast array, an `enn.PerChainValue` or a
    schedule of the step count. `Info.energy_change` is the step's energy error (kinetic
    change plus change of `-log p`); it is 0 for a reverted step.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> logdensity = lambda x: -0.5 * jnp.sum(x**2)
        >>> kernel = samplers.MCLMC(step_size=0.5, L=2.0)
        >>> state = kernel.init(logdensity, jnp.ones(3), jax.random.key(0))
        >>> state, info = kernel.step(logdensity, state, jax.random.key(1))
        >>> int(state.count), int(info.num_grads), float(info.acceptance_rate)
        (1, 2, 1.0)
    """

    adjusted = False  # no Metropolis correction: acceptance is 1 (0 if non-finite)

    step_size: Hyper = hyperparameter(positive=True)
    L: Hyper = hyperparameter(positive=True, finite=False)  # inf: no momentum noise
    inverse_mass_matrix: Hyper = hyperparameter(positive=True, default=1.0)
    integrator: IntegratorName | IsokineticIntegrator = eqx.field(static=True, default="mclachlan")

    @property
    def integrator_fn(self) -> IsokineticIntegrator:
        """The resolved integrator."""
        return get_integrator(self.integrator)

    @property
    def grads_per_step(self) -> int:
        return self.integrator_fn.grads_per_step

    def hyperparameters(self, count) -> tuple[Array, Array, Array]:
        """`(step_size, L, inverse_mass_matrix)` for this chain at step `count`."""
        return (
            resolve(self.step_size, count),
            resolve(self.L, count),
            resolve(self.inverse_mass_matrix, count),
        )

    def init(
        self, logdensity: Logdensity, position: Float[Array, " dim"], key: PRNGKeyArray
    ) -> MCLMCState:
        """Start at `position` with a uniformly random unit velocity."""
        position = jnp.asarray(position)
        logp, grad = value_and_grad(logdensity)(position)
        velocity = random_unit_vector(position.shape[-1], key, position.dtype)
        return MCLMCState(position, logp, jnp.zeros((), jnp.int32), velocity, grad)

    def refresh(
        self, velocity: Float[Array, " dim"], step_size: Array, L: Array, key: PRNGKeyArray
    ) -> Float[Array, " dim"]:
        """The Langevin part: partial velocity refresh (override for other noise)."""
        return partially_refresh_velocity(velocity, step_size, L, key)

    def integrate(
        self,
        logdensity: Logdensity,
        state: MCLMCState,
        step_size: Array,
        inverse_mass_matrix: Array,
    ) -> tuple[IntegratorState, Array]:
        """The deterministic part: one integrator step; returns the kinetic change too."""
        start = IntegratorState(state.position, state.velocity, state.logdensity, state.grad)
        return self.integrator_fn(logdensity, start, step_size, inverse_mass_matrix)

    def step(
        self, logdensity: Logdensity, state: MCLMCState, key: PRNGKeyArray
    ) -> tuple[MCLMCState, Info]:
        step_size, L, imm = self.hyperparameters(state.count)
        new, kinetic_change = self.integrate(logdensity, state, step_size, imm)
        energy_change = kinetic_change - (new.logdensity - state.logdensity)
        finite = all_finite(new, energy_change)
        # On a reverted step the old velocity still gets the noise, so a chain stuck at a
        # bad direction is not retried with exactly the same move.
        velocity = self.refresh(jnp.where(finite, new.velocity, state.velocity), step_size, L, key)
        proposed = MCLMCState(new.position, new.logdensity, state.count + 1, velocity, new.grad)
        kept = MCLMCState(state.position, state.logdensity, state.count + 1, velocity, state.grad)
        dtype = jnp.result_type(state.position)
        info = Info(
            acceptance_rate=finite.astype(dtype),
            is_divergent=~finite,
            num_grads=jnp.asarray(self.grads_per_step, jnp.int32),
            energy_change=jnp.where(finite, energy_change, 0.0).astype(dtype),
            step_size=jnp.asarray(step_size, dtype),
        )
        return select(finite, proposed, kept), info
