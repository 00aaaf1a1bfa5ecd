"""Hamiltonian Monte Carlo with a leapfrog integrator and a fixed (or jittered) number of
steps."""

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

import ensemblenn as enn

from .. import random
from ..integrators import sample_momentum
from ._base import Hyper, Info, Logdensity, Sampler, hyperparameter, resolve
from ._transition import (
    DIVERGENCE_THRESHOLD,
    GradientState,
    Trajectory,
    hamiltonian_proposal,
    jittered_steps,
    next_count,
    select,
)


class HMC(Sampler):
    """Hamiltonian Monte Carlo: fresh momentum, `num_integration_steps` leapfrog steps,
    a Metropolis accept/reject on the energy error.

    Momenta are drawn from `N(0, M)` and the kinetic energy is `p @ M^{-1} @ p / 2`. The
    inverse mass matrix `M^{-1}` may be a scalar, a diagonal `(dim,)` array or a dense
    `(dim, dim)` array (momenta are then drawn through its Cholesky factor).

    By default (`jitter=True`) the number of leapfrog steps of each transition is drawn
    uniformly from `{1, ..., 2 * num_integration_steps - 1}` (same mean, step size
    unchanged). A fixed number is the classic resonance: on a nearly isotropic, well-tuned
    target (a Gaussian once its metric is learnt: every direction has the same period) a
    path length near a whole period (`step_size * num_integration_steps ~ 2 pi` at unit
    scales) brings every chain back near its start at an acceptance near 1, and ESS
    collapses; near half a period each chain only jumps to its mirror image, so its `x^2`
    never changes. The drawn lengths break that lock. `jitter=False` runs exactly
    `num_integration_steps` every transition (the textbook kernel). Each chain draws its
    own length; under `vmap` the integrator loop runs until the longest one finishes, so a
    step can take up to twice the mean's time.
    The step costs one gradient per leapfrog step (the state keeps the current gradient).
    Every hyperparameter may be a number, a broadcast array, an `enn.PerChainValue` or an
    optax schedule of the step count.

    Attributes:
        step_size: the leapfrog step; None leaves it to `samplers.run`'s adaptation (as
            for `NUTS` and `MALA`, whose step size may be left out).
        num_integration_steps: leapfrog steps per transition (the trajectory length is
            `step_size * num_integration_steps`); rounded to an integer, at least 1.
        inverse_mass_matrix: `M^{-1}`, scalar, `(dim,)` or `(dim, dim)`.
        jitter: draw the number of steps per transition (default True); False for a
            fixed number, see above.
        divergence_threshold: (keyword-only) an energy error above this (or a
            non-finite one) is reported divergent.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> logdensity = lambda x: -0.5 * (x**2).sum()
        >>> kernel = samplers.HMC(step_size=0.2, num_integration_steps=8,
        ...                       inverse_mass_matrix=jnp.ones(3))
        >>> state = kernel.init(logdensity, jnp.ones(3), jax.random.key(0))
        >>> state, info = kernel.step(logdensity, state, jax.random.key(1))
        >>> 1 <= int(info.num_grads) <= 15, bool(info.acceptance_rate > 0.9)  # jittered
        (True, True)
        >>> fixed = samplers.HMC(step_size=0.2, num_integration_steps=8, jitter=False)
        >>> int(fixed.step(logdensity, state, jax.random.key(2))[1].num_grads)
        8
    """

    default_target_acceptance: ClassVar[float] = 0.8

    step_size: Hyper = hyperparameter(positive=True, tuned=True)
    num_integration_steps: Hyper = hyperparameter(positive=True, integer=True)
    inverse_mass_matrix: Hyper = hyperparameter(positive=True, shape="metric", default=1.0)
    jitter: bool = eqx.field(static=True, default=True)
    divergence_threshold: float = eqx.field(static=True, default=DIVERGENCE_THRESHOLD, kw_only=True)

    @property
    def grads_per_step(self) -> int:
        """The mean number of leapfrog steps (jitter keeps the mean); per-chain values are
        averaged and a schedule is read at step 0."""
        n = self.num_integration_steps
        if isinstance(n, enn.PerChainValue):
            n = np.mean(np.asarray(n.value))
        return max(1, int(np.round(np.asarray(resolve(n, 0)))))

    def num_steps(self, count: Int[Array, ""], key: PRNGKeyArray | None) -> Int[Array, ""]:
        """The number of leapfrog steps of this transition (drawn when `jitter`)."""
        n = jnp.maximum(jnp.round(resolve(self.num_integration_steps, count)), 1)
        n = n.astype(jnp.int32)
        return jittered_steps(n, key) if self.jitter else n

    def momentum(
        self, position: Float[Array, " dim"], count: Int[Array, ""], key: PRNGKeyArray
    ) -> Float[Array, " dim"]:
        """A fresh momentum `p ~ N(0, M)`."""
        return sample_momentum(position, resolve(self.inverse_mass_matrix, count), key)

    def init(
        self, logdensity: Logdensity, position: Float[Array, " dim"], key: PRNGKeyArray
    ) -> GradientState:
        return GradientState.at(logdensity, position)

    def step(
        self, logdensity: Logdensity, state: GradientState, key: PRNGKeyArray
    ) -> tuple[GradientState, Info]:
        key_momentum, key_length, key_accept = random.split(key, 3)
        new, info, _ = self.transition(logdensity, state, key_momentum, key_length, key_accept)
        return new, info

    def transition(
        self,
        logdensity: Logdensity,
        state: GradientState,
        key_momentum: PRNGKeyArray,
        key_length: PRNGKeyArray | None,
        key_accept: PRNGKeyArray,
    ) -> tuple[GradientState, Info, Trajectory]:
        """`step` from its three keys, also returning where the trajectory ended (accepted
        or not): for a subclass whose `step` reports more than `Info` (ChEES's kernel
        reports the proposal and its velocity). `key_length` goes to `num_steps`.

        Example:
            >>> import jax, jax.numpy as jnp, samplers
            >>> logdensity = lambda x: -0.5 * (x**2).sum()
            >>> hmc = samplers.HMC(step_size=0.2, num_integration_steps=4, jitter=False)
            >>> state = hmc.init(logdensity, jnp.ones(2), jax.random.key(0))
            >>> keys = jax.random.split(jax.random.key(1), 3)
            >>> new, info, end = hmc.transition(logdensity, state, *keys)
            >>> int(info.num_grads), end.momentum.shape
            (4, (2,))
        """
        count = state.count
        step_size = resolve(self.step_size, count)
        inverse_mass_matrix = resolve(self.inverse_mass_matrix, count)
        num_steps = self.num_steps(count, key_length)
        p0 = self.momentum(state.position, count, key_momentum)
        accept, info, end = hamiltonian_proposal(
            logdensity, state, p0, step_size, inverse_mass_matrix, num_steps, key_accept,
            divergence_threshold=self.divergence_threshold,
        )  # fmt: skip
        new = state.moved(end.position, end.logdensity, end.grad)
        return next_count(select(accept, new, state)), info, end
