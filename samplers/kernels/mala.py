"""The Metropolis-adjusted Langevin algorithm."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from ..integrators import value_and_grad
from ._base import Hyper, Info, Logdensity, Sampler, hyperparameter, resolve
from ._transition import DIVERGENCE_THRESHOLD, GradientState, metropolis_info, next_count, select


class MALA(Sampler):
    """Metropolis-adjusted Langevin: a Langevin proposal corrected by Metropolis-Hastings.

    The proposal is `x' = x + (h^2 / 2) grad log p(x) + h z`, `z ~ N(0, I)`, with
    `h = step_size`. With this convention MALA is exactly HMC with one leapfrog step of
    size `h` and unit mass, so step sizes are comparable between the two. The proposal is
    not symmetric; the acceptance ratio includes `log q(x | x') - log q(x' | x)`.
    One gradient per step (at the proposal; the current one is kept in the state).

    Attributes:
        step_size: `h`: a number, a broadcast array, an `enn.PerChainValue` or an optax
            schedule of the step count.
        divergence_threshold: (keyword-only) an energy error above this (or a
            non-finite one) is reported divergent.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> logdensity = lambda x: -0.5 * (x**2).sum()
        >>> kernel = samplers.MALA(step_size=0.8)
        >>> state = kernel.init(logdensity, jnp.ones(2), jax.random.key(0))
        >>> state.grad.tolist()
        [-1.0, -1.0]
        >>> state, info = kernel.step(logdensity, state, jax.random.key(1))
        >>> int(info.num_grads), round(float(info.step_size), 6)
        (1, 0.8)
    """

    default_target_acceptance: ClassVar[float] = 0.574

    step_size: Hyper = hyperparameter(positive=True)
    divergence_threshold: float = eqx.field(static=True, default=DIVERGENCE_THRESHOLD, kw_only=True)

    def proposal(
        self,
        position: Float[Array, " dim"],
        grad: Float[Array, " dim"],
        count: Int[Array, ""],
        key: PRNGKeyArray,
    ) -> Float[Array, " dim"]:
        """A draw from the Langevin proposal `q(. | position)`."""
        h = resolve(self.step_size, count).astype(jnp.result_type(position))
        noise = jax.random.normal(key, position.shape, position.dtype)
        return position + 0.5 * h**2 * grad + h * noise

    def log_proposal_density(
        self,
        to: Float[Array, " dim"],
        start: Float[Array, " dim"],
        grad_start: Float[Array, " dim"],
        count: Int[Array, ""],
    ) -> Float[Array, ""]:
        """`log q(to | start)` up to a constant that cancels in the acceptance ratio."""
        h = resolve(self.step_size, count).astype(jnp.result_type(to))
        mean = start + 0.5 * h**2 * grad_start
        return -0.5 * jnp.sum((to - mean) ** 2) / h**2

    def init(
        self, logdensity: Logdensity, position: Float[Array, " dim"], key: PRNGKeyArray
    ) -> GradientState:
        return GradientState.at(logdensity, position)

    def step(
        self, logdensity: Logdensity, state: GradientState, key: PRNGKeyArray
    ) -> tuple[GradientState, Info]:
        key_proposal, key_accept = jax.random.split(key)
        x, count = state.position, state.count
        proposed = self.proposal(x, state.grad, count, key_proposal)
        logp, grad = value_and_grad(logdensity)(proposed)
        log_ratio = (
            logp
            - state.logdensity
            + self.log_proposal_density(x, proposed, grad, count)
            - self.log_proposal_density(proposed, x, state.grad, count)
        )
        accept, info = metropolis_info(
            -log_ratio,
            key_accept,
            num_grads=1,
            step_size=resolve(self.step_size, count),
            divergence_threshold=self.divergence_threshold,
        )
        new = eqx.tree_at(
            lambda s: (s.position, s.logdensity, s.grad), state, (proposed, logp, grad)
        )
        return next_count(select(accept, new, state)), info
