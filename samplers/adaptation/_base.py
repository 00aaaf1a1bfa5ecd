"""Ensemble adaptation built from per-chain statistics and cross-chain means."""

import abc
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

import ensemblenn as enn

from .. import random
from ..kernels import Info, Logdensity, Sampler, State, step_chain
from ._bias_monitor import BiasMonitor, monitor_field
from ._protocol import Adaptation
from ._ticks import tick


def finite_chain_mean(stats: PyTree) -> tuple[PyTree, Int[Array, ""]]:
    """Cross-chain mean of each leaf over the chains whose statistics are all finite.

    A diverging chain (any non-finite leaf) is left out of every mean and counted, so one
    bad chain cannot turn an ensemble-tuned hyperparameter into NaN. Reductions use the
    device-count-invariant collectives. If every chain is non-finite the means are 0.

    Returns:
        `(means, num_excluded)`.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> from samplers.adaptation import finite_chain_mean
        >>> mean = enn.ensemble_map(finite_chain_mean, in_roles=enn.PER_CHAIN)
        >>> means, num_excluded = mean(jnp.array([1.0, 2.0, jnp.nan, 3.0]))
        >>> float(means), int(num_excluded)
        (2.0, 1)
    """
    leaves = jax.tree.leaves(stats)
    ok = jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in leaves])) if leaves else True
    weight = jnp.asarray(ok, jnp.float32)
    count = enn.chain_sum(weight)
    means = jax.tree.map(
        lambda x: enn.chain_sum(jnp.where(ok, x, jnp.zeros_like(x))) / jnp.maximum(count, 1.0),
        stats,
    )
    excluded = enn.num_chains() - count.astype(jnp.int32)
    return means, excluded


class AdaptationInfo(eqx.Module):
    """What an `EnsembleAdaptation` reports (the same for every chain).

    Attributes:
        num_steps: adaptation steps actually taken (early stopping may cut them short).
        num_excluded: chain-steps left out of the cross-chain means as non-finite.
        num_grads: gradient evaluations per chain spent adapting.
        bias_history: with `track_bias=True` and a reference, `(num_steps, 3)` rows of
            (b² max, b² mean, gradients per chain so far) after each step, NaN after the
            last step taken; else None. `Result.adaptation_bias` holds its used rows.

    A run's `result.adaptation_info` holds it (see `EnsembleAdaptation` for a run).

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> from samplers.adaptation import AdaptationInfo
        >>> info = AdaptationInfo(num_steps=jnp.int32(80), num_excluded=jnp.int32(0),
        ...                       num_grads=jnp.int32(160))  # 80 steps of a 2-gradient kernel
        >>> int(info.num_grads) // int(info.num_steps), enn.role_of(info, "num_grads")
        (2, enn.BROADCAST)
    """

    num_steps: Int[Array, ""] = enn.broadcast()
    num_excluded: Int[Array, ""] = enn.broadcast()
    num_grads: Int[Array, ""] = enn.broadcast()
    bias_history: Float[Array, "steps 3"] | None = enn.broadcast(default=None, kw_only=True)


class EnsembleAdaptation(Adaptation):
    """Abstract adaptation loop: step every chain, reduce statistics, update the sampler.

    Subclasses implement `init_state`, `statistics` and `update` (and optionally `done`),
    all written for ONE chain; `run` drives them for `num_steps` steps, or until `done`.

    * `statistics(sampler, state, info)` returns per-chain quantities;
    * they are averaged over the ensemble with non-finite chains masked out
      (`finite_chain_mean`);
    * `update(sampler, adaptation_state, means, step)` returns the new sampler and state.
      Hyperparameters computed from ensemble means are identical across chains, so they
      stay broadcast. The sampler is a loop carry: keep its adapted fields as arrays.

    With `track_bias=True` (and a reference) `samplers.run` attaches a `BiasMonitor`
    (`with_bias_monitor`), and the loop records the ensemble's b² after every step in
    `AdaptationInfo.bias_history`.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> from samplers.adaptation import EnsembleAdaptation, as_array
        >>> class AcceptanceScaling(EnsembleAdaptation):
        ...     '''Widen random-walk steps while the ensemble accepts over half the moves.'''
        ...     num_steps: int = 10
        ...     def prepare(self, sampler):
        ...         return samplers.RandomWalk(as_array(sampler.step_size))
        ...     def init_state(self, sampler, state):
        ...         return ()
        ...     def statistics(self, sampler, state, info):
        ...         return info.acceptance_rate
        ...     def update(self, sampler, adaptation_state, acceptance, step):
        ...         return samplers.RandomWalk(sampler.step_size * jnp.exp(acceptance - 0.5)), ()
        >>> result = samplers.run(samplers.RandomWalk(0.1), lambda x: -0.5 * (x**2).sum(),
        ...                       jnp.zeros((8, 2)), key=jax.random.key(0), num_steps=10,
        ...                       adaptation=AcceptanceScaling(), progress=False)
        >>> info = result.adaptation_info   # an AdaptationInfo
        >>> int(info.num_steps), int(info.num_excluded), int(info.num_grads)
        (10, 0, 0)
        >>> float(result.sampler.step_size) > 0.1
        True
    """

    num_steps: eqx.AbstractVar[int]
    bias_monitor: BiasMonitor | None = monitor_field()

    @abc.abstractmethod
    def init_state(self, sampler: Sampler, state: State) -> PyTree:
        """The adaptation state before the first step (for one chain)."""

    @abc.abstractmethod
    def statistics(self, sampler: Sampler, state: State, info: Info) -> PyTree:
        """Per-chain statistics after a step."""

    @abc.abstractmethod
    def update(
        self, sampler: Sampler, adaptation_state: PyTree, means: PyTree, step: Int[Array, ""]
    ) -> tuple[Sampler, PyTree]:
        """New sampler and adaptation state from the ensemble means of the statistics."""

    def prepare(self, sampler: Sampler) -> Sampler:
        """The sampler as the loop carries it (e.g. adapted fields as arrays)."""
        return sampler

    def done(self, adaptation_state: PyTree) -> Bool[Array, ""]:
        """Early stopping: True ends the adaptation (must be the same in every chain)."""
        return jnp.asarray(False)

    def run(
        self, sampler: Sampler, logdensity: Logdensity, state: State, key: PRNGKeyArray
    ) -> tuple[Sampler, State, AdaptationInfo]:
        sampler = self.prepare(sampler)
        monitor = self.bias_monitor
        carry = (
            jnp.int32(0),
            sampler,
            state,
            self.init_state(sampler, state),
            jnp.int32(0),
            jnp.int32(0),
            None if monitor is None else BiasMonitor.empty(self.num_steps),
        )

        def cond(carry: tuple) -> Bool[Array, ""]:
            t, _, _, adaptation_state, _, _, _ = carry
            return (t < self.num_steps) & ~self.done(adaptation_state)

        def body(carry: tuple) -> tuple:
            t, sampler, state, adaptation_state, excluded, grads, history = carry
            tick(t)
            state, info = step_chain(sampler, logdensity, state, random.fold_in(key, t))
            means, bad = finite_chain_mean(self.statistics(sampler, state, info))
            sampler, adaptation_state = self.update(sampler, adaptation_state, means, t)
            grads = grads + info.num_grads
            if monitor is not None:
                history = monitor.record(history, t, logdensity, state.position, grads)
            return (t + 1, sampler, state, adaptation_state, excluded + bad, grads, history)

        t, sampler, state, _, excluded, grads, history = jax.lax.while_loop(cond, body, carry)
        # grads is per chain; report the ensemble's (identical when every chain steps alike).
        num_grads = enn.chain_sum(grads) // enn.num_chains()
        return sampler, state, AdaptationInfo(t, excluded, num_grads, bias_history=history)


def as_array(value: Any, dtype: Any = jnp.float32) -> Array:
    """A hyperparameter as an array (so an adaptation loop can carry and update it).

    Example:
        >>> import jax.numpy as jnp
        >>> from samplers.adaptation import as_array
        >>> as_array(0.5), as_array(3, jnp.int32)
        (Array(0.5, dtype=float32), Array(3, dtype=int32))
    """
    return jnp.asarray(value, dtype)
