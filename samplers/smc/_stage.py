"""One SMC stage, written for ONE particle: resample (and measure the population), then
move and evaluate.

A stage is two `enn.ensemble_map` programs, each compiled once and reused at every
temperature (the temperature, the tuned kernel and the keys are operands). Cross-particle work goes
through the collectives (resampling's gather, the population's metric); per-particle
work (the kernel's steps, the log densities) runs through `enn.batch_invariant` blocks
when the map has a `block_size`, so a whole run can be the same bits on any device count.
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

import ensemblenn as enn

from .. import random
from ..kernels import Sampler, init_chain, step_chain
from ._particles import Tempered
from ._resampling import resample
from ._tuning import population_metric


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

        def move(carry: tuple, t: Array) -> tuple:
            state, accepted = carry
            state, info = step_chain(kernel, tempered, state, random.fold_in(own, t))
            rate = jnp.where(jnp.isfinite(info.acceptance_rate), info.acceptance_rate, 0.0)
            return (state, accepted + rate.astype(jnp.float32)), None

        steps = jnp.arange(1, self.num_steps + 1, dtype=jnp.int32)
        (state, accepted), _ = jax.lax.scan(move, (state, jnp.float32(0.0)), steps)
        log_prior, log_likelihood = enn.batch_invariant(tempered.parts)(state.position)
        # The acceptances' sum (its mean is taken on the host: a division here may become a
        # reciprocal multiply in one device count's program and not another's).
        return state.position, log_prior, log_likelihood, accepted
