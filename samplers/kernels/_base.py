"""The abstract sampler: `init` and `step` written for ONE chain."""

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

import ensemblenn as enn

from .._errors import SamplerError, SamplerTypeError

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
    if value is None:  # a step size left to an adaptation, used without one
        raise SamplerError(
            "a hyperparameter is None (not set) where a kernel needs its value.\n  fix: set "
            "it, e.g. samplers.NUTS(step_size=0.1), or let samplers.run's adaptation tune it "
            "(adaptation=samplers.WindowAdaptation())."
        )
    if callable(value) and not isinstance(value, jax.Array):
        value = value(count)
    return jnp.asarray(value)


def hyperparameter(
    *,
    positive: bool = False,
    nonnegative: bool = False,
    integer: bool = False,
    finite: bool = True,
    maximum: float | None = None,
    shape: Literal["vector", "scalar", "metric"] = "vector",
    tuned: bool = False,
    **field_kwargs: Any,
) -> Any:
    """An `eqx.field` for a kernel hyperparameter, with what the base class checks.

    `Sampler.__check_init__` refuses a concrete value that is not a number, an array, an
    `enn.PerChainValue` or a callable (an optax schedule) with a `samplers.SamplerTypeError`,
    and one that breaks a declared rule with a `samplers.SamplerError`: `positive` (> 0; a
    dense matrix: its diagonal), `nonnegative` (>= 0), `integer` (whole numbers), `finite`
    (no NaN or inf; on by default), `maximum` (<= it). `shape` says what `Sampler.check_dim`
    accepts once the dimension is known: `"vector"` a scalar or `(dim,)`, `"scalar"` a
    scalar only, `"metric"` a scalar, `(dim,)` or `(dim, dim)`. `tuned` marks one that
    an adaptation sets (a step size): it may be left None (declare `default=None`), which
    `samplers.run` accepts only with an adaptation (see `Sampler.unset_hyperparameters`).
    Other keywords go to `eqx.field`.

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
    metadata.update(
        hyperparameter=True,
        positive=positive,
        nonnegative=nonnegative,
        integer=integer,
        finite=finite,
        maximum=maximum,
        shape=shape,
        tuned=tuned,
    )
    return eqx.field(metadata=metadata, **field_kwargs)


_ACCEPTED = "a number, an array, an enn.PerChainValue or an optax schedule (a callable)"


def _concrete_array(owner: str, value: Any) -> np.ndarray | None:
    """A hyperparameter's value as a NumPy array if it is known now (None for None,
    schedules and traced values); a `SamplerTypeError` if it is no kind of hyperparameter."""
    if isinstance(value, enn.PerChainValue):
        value = value.value
    if value is None or callable(value) or isinstance(value, jax.core.Tracer):
        return None
    bad = isinstance(value, str | bytes | bool | np.bool_)
    try:
        array = None if bad else np.asarray(value)
    except (TypeError, ValueError):
        array = None
    if array is None or array.dtype.kind not in "iuf":
        raise SamplerTypeError(
            f"{owner} must be {_ACCEPTED}, got {value!r} ({type(value).__name__}).\n  fix: "
            f"{owner.split('.')[-1]}=<a number>, a float array, or one of the others."
        )
    return array


def _check_value(owner: str, value: Any, rules: dict) -> None:
    """The declared rules of one concrete hyperparameter value."""
    array = _concrete_array(owner, value)
    if array is None or not array.size:
        return
    fix = "\n  fix: pass {} (or an array, enn.PerChainValue or optax schedule of such)."
    if rules.get("finite", True) and not np.all(np.isfinite(array)):
        raise SamplerError(
            f"{owner} must be finite, got {value!r}." + fix.format("a finite number")
        )
    if rules.get("integer") and not np.all(array == np.round(array)):
        raise SamplerError(f"{owner} must be a whole number, got {value!r}." + fix.format("an int"))
    check = array
    if rules.get("positive") and array.ndim == 2 and array.shape[0] == array.shape[1]:
        check = np.diagonal(array)  # a dense matrix: its diagonal must be positive
    if rules.get("positive") and not np.all(check > 0):
        raise SamplerError(
            f"{owner} must be positive, got {value!r}." + fix.format("a positive number")
        )
    if rules.get("nonnegative") and not np.all(array >= 0):
        raise SamplerError(f"{owner} must be >= 0, got {value!r}." + fix.format("a number >= 0"))
    maximum = rules.get("maximum")
    if maximum is not None and not np.all(array <= maximum):
        raise SamplerError(
            f"{owner} must be <= {maximum}, got {value!r}." + fix.format(f"a number <= {maximum}")
        )


def _hyper_shape(value: Any, num_chains: int | None) -> tuple[tuple[int, ...], str] | None:
    """The per-chain shape of a hyperparameter (and a note on where it came from), or None
    when it cannot be known before tracing."""
    if isinstance(value, enn.PerChainValue):
        shape = np.shape(value.value)
        if num_chains is not None and (not shape or shape[0] != num_chains):
            raise SamplerError(
                f"is an enn.PerChainValue of shape {shape}, but there are {num_chains} chains."
                f"\n  fix: one entry per chain along the leading axis, shape ({num_chains}, ...)."
            )
        return shape[1:], " (per chain, after the leading chain axis)"
    if value is None or isinstance(value, jax.core.Tracer):
        return None
    if callable(value):
        try:  # a schedule: trace it at step 0 (no compilation)
            out = jax.eval_shape(value, jax.ShapeDtypeStruct((), jnp.int32))
        except Exception:  # noqa: BLE001 - not ours to judge: its user reports it
            return None
        return (tuple(out.shape), " (the schedule's value)") if hasattr(out, "shape") else None
    return np.shape(value), ""


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
    attribute `step_uses_ensemble = True`, and is then run unblocked. Inside the blocks
    plain JAX is bitwise the same on any device count; the rule for when a kernel needs
    `enn.rounded` or `enn.ordered_sum` (only if the invariance check finds a difference)
    is in docs/contributing.md, "The bit-exactness rule".

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

    # The acceptance `samplers.WindowAdaptation` tunes the step size to by default.
    default_target_acceptance: ClassVar[float] = 0.8

    def __check_init__(self) -> None:
        # Catch impossible hyperparameters when they are concrete; schedules and traced
        # values are checked by their users. Fields declared with `samplers.hyperparameter`
        # carry their rules in the field metadata.
        for field in dataclasses.fields(self):
            if field.metadata.get("hyperparameter", False):
                owner = f"{type(self).__name__}.{field.name}"
                _check_value(owner, getattr(self, field.name, None), field.metadata)

    def check_dim(self, dim: int, num_chains: int | None = None) -> None:
        """Check the hyperparameters' shapes against the dimension (and chain count).

        `samplers.run` calls this before compiling anything, so an inverse mass matrix of
        the wrong length is reported by name rather than as a broadcasting error deep in
        JAX. Kernels with other rules extend it.

        Raises:
            samplers.SamplerError: a hyperparameter's shape does not fit `dim`, or an
                `enn.PerChainValue` does not have one entry per chain.

        Example:
            >>> import jax.numpy as jnp, samplers
            >>> try:
            ...     samplers.HMC(0.1, 5, inverse_mass_matrix=jnp.ones(5)).check_dim(3)
            ... except samplers.SamplerError as err:
            ...     print(str(err).splitlines()[0])
            HMC.inverse_mass_matrix has shape (5,), but the positions have dim 3.
        """
        allowed = {
            "scalar": lambda: [()],
            "vector": lambda: [(), (dim,)],
            "metric": lambda: [(), (dim,), (dim, dim)],
        }
        for field in dataclasses.fields(self):
            if not field.metadata.get("hyperparameter", False):
                continue
            owner = f"{type(self).__name__}.{field.name}"
            value = getattr(self, field.name, None)
            try:
                found = _hyper_shape(value, num_chains)
            except SamplerError as err:
                raise SamplerError(f"{owner} {err}") from None
            if found is None:
                continue
            shape, where = found
            shapes = allowed[field.metadata.get("shape", "vector")]()
            if shape not in shapes:
                raise SamplerError(
                    f"{owner} has shape {shape}{where}, but the positions have dim {dim}.\n"
                    f"  fix: a hyperparameter of shape "
                    f"{' or '.join(str(s) for s in shapes)} (dim={dim})."
                )

    def unset_hyperparameters(self) -> tuple[str, ...]:
        """The hyperparameters left for an adaptation to set: those declared `tuned` (the
        step sizes of the built-in kernels) that are None.

        `samplers.run` refuses them without an adaptation, and with one starts them at 1.0
        (its step-size search then moves them to the right scale).

        Example:
            >>> import samplers
            >>> samplers.NUTS().unset_hyperparameters(), samplers.NUTS(0.1).unset_hyperparameters()
            (('step_size',), ())
        """
        return tuple(
            f.name
            for f in dataclasses.fields(self)
            if f.metadata.get("tuned", False) and getattr(self, f.name, None) is None
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
