"""Gaussian random-walk Metropolis."""

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .. import random
from ._base import Hyper, Info, Logdensity, Sampler, State, hyperparameter, resolve
from ._transition import DIVERGENCE_THRESHOLD, log_density, metropolis_info, next_count, select


class RandomWalk(Sampler):
    """Random-walk Metropolis with Gaussian proposals `x' = x + step_size * z`.

    Costs one log-density evaluation and no gradient per step. To change the proposal,
    subclass and override `proposal`; an asymmetric proposal must also override
    `log_proposal_correction` so the acceptance ratio stays exact.

    Attributes:
        step_size: the proposal's standard deviation: a number, a broadcast array (a
            `(dim,)` array gives one scale per coordinate, and `Info.step_size` then
            reports that vector), an `enn.PerChainValue` or an optax schedule of the step
            count; None (the default) leaves it to the adaptation.
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

    step_size: Hyper = hyperparameter(positive=True, tuned=True, default=None)
    divergence_threshold: float = eqx.field(static=True, default=DIVERGENCE_THRESHOLD, kw_only=True)

    @property
    def grads_per_step(self) -> int:
        return 0

    def proposal(
        self, position: Float[Array, " dim"], count: Int[Array, ""], key: PRNGKeyArray
    ) -> Float[Array, " dim"]:
        """The proposed position: a Gaussian step of scale `step_size` from `position`."""
        step_size = resolve(self.step_size, count).astype(jnp.result_type(position))
        return position + step_size * random.normal(key, position.shape, position.dtype)

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
        key_proposal, key_accept = random.split(key)
        proposed = self.proposal(state.position, state.count, key_proposal)
        logp = log_density(logdensity, proposed)
        log_ratio = (
            logp
            - state.logdensity
            + self.log_proposal_correction(state.position, proposed, state.count)
        )
        accept, info = metropolis_info(
            -log_ratio,
            key_accept,
            num_grads=0,
            step_size=resolve(self.step_size, state.count),
            divergence_threshold=self.divergence_threshold,
        )
        new = eqx.tree_at(lambda s: (s.position, s.logdensity), state, (proposed, logp))
        return next_count(select(accept, new, state)), info
