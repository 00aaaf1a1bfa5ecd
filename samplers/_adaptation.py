"""The protocol an ensemble adaptation scheme implements for `samplers.run`."""

import abc
from typing import Any

import equinox as eqx
from jaxtyping import PRNGKeyArray

from ._sampler import Logdensity, Sampler, State


class Adaptation(eqx.Module):
    """Abstract ensemble adaptation: tunes a sampler from cross-chain statistics.

    `run` is written for ONE chain and executes inside `ensemble_map`, so it can use
    `enn.chain_mean` and friends; hyperparameters it computes from such reductions are
    the same in every chain and come back once (broadcast). It returns the tuned sampler
    (possibly of another class: LAPS ends with an adjusted kernel), the warmed-up state
    for that sampler, and any per-run information to report.
    """

    @abc.abstractmethod
    def run(self, sampler: Sampler | None, logdensity: Logdensity, state: State | Any,
            key: PRNGKeyArray) -> tuple[Sampler, State, Any]:
        """Adapt for one chain (inside the ensemble); see the class docstring."""

    def initial_state(self, sampler: Sampler | None, logdensity: Logdensity, position: Any,
                      key: PRNGKeyArray) -> State | Any:
        """The state `run` starts from; by default `sampler.init`."""
        return sampler.init(logdensity, position, key)

    @property
    def grads_per_chain(self) -> int | None:
        """Gradient evaluations per chain the adaptation uses, if known statically."""
        return None
