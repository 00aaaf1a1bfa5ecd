"""Gaussian random-walk Metropolis, and the Metropolis-Hastings bookkeeping shared by the
adjusted gradient kernels (MALA, HMC, GHMC)."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from .._sampler import Hyper, Info, Logdensity, Sampler, State, metropolis, resolve, select

DIVERGENCE_THRESHOLD = 1000.0
"""An energy error above this (or a non-finite one) marks a transition divergent."""


def log_density(logdensity: Logdensity, position: Float[Array, " dim"]) -> Float[Array, ""]:
    """`logdensity(position)` as a scalar of the position's dtype (type-stable scan carries)."""
    return jnp.asarray(logdensity(position)).astype(jnp.result_type(position))


def metropolis_info(
    key: PRNGKeyArray,
    energy_change: Float[Array, ""],
    *,
    num_grads: Int[Array, ""] | int,
    step_size: Float[Array, ""] | float,
    divergence_threshold: float,
) -> tuple[Bool[Array, ""], Info]:
    """Accept with probability `min(1, exp(-energy_change))` and fill the `Info`.

    `energy_change` is minus the log Metropolis-Hastings ratio: `H(new) - H(old)` for
    Hamiltonian kernels, and the same quantity including the proposal correction for the
    others. A NaN counts as a rejection and, like an error above `divergence_threshold`,
    as a divergence.
    """
    accept, prob = metropolis(key, -energy_change)
    divergent = ~jnp.isfinite(energy_change) | (energy_change > divergence_threshold)
    info = Info(
        acceptance_rate=jnp.asarray(prob, jnp.float32),
        is_divergent=divergent,
        num_grads=jnp.asarray(num_grads, jnp.int32),
        energy_change=jnp.asarray(energy_change, jnp.float32),
        step_size=jnp.asarray(step_size, jnp.float32),
    )
    return accept, info


def next_count(state: State) -> State:
    """`state` with its step count advanced (every step counts, accepted or not)."""
    return eqx.tree_at(lambda s: s.count, state, state.count + 1)


class RandomWalk(Sampler):
    """Random-walk Metropolis with Gaussian proposals `x' = x + step_size * z`.

    Costs one log-density evaluation and no gradient per step. To change the proposal,
    subclass and override `proposal`; an asymmetric proposal must also override
    `log_proposal_correction` so the acceptance ratio stays exact.

    Attributes:
        step_size: the proposal's standard deviation: a number, a broadcast array (a
            `(dim,)` array gives one scale per coordinate, and `Info.step_size` then
            reports that vector), an `enn.PerChainValue` or an optax schedule of the step
            count.
        divergence_threshold: (keyword-only) a proposal whose log-density falls more
            than this below the current one (or is not finite) is reported divergent.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> logdensity = lambda x: -0.5 * (x**2).sum()
        >>> kernel = samplers.RandomWalk(step_size=0.5)
        >>> state = kernel.init(logdensity, jnp.zeros(3), jax.random.key(0))
        >>> state, info = kernel.step(logdensity, state, jax.random.key(1))
        >>> state.position.shape, int(state.count), int(info.num_grads)
        ((3,), 1, 0)
    """

    default_target_acceptance: ClassVar[float] = 0.234

    step_size: Hyper
    divergence_threshold: float = eqx.field(static=True, default=DIVERGENCE_THRESHOLD, kw_only=True)

    @property
    def grads_per_step(self) -> int:
        return 0

    def proposal(
        self, key: PRNGKeyArray, position: Float[Array, " dim"], count: Int[Array, ""]
    ) -> Float[Array, " dim"]:
        """The proposed position: a Gaussian step of scale `step_size` from `position`."""
        step_size = resolve(self.step_size, count).astype(jnp.result_type(position))
        return position + step_size * jax.random.normal(key, position.shape, position.dtype)

    def log_proposal_correction(
        self, position: Float[Array, " dim"], proposed: Float[Array, " dim"], count: Int[Array, ""]
    ) -> Float[Array, ""]:
        """`log q(position | proposed) - log q(proposed | position)`: 0 for a symmetric
        proposal such as the Gaussian random walk."""
        return jnp.zeros((), jnp.result_type(position))

    def init(
        self, logdensity: Logdensity, position: Float[Array, " dim"], key: PRNGKeyArray
    ) -> State:
        position = jnp.asarray(position)
        return State(position, log_density(logdensity, position), jnp.int32(0))

    def step(self, logdensity: Logdensity, state: State, key: PRNGKeyArray) -> tuple[State, Info]:
        key_proposal, key_accept = jax.random.split(key)
        proposed = self.proposal(key_proposal, state.position, state.count)
        logp = log_density(logdensity, proposed)
        log_ratio = (
            logp
            - state.logdensity
            + self.log_proposal_correction(state.position, proposed, state.count)
        )
        accept, info = metropolis_info(
            key_accept,
            -log_ratio,
            num_grads=0,
            step_size=resolve(self.step_size, state.count),
            divergence_threshold=self.divergence_threshold,
        )
        new = eqx.tree_at(lambda s: (s.position, s.logdensity), state, (proposed, logp))
        return next_count(select(accept, new, state)), info
