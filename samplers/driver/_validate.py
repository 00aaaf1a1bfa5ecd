"""What `samplers.run` checks before anything compiles."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import ensemblenn as enn

from .._errors import SamplerError, SamplerTypeError
from ..adaptation import Adaptation
from ..kernels import Sampler


def check_logdensity(logdensity: Any, positions: Any) -> None:
    """The log-density must map one position to a scalar."""
    one = jax.ShapeDtypeStruct(np.shape(positions)[1:], positions.dtype)
    try:
        out = jax.eval_shape(logdensity, one)
    except TypeError:
        return  # e.g. a minibatch log-density (position, indices): its kernel checks it
    if not hasattr(out, "shape") or out.shape != ():
        shape = getattr(out, "shape", type(out).__name__)
        raise SamplerError(
            f"logdensity must return a scalar for ONE position of shape "
            f"{np.shape(positions)[1:]}, but it returns {shape}.\n  fix: sum the terms, e.g. "
            "return jnp.sum(log_terms); samplers.run maps it over the chains itself."
        )


def check_key(key: Any) -> None:
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def check_options(
    num_chains: int,
    chunk_size: Any,
    superchain_size: Any,
    reference: Any,
    block_size: Any,
    checkpoint_every: Any,
    track_bias: Any,
) -> None:
    """The options whose mistakes would otherwise surface late (after every step ran)."""
    # checkpoint_every is the checkpoint package's to check (a CheckpointError).
    for name, value in (("chunk_size", chunk_size),):
        if value is not None and (not _is_int(value) or value < 1):
            raise SamplerError(
                f"{name} must be None or an int >= 1, got {value!r}.\n  fix: {name}=None "
                "(the default) or a positive number of steps."
            )
    if superchain_size is not None:
        if not _is_int(superchain_size) or superchain_size < 1:
            raise SamplerError(
                f"superchain_size must be None or an int >= 1, got {superchain_size!r}."
            )
        if num_chains % superchain_size:
            raise SamplerError(
                f"superchain_size={superchain_size} does not divide the {num_chains} chains.\n"
                f"  fix: a divisor of {num_chains} (superchains of consecutive chains, all the "
                "same size)."
            )
    if (
        block_size is not None
        and block_size != "auto"
        and (not _is_int(block_size) or block_size < 1)
    ):
        raise SamplerError(f'block_size must be "auto", None or an int >= 1, got {block_size!r}.')
    if reference is not None and not hasattr(reference, "second_moment"):
        raise SamplerError(
            f"reference must be None or a samplers.targets.Moments (known moments of the "
            f"target), got {reference!r}.\n  fix: reference=target.reference, or leave it out."
        )
    if not isinstance(track_bias, bool):
        raise SamplerError(f"track_bias must be True or False, got {track_bias!r}.")


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
            f"{type(sampler).__name__}."
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
        if not _is_int(value):
            raise SamplerTypeError(f"{name} must be an int >= {low}, got {value!r}.")
        if value < low:
            raise SamplerError(f"{name} must be an int >= {low}, got {value!r}.")
    if thin is not None and (not isinstance(thin, int) or thin < 1 or thin > num_steps):
        raise SamplerError(f"thin must be None or an int in [1, num_steps], got {thin!r}.")
    shape = np.shape(positions)
    if len(shape) != 2:
        raise SamplerError(
            f"positions must have shape (num_chains, dim), got shape {shape}.\n  fix: stack one "
            "initial position per chain, e.g. jnp.zeros((num_chains, dim))."
        )
    dtype = positions.dtype if hasattr(positions, "dtype") else np.asarray(positions).dtype
    if not jnp.issubdtype(dtype, jnp.floating):
        raise SamplerError(
            f"positions must be floating point, got dtype {dtype}.\n  fix: "
            "positions.astype(jnp.float32)."
        )
    if not isinstance(positions, jax.core.Tracer):
        finite = np.isfinite(np.asarray(positions))
        if not finite.all():
            bad = np.argwhere(~finite.all(axis=1)).ravel()[:5].tolist()
            raise SamplerError(
                f"positions has non-finite (NaN/inf) entries in chains {bad}: every chain must "
                "start at a finite point."
            )
