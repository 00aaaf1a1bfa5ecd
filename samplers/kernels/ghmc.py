"""Generalized HMC (Horowitz): one leapfrog step per transition, partial momentum refresh,
momentum flip on rejection."""

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .. import random
from .._errors import SamplerError
from ..integrators import sample_momentum, value_and_grad
from ._base import Hyper, Info, Logdensity, Sampler, hyperparameter, resolve
from ._transition import (
    DIVERGENCE_THRESHOLD,
    GradientState,
    hamiltonian_proposal,
    next_count,
    select,
)


class GHMCState(GradientState):
    """A GHMC chain state: the gradient state plus the persistent momentum.

    `init` draws the first momentum from `N(0, M)`. If the mass matrix changes between
    steps (adaptation), the kept momentum is only approximately `N(0, M_new)` until the
    refreshes forget it.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> kernel = samplers.GHMC(step_size=0.1, momentum_persistence=0.9)
        >>> state = kernel.init(lambda x: -0.5 * (x**2).sum(), jnp.zeros(3), jax.random.key(0))
        >>> state.momentum.shape, int(state.count)
        ((3,), 0)
    """

    momentum: Float[Array, " dim"]


class GHMC(Sampler):
    """Generalized HMC: the momentum persists between transitions.

    Each transition (1) partially refreshes the momentum,
    `p <- alpha p + sqrt(1 - alpha^2) xi` with `xi ~ N(0, M)`, which leaves `N(0, M)`
    invariant; (2) takes ONE leapfrog step; (3) accepts it with probability
    `min(1, exp(-energy error))`, and on rejection keeps the position and negates the
    momentum. The flip makes the joint move exact; with `alpha` near 1 the chain moves
    in long, almost deterministic trajectories (like HMC) while staying one gradient
    per step. `alpha = 0` is MALA (with mass matrix `M`).

    There is no `jitter` (unlike `HMC` and `AdjustedMCLMC`): a transition is one leapfrog
    step, so there is no path length to draw. The partial refresh already randomises how
    long the momentum persists (its memory decays geometrically, and every rejection
    flips it), so the trajectories have no fixed length to resonate with the target's
    periods.

    Give the persistence either directly (`momentum_persistence`, the `alpha` above) or as
    a Langevin friction per unit time (`damping`, `gamma`), in which case
    `alpha = exp(-gamma * step_size)`: the exact Ornstein-Uhlenbeck refresh over one step.
    Every hyperparameter may be a number, a broadcast array, an `enn.PerChainValue` or an
    optax schedule of the step count.

    Attributes:
        step_size: the leapfrog step; None (the default) leaves it to the adaptation.
        momentum_persistence: `alpha` in `[0, 1]`.
        damping: `gamma >= 0`; exclusive with `momentum_persistence`.
        inverse_mass_matrix: `M^{-1}`, scalar, `(dim,)` or `(dim, dim)`.
        divergence_threshold: (keyword-only) an energy error above this (or a
            non-finite one) is reported divergent.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> logdensity = lambda x: -0.5 * (x**2).sum()
        >>> kernel = samplers.GHMC(step_size=0.3, momentum_persistence=0.9)
        >>> state = kernel.init(logdensity, jnp.zeros(2), jax.random.key(0))
        >>> state, info = kernel.step(logdensity, state, jax.random.key(1))
        >>> state.momentum.shape, int(info.num_grads)
        ((2,), 1)
        >>> round(float(samplers.GHMC(step_size=0.3, damping=1.0).persistence(0.3, 0)), 3)
        0.741
    """

    default_target_acceptance: ClassVar[float] = 0.8

    step_size: Hyper = hyperparameter(positive=True, tuned=True, default=None)
    momentum_persistence: Hyper = hyperparameter(nonnegative=True, maximum=1.0, default=None)
    damping: Hyper = hyperparameter(nonnegative=True, default=None)
    inverse_mass_matrix: Hyper = hyperparameter(positive=True, shape="metric", default=1.0)
    divergence_threshold: float = eqx.field(static=True, default=DIVERGENCE_THRESHOLD, kw_only=True)

    def __check_init__(self) -> None:
        if (self.momentum_persistence is None) == (self.damping is None):
            raise SamplerError(
                "GHMC needs exactly one of momentum_persistence (alpha, the fraction of the "
                "momentum kept each step) and damping (gamma, alpha = exp(-gamma * "
                "step_size)).\n  fix: samplers.GHMC(step_size=0.1, momentum_persistence=0.9)"
                "\n   or: samplers.GHMC(step_size=0.1, damping=1.0)"
            )

    def persistence(
        self, step_size: Float[Array, ""] | float, count: Int[Array, ""] | int
    ) -> Float[Array, ""]:
        """`alpha`, the fraction of the momentum kept by this transition's refresh."""
        if self.damping is not None:
            return jnp.exp(-resolve(self.damping, count) * step_size)
        return resolve(self.momentum_persistence, count)

    def refresh(
        self,
        momentum: Float[Array, " dim"],
        alpha: Float[Array, ""],
        inverse_mass_matrix: Array,
        key: PRNGKeyArray,
    ) -> Float[Array, " dim"]:
        """Partial refresh `alpha p + sqrt(1 - alpha^2) xi`, `xi ~ N(0, M)`."""
        alpha = jnp.asarray(alpha, momentum.dtype)
        noise = sample_momentum(momentum, inverse_mass_matrix, key)
        return alpha * momentum + jnp.sqrt(1 - alpha**2) * noise

    def init(
        self, logdensity: Logdensity, position: Float[Array, " dim"], key: PRNGKeyArray
    ) -> GHMCState:
        position = jnp.asarray(position)
        logp, grad = value_and_grad(logdensity)(position)
        momentum = sample_momentum(position, resolve(self.inverse_mass_matrix, 0), key)
        return GHMCState(position, logp, jnp.int32(0), grad, momentum)

    def step(
        self, logdensity: Logdensity, state: GHMCState, key: PRNGKeyArray
    ) -> tuple[GHMCState, Info]:
        key_refresh, key_accept = random.split(key)
        count = state.count
        step_size = resolve(self.step_size, count)
        inverse_mass_matrix = resolve(self.inverse_mass_matrix, count)
        p0 = self.refresh(
            state.momentum, self.persistence(step_size, count), inverse_mass_matrix, key_refresh
        )
        accept, info, end = hamiltonian_proposal(
            logdensity, state, p0, step_size, inverse_mass_matrix, 1, key_accept,
            divergence_threshold=self.divergence_threshold,
        )  # fmt: skip
        new = GHMCState(end.position, end.logdensity, count, end.grad, end.momentum)
        # Rejected: stay, with the refreshed momentum reversed (Horowitz's flip).
        old = GHMCState(state.position, state.logdensity, count, state.grad, -p0)
        return next_count(select(accept, new, old)), info
