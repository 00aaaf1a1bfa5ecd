"""The abstract sampler: `init` and `step` written for ONE chain."""

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

import ensemblenn as enn

Logdensity = Callable[..., Float[Array, ""]]
Hyper = Any
"""A hyperparameter: a number, a broadcast array, an `enn.PerChainValue` (one entry per
chain) or an optax schedule (a callable of the step count)."""


def resolve(value: Hyper, count: Int[Array, ""] | int) -> Array:
    """The value of a hyperparameter for this chain at step `count`.

    Numbers and arrays are returned as arrays, `enn.PerChainValue` is unwrapped (inside
    `ensemble_map` it already holds this chain's entry), and a callable such as an optax
    schedule is evaluated at `count`.

    Example:
        >>> import optax, samplers
        >>> float(samplers.resolve(optax.linear_schedule(1.0, 0.0, 10), 5))
        0.5
        >>> float(samplers.resolve(0.25, 3))
        0.25
    """
    if isinstance(value, enn.PerChainValue):
        value = value.value
    if callable(value) and not isinstance(value, jax.Array):
        value = value(count)
    return jnp.asarray(value)


def hyperparameter(*, positive: bool = False, **field_kwargs: Any) -> Any:
    """An `eqx.field` for a kernel hyperparameter, with what the base class checks.

    `positive=True` makes `Sampler.__check_init__` refuse concrete values that are not
    positive (a dense matrix: its diagonal). Other keywords go to `eqx.field`.

    Example:
        >>> import jax.numpy as jnp, samplers
        >>> class Scaled(samplers.RandomWalk):
        ...     scale: float = samplers.hyperparameter(positive=True, default=1.0)
        >>> Scaled(0.5, scale=2.0).scale
        2.0
        >>> try:
        ...     Scaled(0.5, scale=-1.0)
        ... except ValueError as err:
        ...     print(str(err).splitlines()[0])
        Scaled.scale must be positive, got -1.0.
    """
    metadata = dict(field_kwargs.pop("metadata", {}) or {})
    metadata["positive"] = positive
    return eqx.field(metadata=metadata, **field_kwargs)


class Info(eqx.Module):
    """What one transition reports, for one chain.

    Attributes:
        acceptance_rate: Metropolis acceptance probability (1 for unadjusted kernels).
        is_divergent: the transition diverged (energy error too large or non-finite).
        num_grads: gradient evaluations the transition used.
        energy_change: the energy error of the proposal (0 where not defined).
        step_size: the step size actually used (after schedules / per-chain values).

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> logdensity = lambda x: -0.5 * (x**2).sum()
        >>> kernel = samplers.MALA(step_size=0.5)
        >>> state = kernel.init(logdensity, jnp.zeros(2), jax.random.key(0))
        >>> _, info = kernel.step(logdensity, state, jax.random.key(1))
        >>> int(info.num_grads), bool(info.is_divergent), float(info.step_size)
        (1, False, 0.5)
    """

    acceptance_rate: Float[Array, ""]
    is_divergent: Bool[Array, ""]
    num_grads: Int[Array, ""]
    energy_change: Float[Array, ""]
    step_size: Float[Array, ""]


class State(eqx.Module):
    """The minimum every sampler state carries, for one chain.

    Subclasses add fields (momentum, gradient, ...). `count` is the number of steps taken,
    which optax schedules are evaluated at.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> state = samplers.RandomWalk(0.5).init(lambda x: -0.5 * (x**2).sum(), jnp.ones(2),
        ...                                       jax.random.key(0))
        >>> isinstance(state, samplers.State), float(state.logdensity), int(state.count)
        (True, -1.0, 0)
    """

    position: Float[Array, " dim"]
    logdensity: Float[Array, ""]
    count: Int[Array, ""]


class Sampler(eqx.Module):
    """Abstract base of every kernel: `init` and `step` for ONE chain.

    Hyperparameters are fields. Subclass to write a new kernel (implement `init` and
    `step`) or to change one piece of an existing one (override e.g. `proposal`).
    The driver `samplers.run` maps a sampler over the whole sharded ensemble, running
    `init` and `step` through `enn.batch_invariant` (blocks of chains, so that results do
    not depend on the device count). A kernel whose `init` or `step` needs the ensemble
    (`enn.chain_mean`, `chain_all_gather`, `chain_index`, ...) says so with the class
    attribute `step_uses_ensemble = True`, and is then run unblocked.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> class Independent(samplers.Sampler):
        ...     scale: float = 1.0
        ...     def init(self, logdensity, position, key):
        ...         return samplers.State(position, logdensity(position), jnp.int32(0))
        ...     def step(self, logdensity, state, key):
        ...         x = self.scale * jax.random.normal(key, state.position.shape)
        ...         new = samplers.State(x, logdensity(x), state.count + 1)
        ...         return new, samplers.unadjusted_info(num_grads=0)
        >>> s = Independent()
        >>> st = s.init(lambda x: -0.5 * (x**2).sum(), jnp.zeros(2), jax.random.key(0))
        >>> s.step(lambda x: -0.5 * (x**2).sum(), st, jax.random.key(1))[0].count
        Array(1, dtype=int32)
    """

    # True for a kernel whose `step` needs the ensemble (collectives, `enn.chain_index`):
    # the driver then does not run it through `enn.batch_invariant` blocks.
    step_uses_ensemble: ClassVar[bool] = False
    # False for a kernel without a Metropolis correction (its acceptance is 1 by
    # construction): the run's verdict then does not judge its acceptance rate.
    adjusted: ClassVar[bool] = True

    def __check_init__(self) -> None:
        # Catch impossible hyperparameters when they are concrete; schedules and traced
        # values are checked by their users. Fields declared with
        # `samplers.hyperparameter(positive=True)` must be positive.
        for field in dataclasses.fields(self):
            if not field.metadata.get("positive", False):
                continue
            value = getattr(self, field.name, None)
            if isinstance(value, enn.PerChainValue):
                value = value.value
            if value is None or callable(value) or isinstance(value, jax.core.Tracer):
                continue
            try:
                array = np.asarray(value)
            except (TypeError, ValueError):
                continue
            if array.ndim == 2 and array.shape[0] == array.shape[1]:
                array = np.diagonal(array)  # a dense matrix: its diagonal must be positive
            if array.dtype.kind in "biuf" and array.size and not np.all(array > 0):
                raise enn.EnsembleError(
                    f"{type(self).__name__}.{field.name} must be positive, got {value!r}.\n"
                    "  fix: pass a positive number (or array, enn.PerChainValue, optax "
                    "schedule)."
                )

    @abc.abstractmethod
    def init(
        self, logdensity: Logdensity, position: Float[Array, " dim"], key: PRNGKeyArray
    ) -> State:
        """The initial state of one chain at `position`."""

    @abc.abstractmethod
    def step(self, logdensity: Logdensity, state: State, key: PRNGKeyArray) -> tuple[State, Info]:
        """One transition of one chain."""

    @property
    def grads_per_step(self) -> int:
        """Gradient evaluations per step (for reporting; kernels override)."""
        return 1
