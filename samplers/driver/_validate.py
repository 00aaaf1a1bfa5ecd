"""What `samplers.run` checks before anything compiles."""

import inspect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import ensemblenn as enn

from .._errors import SamplerError, SamplerTypeError
from ..adaptation import Adaptation
from ..kernels import Sampler


def check_logdensity(logdensity: Any, one: Any) -> bool:
    """The log-density must map one chain's position (`one`: its pytree of
    `jax.ShapeDtypeStruct`) to a real scalar JAX array, and be traceable. Returns whether
    it takes one position (False: a minibatch log-density `(position, indices)`, which its
    kernel checks).

    An exception of the log density's own (say a model's `MyModelError`) is re-raised as
    itself, with a note; only what the library detects is a `SamplerError`."""
    shape = jax.tree.map(lambda x: x.shape, one)
    if not _takes_one_argument(logdensity):
        return False
    returned: list[Any] = []
    try:
        out = jax.eval_shape(lambda x: returned.append(logdensity(x)) or returned[-1], one)
    except (jax.errors.JAXTypeError, jax.errors.JAXIndexError) as err:
        raise SamplerTypeError(
            f"logdensity cannot be traced by JAX at a position of shape {shape} "
            f"({type(err).__name__}): {str(err).splitlines()[0]}\n  fix: compute with jnp "
            "only: no float(), .item(), np.asarray() or Python `if` on the position (use "
            "jnp.where)."
        ) from err
    except Exception as err:
        # The user's own exception: re-raised as itself (so that `except MyModelError:`
        # still catches it), with where and how samplers.run called it as a note.
        err.add_note(
            f"samplers.run: raised by logdensity, called on ONE chain's position of shape "
            f"{shape} (traced, before anything compiles).\n  fix: if it expects all the "
            "chains at once, make it take one position: samplers.run maps it over the chains."
        )
        raise
    check_logdensity_value(returned[-1] if returned else out, out, shape)
    return True


def _takes_one_argument(fn: Any) -> bool:
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin): assume it does
        return True
    return True


def check_logdensity_value(raw: Any, out: Any, shape: tuple) -> None:
    """What the log-density returned for one position: a real floating scalar JAX array."""
    if not hasattr(out, "shape") or out.shape != ():
        found = getattr(out, "shape", type(out).__name__)
        raise SamplerError(
            f"logdensity must return a scalar for ONE position of shape "
            f"{shape}, but it returns {found}.\n  fix: sum the terms, e.g. "
            "return jnp.sum(log_terms); samplers.run maps it over the chains itself."
        )
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise SamplerTypeError(
            f"logdensity must return a real floating-point scalar, but it returns dtype "
            f"{out.dtype}.\n  fix: return a float, e.g. jnp.real(...) or .astype(jnp.float32); "
            "the kernels take its gradient."
        )
    if not isinstance(raw, jax.Array):
        raise SamplerTypeError(
            f"logdensity must return a JAX array, but it returns a {type(raw).__name__} "
            f"({raw!r}) that does not depend on the position.\n  fix: compute it from the "
            "position with jnp, or wrap a constant: jnp.asarray(value)."
        )


def check_key(key: Any) -> None:
    if isinstance(key, jax.Array) and (
        (jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape == ())
        or (key.dtype == jnp.uint32 and key.shape == (2,))
    ):
        return  # one key, typed or raw: no need to trace chain_keys to know
    # One home for what a key is: enn.chain_keys, which run calls with this key.
    try:
        jax.eval_shape(lambda k: enn.chain_keys(k, 1), key)
    except enn.EnsembleError as err:
        raise type(err)(f"samplers.run: key must be one PRNG key; {err}") from None
    except TypeError:
        raise SamplerError(
            f"samplers.run(key=...) must be one PRNG key, got {type(key).__name__}.\n"
            "  fix: key=jax.random.key(0); run makes the per-chain keys."
        ) from None


def is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def check_logdensity_given(logdensity: Any) -> None:
    """A log density is the one input `run` cannot do without (it has a default of None
    only so that the sampler before it can be left out by keyword)."""
    if logdensity is None:
        raise SamplerTypeError(
            "samplers.run needs a log density: a callable of one chain's position, or a "
            "target.\n  fix: samplers.run(sampler, logdensity, positions, key=..., "
            "num_steps=...), or samplers.run(logdensity=target, adaptation=samplers.LAPS(), "
            "num_chains=128, key=..., num_steps=...)."
        )


def check_inputs(
    sampler: Any,
    adaptation: Any,
    logdensity: Any,
    positions: Any,
    num_steps: Any,
    num_warmup: Any,
    thin: Any,
) -> None:
    if adaptation is None and not isinstance(sampler, Sampler):
        raise SamplerTypeError(
            f"sampler must be a samplers.Sampler (e.g. samplers.HMC(...)), got "
            f"{type(sampler).__name__}.\n  fix: samplers.run(samplers.NUTS(), target, "
            "positions, adaptation=samplers.WindowAdaptation(), ...), or an adaptation that "
            "builds its own kernel: adaptation=samplers.LAPS()."
        )
    if adaptation is not None and not isinstance(adaptation, Adaptation):
        raise SamplerTypeError(
            f"adaptation must be a samplers.Adaptation (e.g. samplers.LAPS(...)), got "
            f"{type(adaptation).__name__}."
        )
    if not callable(logdensity):
        raise SamplerTypeError(
            f"logdensity must be callable (a function or a target module), got "
            f"{type(logdensity).__name__}."
        )
    for name, value, low in (("num_steps", num_steps, 1), ("num_warmup", num_warmup, 0)):
        if not is_int(value):
            raise SamplerTypeError(f"{name} must be an int >= {low}, got {value!r}.")
        if value < low:
            raise SamplerError(f"{name} must be an int >= {low}, got {value!r}.")
    if thin is not None and (not is_int(thin) or thin < 0 or thin > max(num_steps, 1)):
        raise (SamplerError if is_int(thin) else SamplerTypeError)(
            f"thin must be None or an int in [0, num_steps={num_steps}], got {thin!r}.\n"
            "  fix: thin=10 keeps every 10th draw in result.trace; thin=0 keeps no trace; "
            "None (the default) keeps every draw that fits the memory budget."
        )
    if hasattr(positions, "shape") and hasattr(positions, "dtype") and np.ndim(positions) < 2:
        raise SamplerError(
            f"positions must have shape (num_chains, dim), got shape {np.shape(positions)}.\n"
            "  fix: stack one initial position per chain, e.g. jnp.zeros((num_chains, dim)), "
            "or pass a pytree of such arrays (e.g. {'mu': jnp.zeros(num_chains)})."
        )
    _check_not_empty(positions)


def _check_not_empty(positions: Any) -> None:
    """At least one chain and one coordinate: zero-size positions would otherwise compile
    the setup and fail inside the kernels with a raw IndexError."""
    leaves = jax.tree.leaves(positions)
    shapes = [np.shape(x) for x in leaves]
    if not leaves or any(len(s) < 1 for s in shapes) or len({s[0] for s in shapes}) > 1:
        return  # not a batch of positions: flatten_target's PositionsError says why
    chains, dim = shapes[0][0], sum(int(np.prod(s[1:], dtype=int)) for s in shapes)
    if chains and dim:
        return
    plain = len(leaves) == 1 and hasattr(positions, "shape")
    found = f"shape {shapes[0]}" if plain else f"leaf shapes {shapes}"
    example = (
        f"jnp.zeros(({chains or 'num_chains'}, {dim or 'dim'}))"
        if plain
        else "{'x': jnp.zeros((num_chains, dim))}"
    )
    raise SamplerError(
        f"positions has {found}: {'no chains' if not chains else 'no coordinates (dim 0)'} "
        f"to sample.\n  fix: give at least one chain and one coordinate per chain, e.g. "
        f"{example}."
    )


def check_finite(flat: Any) -> None:
    """Every chain starts at a finite point (`flat`: the raveled `(num_chains, dim)`)."""
    if not isinstance(flat, jax.core.Tracer):
        finite = np.isfinite(np.asarray(flat))
        if not finite.all():
            bad = np.argwhere(~finite.all(axis=1)).ravel()[:5].tolist()
            raise SamplerError(
                f"positions has non-finite (NaN/inf) entries in chains {bad}: every chain must "
                "start at a finite point."
            )


def check_sampler_dim(sampler: Any, positions: Any) -> None:
    """The sampler's hyperparameter shapes against the positions' dim (and chain count),
    so that a wrong-length mass matrix is named here, not as a broadcasting error."""
    leaves = jax.tree.leaves(positions)
    if sampler is None or len(leaves) != 1 or np.ndim(leaves[0]) != 2:
        return  # pytree positions: the kernels see flat positions of their own
    num_chains, dim = np.shape(leaves[0])
    sampler.check_dim(int(dim), int(num_chains))
