"""One SMC stage, written for ONE particle: resample (and measure the population), then
move and evaluate. Waste-free SMC's stage is written for ONE chain of the `M = N / P`
resampled particles: `ResampleChains`, then `MoveChains`, which returns the chain's `P`
states.

A stage is two `enn.ensemble_map` programs, each compiled once and reused at every
temperature (the temperature, the tuned kernel and the keys are operands). Cross-particle work goes
through the collectives (resampling's gather, the population's metric); per-particle
work (the kernel's steps, the log densities) runs through `enn.batch_invariant` blocks
when the map has a `block_size`, so a whole run can be the same bits on any device count.
"""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

import ensemblenn as enn

from .. import random
from ..kernels import Sampler, init_chain, step_chain
from ._particles import Tempered
from ._resampling import _ancestors, resample
from ._tuning import population_metric


def _kernel_step(kernel: Sampler, tempered: Tempered, own: PRNGKeyArray) -> Callable:
    """The scan body of a particle's moves: step `t` (keyed by `t`) and the running sum of
    its finite acceptance rates. `Move` and `MoveChains` scan it."""

    def step(carry: tuple, t: Array) -> tuple:
        state, accepted = carry
        state, info = step_chain(kernel, tempered, state, random.fold_in(own, t))
        rate = jnp.where(jnp.isfinite(info.acceptance_rate), info.acceptance_rate, 0.0)
        return (state, accepted + rate.astype(jnp.float32)), None

    return step


class Evaluate(eqx.Module):
    """`(log prior, log likelihood)` of one flat particle (the initial population's)."""

    def __call__(self, x: Float[Array, " dim"], tempered: Tempered) -> tuple[Array, Array]:
        return enn.batch_invariant(tempered.parts)(x)


class Resample(eqx.Module):
    """Reweighted particles in, equally weighted ones out, with the population's metric.

    Static fields only, so equal configurations share one compiled program.
    """

    scheme: str = eqx.field(static=True)
    metric: Any = eqx.field(static=True)

    def __call__(
        self, x: Float[Array, " dim"], log_weight: Float[Array, ""], key: PRNGKeyArray
    ) -> tuple[Array, Int[Array, ""], Array | None]:
        x, ancestor = resample(key, log_weight, x, scheme=self.scheme)
        # From the resampled population: equally weighted draws of this stage's target
        # (before the moves), the same on every particle.
        return x, ancestor, population_metric(x, self.metric)


class Move(eqx.Module):
    """`num_steps` kernel steps of one particle at the tempered target, then its log
    prior and log likelihood, and the sum of its acceptance rates.

    A program of its own, apart from `Resample`: the metric then enters it as an operand,
    as a user's metric enters `samplers.run`'s programs. (Computed in the same program
    from the collectives, it let XLA compile the kernel's arithmetic differently for
    another device count: MALA's acceptance probabilities differed in the last bit.)
    """

    num_steps: int = eqx.field(static=True)

    def __call__(
        self, x: Float[Array, " dim"], kernel: Sampler, tempered: Tempered, key: PRNGKeyArray
    ) -> tuple[Array, Array, Array, Array]:
        own = random.fold_in(key, enn.chain_index())
        state = init_chain(kernel, tempered, x, random.fold_in(own, 0))

        steps = jnp.arange(1, self.num_steps + 1, dtype=jnp.int32)
        move = _kernel_step(kernel, tempered, own)
        (state, accepted), _ = jax.lax.scan(move, (state, jnp.float32(0.0)), steps)
        log_prior, log_likelihood = enn.batch_invariant(tempered.parts)(state.position)
        # The acceptances' sum (its mean is taken on the host: a division here may become a
        # reciprocal multiply in one device count's program and not another's).
        return state.position, log_prior, log_likelihood, accepted


class ResampleChains(eqx.Module):
    """Waste-free SMC's resampling, for ONE of the `M` chains: this chain's start, drawn from
    all `N` reweighted particles (`M` ancestors of their weights), and the metric of the `M`
    starts.

    The `N` particles and their log weights enter whole (broadcast: the all-gather of
    `resample`, done by the layout); `slot` is the chain's index in `[0, M)`, the one
    per-chain operand, which sets the ensemble's size to `M`.
    """

    scheme: str = eqx.field(static=True)
    metric: Any = eqx.field(static=True)

    def __call__(
        self, slot: Int[Array, ""], x: Float[Array, "N dim"], log_weights: Float[Array, " N"],
        key: PRNGKeyArray,
    ) -> tuple[Array, Int[Array, ""], Array | None]:  # fmt: skip
        # The same M ancestors on every device, computed once (they do not depend on slot).
        ancestor = _ancestors(key, log_weights, self.scheme, enn.num_chains())[slot]
        start = x[ancestor]
        return start, ancestor, population_metric(start, self.metric)


class MoveChains(eqx.Module):
    """Waste-free SMC's moves, for ONE chain: from its start, `length - 1` kept states, each
    `num_steps` kernel steps after the one before, at the tempered target. Returns the
    chain's `length` states (the start first), their log priors and log likelihoods, and
    the sum of its acceptance rates. A program of its own, as `Move` is.
    """

    num_steps: int = eqx.field(static=True)
    length: int = eqx.field(static=True)

    def __call__(
        self, x: Float[Array, " dim"], kernel: Sampler, tempered: Tempered, key: PRNGKeyArray
    ) -> tuple[Array, Array, Array, Array]:
        own = random.fold_in(key, enn.chain_index())
        state = init_chain(kernel, tempered, x, random.fold_in(own, 0))
        parts = enn.batch_invariant(tempered.parts)

        step = _kernel_step(kernel, tempered, own)

        def keep(carry: tuple, steps: Array) -> tuple:
            carry, _ = jax.lax.scan(step, carry, steps)
            position = carry[0].position
            return carry, (position, *parts(position))

        # Step t (1-based, as Move's) of the whole chain: kept state j ends at j * num_steps.
        steps = jnp.arange(1, (self.length - 1) * self.num_steps + 1, dtype=jnp.int32)
        steps = steps.reshape(self.length - 1, self.num_steps)
        (_, accepted), kept = jax.lax.scan(keep, (state, jnp.float32(0.0)), steps)
        first = (x, *parts(x))
        path, log_prior, log_likelihood = (
            jnp.concatenate([jnp.asarray(a)[None], b]) for a, b in zip(first, kept, strict=True)
        )
        return path, log_prior, log_likelihood, accepted
