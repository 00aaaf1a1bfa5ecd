"""The abstract sampler: `init` and `step` written for ONE chain."""

import abc
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

    # The acceptance `samplers.WindowAdaptation` tunes the step size to by default.
    default_target_acceptance: ClassVar[float] = 0.8

    positive_hyperparameters: ClassVar[tuple[str, ...]] = (
        "step_size",
        "L",
        "num_integration_steps",
        "inverse_mass_matrix",
        "batch_size",
    )

    def __check_init__(self) -> None:
        # Catch impossible hyperparameters when they are concrete; schedules and traced
        # values are checked by their users.
        for name in self.positive_hyperparameters:
            value = getattr(self, name, None)
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
                    f"{type(self).__name__}.{name} must be positive, got {value!r}.\n  fix: "
                    f"pass a positive number (or array, enn.PerChainValue, optax schedule)."
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


def step_chain(
    sampler: Sampler, logdensity: Logdensity, state: State, key: PRNGKeyArray
) -> tuple[State, Info]:
    """`sampler.step` as the driver runs it: in `enn.batch_invariant` blocks when the
    enclosing `ensemble_map` has a `block_size` (so results do not depend on the device
    count), unless the kernel's step needs the ensemble.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> from samplers._sampler import step_chain
        >>> logdensity = lambda x: -0.5 * jnp.sum(x**2)
        >>> mala = samplers.MALA(step_size=0.5)
        >>> state = mala.init(logdensity, jnp.ones(3), jax.random.key(0))
        >>> new, info = step_chain(mala, logdensity, state, jax.random.key(1))
        >>> plain, _ = mala.step(logdensity, state, jax.random.key(1))
        >>> bool((new.position == plain.position).all())  # no ensemble, no block size
        True
    """
    if sampler.step_uses_ensemble:
        return sampler.step(logdensity, state, key)
    return _blocked(sampler, "step", logdensity, state, key)


def init_chain(
    sampler: Sampler, logdensity: Logdensity, position: Array, key: PRNGKeyArray
) -> State:
    """`sampler.init` as the driver runs it (see `step_chain`)."""
    if sampler.step_uses_ensemble:
        return sampler.init(logdensity, position, key)
    return _blocked(sampler, "init", logdensity, position, key)


def _blocked(sampler: Sampler, method: str, *args: Any) -> Any:
    try:
        return enn.batch_invariant(getattr(sampler, method))(*args)
    except enn.CollectiveError as err:
        if "batch_invariant" not in str(err):
            raise
        name = type(sampler).__name__
        raise enn.CollectiveError(
            f"{name}.{method} calls a cross-chain collective (enn.chain_mean, chain_sum, "
            "chain_all_gather or chain_index), but the driver runs each chain's init and "
            "step in blocks of chains (samplers.run's block_size, for results that do not "
            "depend on the device count), where a collective would see one block.\n  fix: "
            f"declare `step_uses_ensemble = True` in the body of class {name} (its init and "
            "step then run over the whole ensemble, unblocked), or pass block_size=None to "
            "samplers.run."
        ) from None


def unadjusted_info(
    num_grads: int | Array = 1,
    energy_change: Array | float = 0.0,
    step_size: Array | float = 0.0,
    is_divergent: Array | bool = False,
) -> Info:
    """`Info` for a kernel with no Metropolis step (acceptance 1).

    Example:
        >>> import samplers
        >>> info = samplers.unadjusted_info(num_grads=2, step_size=0.5)
        >>> float(info.acceptance_rate), int(info.num_grads), float(info.step_size)
        (1.0, 2, 0.5)
    """
    return Info(
        acceptance_rate=jnp.float32(1.0),
        is_divergent=jnp.asarray(is_divergent, bool),
        num_grads=jnp.asarray(num_grads, jnp.int32),
        energy_change=jnp.asarray(energy_change, jnp.float32),
        step_size=jnp.asarray(step_size, jnp.float32),
    )


def metropolis(
    key: PRNGKeyArray, log_ratio: Float[Array, ""]
) -> tuple[Bool[Array, ""], Float[Array, ""]]:
    """Accept with probability `min(1, exp(log_ratio))`; NaN counts as reject.

    Returns `(accept, acceptance_probability)`.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> accept, prob = samplers.metropolis(jax.random.key(0), jnp.float32(0.0))
        >>> bool(accept), float(prob)  # a ratio of 1 is always accepted
        (True, 1.0)
        >>> accept, prob = samplers.metropolis(jax.random.key(0), jnp.float32(jnp.nan))
        >>> bool(accept), float(prob)
        (False, 0.0)
    """
    log_ratio = jnp.where(jnp.isnan(log_ratio), -jnp.inf, log_ratio)
    prob = jnp.minimum(1.0, jnp.exp(log_ratio))
    accept = jnp.log(jax.random.uniform(key)) < log_ratio
    return accept, prob


def select(accept: Bool[Array, ""], new: Any, old: Any) -> Any:
    """Pick `new` where `accept` else `old`, leaf by leaf (pytrees of arrays).

    Example:
        >>> import jax.numpy as jnp, samplers
        >>> new, old = {"x": jnp.ones(2), "n": jnp.int32(1)}, {"x": jnp.zeros(2), "n": jnp.int32(0)}
        >>> picked = samplers.select(jnp.bool_(False), new, old)
        >>> picked["x"].tolist(), int(picked["n"])
        ([0.0, 0.0], 0)
    """
    return jax.tree.map(lambda a, b: jnp.where(accept, a, b), new, old)
