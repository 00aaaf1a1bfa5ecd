"""The Metropolis-adjusted Langevin algorithm, optionally preconditioned by a metric."""

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular
from jaxtyping import Array, Float, Int, PRNGKeyArray

import ensemblenn as enn

from .. import random
from ..integrators import InverseMassMatrix, sample_momentum, value_and_grad, velocity
from ._base import Hyper, Info, Logdensity, Sampler, hyperparameter, resolve
from ._transition import DIVERGENCE_THRESHOLD, GradientState, metropolis_info, next_count, select


def _inverse_quadratic(r: Float[Array, " dim"], metric: InverseMassMatrix) -> Float[Array, ""]:
    """`r @ A^{-1} @ r` for a scalar, diagonal or dense (Cholesky-factored) `A`."""
    metric = jnp.asarray(metric, r.dtype)
    if metric.ndim == 2:
        white = solve_triangular(jnp.linalg.cholesky(metric), r, lower=True)
        # A fixed order: jnp.sum's rounded differently on 1 and 4 devices (AVX-512 CPU).
        return enn.ordered_sum(white**2)
    return enn.ordered_sum(r**2 / metric)


class MALA(Sampler):
    """Metropolis-adjusted Langevin: a Langevin proposal corrected by Metropolis-Hastings.

    With `h = step_size` (a scalar or a `(dim,)` vector, `D = diag(h)`) and
    `A = inverse_mass_matrix` the proposal is
    `x' = x + (1/2) D A D grad log p(x) + D A p`, `p ~ N(0, A^{-1})`, i.e. Gaussian with
    mean `x + (1/2) S grad log p(x)` and covariance `S = D A D`. This is exactly one
    leapfrog step of `HMC(step_size=h, num_integration_steps=1, inverse_mass_matrix=A)`
    from momentum `p`, and the Metropolis-Hastings ratio, which includes
    `log q(x | x') - log q(x' | x)`, equals that HMC step's `exp(-energy change)`: same
    proposal, same acceptance, so step sizes and metrics are comparable between the two.
    `samplers.WindowAdaptation` tunes `A` like HMC's. One gradient per step (at the
    proposal; the current one is kept in the state).

    Attributes:
        step_size: `h`: a number, a broadcast array, an `enn.PerChainValue` or an optax
            schedule of the step count; None (the default) leaves it to the adaptation.
        inverse_mass_matrix: `A`, the metric: a scalar, a diagonal `(dim,)` or a dense
            `(dim, dim)` array (same conventions and checks as `HMC`'s); 1.0 or None is
            the identity (plain MALA).
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
        >>> scaled = samplers.MALA(step_size=0.8, inverse_mass_matrix=jnp.array([1.0, 4.0]))
        >>> state, info = scaled.step(logdensity, state, jax.random.key(2))
        >>> int(info.num_grads)
        1
    """

    default_target_acceptance: ClassVar[float] = 0.574

    step_size: Hyper = hyperparameter(positive=True, tuned=True, default=None)
    inverse_mass_matrix: Hyper | None = hyperparameter(positive=True, shape="metric", default=1.0)
    divergence_threshold: float = eqx.field(static=True, default=DIVERGENCE_THRESHOLD, kw_only=True)

    def metric(self, count: Int[Array, ""] | int) -> Array:
        """The inverse mass matrix `A` at step `count` (None: the identity, 1.0)."""
        if self.inverse_mass_matrix is None:
            return jnp.ones(())
        return resolve(self.inverse_mass_matrix, count)

    def proposal(
        self,
        position: Float[Array, " dim"],
        grad: Float[Array, " dim"],
        count: Int[Array, ""],
        key: PRNGKeyArray,
    ) -> Float[Array, " dim"]:
        """A draw from the Langevin proposal `q(. | position)`: one leapfrog step from a
        momentum `p ~ N(0, A^{-1})` (the same draw as `HMC.momentum` with the same key)."""
        h = resolve(self.step_size, count).astype(jnp.result_type(position))
        metric = self.metric(count)
        momentum = sample_momentum(position, metric, key)
        # (enn.rounded: no fused multiply-add, whose use depends on the program around
        # the step, so on the device count.)
        drift = velocity(momentum + enn.rounded(0.5 * h * grad), metric)
        return position + enn.rounded(h * drift)

    def log_proposal_density(
        self,
        to: Float[Array, " dim"],
        start: Float[Array, " dim"],
        grad_start: Float[Array, " dim"],
        count: Int[Array, ""],
    ) -> Float[Array, ""]:
        """`log q(to | start)` up to a constant that cancels in the acceptance ratio.

        With `S = D A D`: `-(to - mean) @ S^{-1} @ (to - mean) / 2`, computed as
        `-r @ A^{-1} @ r / 2` with `r = (to - mean) / h` coordinate by coordinate (a vector
        step size divides each coordinate by its own `h` before the sum). The
        normaliser `-log det S / 2` does not depend on `to` or `start`.
        """
        h = resolve(self.step_size, count).astype(jnp.result_type(to))
        metric = self.metric(count)
        mean = start + enn.rounded(0.5 * h * velocity(h * grad_start, metric))
        return -0.5 * _inverse_quadratic((to - mean) / h, metric)

    def init(
        self, logdensity: Logdensity, position: Float[Array, " dim"], key: PRNGKeyArray
    ) -> GradientState:
        return GradientState.at(logdensity, position)

    def step(
        self, logdensity: Logdensity, state: GradientState, key: PRNGKeyArray
    ) -> tuple[GradientState, Info]:
        key_proposal, key_accept = random.split(key)
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
        new = state.moved(proposed, logp, grad)
        return next_count(select(accept, new, state)), info
