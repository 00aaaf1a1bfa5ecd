"""The protocol an ensemble adaptation scheme implements for `samplers.run`."""

import abc
import dataclasses
from typing import Any

import equinox as eqx
from jaxtyping import PRNGKeyArray

from ..kernels import Logdensity, Sampler, State
from ._bias_monitor import attach


class Adaptation(eqx.Module):
    """Abstract ensemble adaptation: tunes a sampler from cross-chain statistics.

    `run` is written for ONE chain and executes inside `ensemble_map`, so it can use
    `enn.chain_mean` and friends; hyperparameters it computes from such reductions are
    the same in every chain and come back once (broadcast). It returns the tuned sampler
    (possibly of another class: LAPS ends with an adjusted kernel), the warmed-up state
    for that sampler, and any per-run information to report.

    Example:
        >>> import jax, jax.numpy as jnp, ensemblenn as enn, samplers
        >>> class SpreadScaling(samplers.Adaptation):
        ...     '''Random-walk steps as wide as the ensemble's spread, per coordinate.'''
        ...     def run(self, sampler, logdensity, state, key):
        ...         x = state.position
        ...         sd = jnp.sqrt(enn.chain_mean(x**2) - enn.chain_mean(x) ** 2)
        ...         return samplers.RandomWalk(step_size=sd), state, {"sd": sd}
        >>> x0 = jnp.array([[0.0, 0.0], [2.0, 4.0]] * 4)   # 8 chains, sd (1, 2)
        >>> result = samplers.run(samplers.RandomWalk(1.0), lambda x: -0.5 * (x**2).sum(), x0,
        ...                       key=jax.random.key(0), num_steps=10,
        ...                       adaptation=SpreadScaling(), progress=False)
        >>> result.sampler.step_size.tolist(), result.adaptation_info["sd"].tolist()
        ([1.0, 2.0], [1.0, 2.0])
    """

    @abc.abstractmethod
    def run(
        self, sampler: Sampler | None, logdensity: Logdensity, state: State | Any, key: PRNGKeyArray
    ) -> tuple[Sampler, State, Any]:
        """Adapt for one chain (inside the ensemble); see the class docstring."""

    def initial_state(
        self, sampler: Sampler | None, logdensity: Logdensity, position: Any, key: PRNGKeyArray
    ) -> State | Any:
        """The state `run` starts from; by default `sampler.init`."""
        return sampler.init(logdensity, position, key)

    def with_bias_monitor(self, monitor: Any) -> "Adaptation":
        """This adaptation recording b² after each of its steps, if it supports that.

        `samplers.run(..., track_bias=True)` calls it (inside the ensemble, with a
        `BiasMonitor` of the reference) before `run`. An adaptation that supports it
        returns a copy that records one row per step with `monitor.record` (every chain
        at the same step) and reports the buffer as its info's `bias_history`, which
        becomes `Result.adaptation_bias`. An adaptation supports it by declaring a
        `bias_monitor` field (the built-ins and `EnsembleAdaptation` subclasses do): this
        default puts `monitor` there. Without that field it returns `self`: not
        supported, and `Result.adaptation_bias` is None.

        Example:
            >>> import jax.numpy as jnp, samplers
            >>> from samplers.adaptation import BiasMonitor
            >>> monitor = BiasMonitor(jnp.ones(2), 2 * jnp.ones(2))
            >>> chees = samplers.ChEES(num_steps=10)
            >>> chees.with_bias_monitor(monitor).bias_monitor.second_moment.tolist()
            [1.0, 1.0]
            >>> chees.bias_monitor is None   # the original is unchanged
            True
        """
        if "bias_monitor" not in {f.name for f in dataclasses.fields(self)}:
            return self
        return attach(self, monitor)

    @property
    def total_steps(self) -> int | None:
        """The most steps the adaptation takes (its length on the progress bar), if known
        statically; by default its `num_steps` field when that is an int.

        Example:
            >>> import samplers
            >>> samplers.WindowAdaptation(num_steps=300).total_steps
            300
        """
        steps = getattr(self, "num_steps", None)
        return steps if isinstance(steps, int) and not isinstance(steps, bool) else None

    @property
    def grads_per_chain(self) -> int | None:
        """Gradient evaluations per chain the adaptation uses, if known statically."""
        return None
