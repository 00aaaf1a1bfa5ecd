"""What `samplers.run` checks before anything compiles."""

from typing import Any

import jax
import numpy as np

import ensemblenn as enn

from ..adaptation import Adaptation
from ..kernels import Sampler


def check_logdensity(logdensity: Any, one: Any) -> None:
    """The log-density must map one chain's position (`one`: its pytree of
    `jax.ShapeDtypeStruct`) to a scalar."""
    try:
        out = jax.eval_shape(logdensity, one)
    except TypeError:
        return  # e.g. a minibatch log-density (position, indices): its kernel checks it
    if not hasattr(out, "shape") or out.shape != ():
        shape = getattr(out, "shape", type(out).__name__)
        given = jax.tree.map(lambda x: x.shape, one)
        raise enn.EnsembleError(
            f"logdensity must return a scalar for ONE position of shape "
            f"{given}, but it returns {shape}.\n  fix: sum the terms, e.g. "
            "return jnp.sum(log_terms); samplers.run maps it over the chains itself."
        )


def check_key(key: Any) -> None:
    # One home for what a key is: enn.chain_keys, which run calls with this key.
    try:
        jax.eval_shape(lambda k: enn.chain_keys(k, 1), key)
    except enn.EnsembleError as err:
        raise type(err)(f"samplers.run(key=...): {err}") from None
    except TypeError:
        raise enn.EnsembleError(
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
    for name, value in (("chunk_size", chunk_size), ("checkpoint_every", checkpoint_every)):
        if value is not None and (not _is_int(value) or value < 1):
            raise enn.EnsembleError(
                f"{name} must be None or an int >= 1, got {value!r}.\n  fix: {name}=None "
                "(the default) or a positive number of steps."
            )
    if superchain_size is not None:
        if not _is_int(superchain_size) or superchain_size < 1:
            raise enn.EnsembleError(
                f"superchain_size must be None or an int >= 1, got {superchain_size!r}."
            )
        if num_chains % superchain_size:
            raise enn.EnsembleError(
                f"superchain_size={superchain_size} does not divide the {num_chains} chains.\n"
                f"  fix: a divisor of {num_chains} (superchains of consecutive chains, all the "
                "same size)."
            )
    if (
        block_size is not None
        and block_size != "auto"
        and (not _is_int(block_size) or block_size < 1)
    ):
        raise enn.EnsembleError(
            f'block_size must be "auto", None or an int >= 1, got {block_size!r}.'
        )
    if reference is not None and not hasattr(reference, "second_moment"):
        raise enn.EnsembleError(
            f"reference must be None or a samplers.targets.Moments (known moments of the "
            f"target), got {reference!r}.\n  fix: reference=target.reference, or leave it out."
        )
    if not isinstance(track_bias, bool):
        raise enn.EnsembleError(f"track_bias must be True or False, got {track_bias!r}.")


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
        raise enn.EnsembleError(
            f"sampler must be a samplers.Sampler (e.g. samplers.HMC(...)), got "
            f"{type(sampler).__name__}."
        )
    if adaptation is not None and not isinstance(adaptation, Adaptation):
        raise enn.EnsembleError(
            f"adaptation must be a samplers.Adaptation (e.g. samplers.LAPS(...)), got "
            f"{type(adaptation).__name__}."
        )
    if not callable(logdensity):
        raise enn.EnsembleError(
            f"logdensity must be callable (a function or a target module), got "
            f"{type(logdensity).__name__}."
        )
    for name, value, low in (("num_steps", num_steps, 1), ("num_warmup", num_warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise enn.EnsembleError(f"{name} must be an int >= {low}, got {value!r}.")
    if thin is not None and (not isinstance(thin, int) or thin < 1 or thin > num_steps):
        raise enn.EnsembleError(f"thin must be None or an int in [1, num_steps], got {thin!r}.")
    if hasattr(positions, "shape") and hasattr(positions, "dtype") and np.ndim(positions) < 2:
        raise enn.EnsembleError(
            f"positions must have shape (num_chains, dim), got shape {np.shape(positions)}.\n"
            "  fix: stack one initial position per chain, e.g. jnp.zeros((num_chains, dim)), "
            "or pass a pytree of such arrays (e.g. {'mu': jnp.zeros(num_chains)})."
        )


def check_finite(flat: Any) -> None:
    """Every chain starts at a finite point (`flat`: the raveled `(num_chains, dim)`)."""
    if not isinstance(flat, jax.core.Tracer):
        finite = np.isfinite(np.asarray(flat))
        if not finite.all():
            bad = np.argwhere(~finite.all(axis=1)).ravel()[:5].tolist()
            raise enn.EnsembleError(
                f"positions has non-finite (NaN/inf) entries in chains {bad}: every chain must "
                "start at a finite point."
            )
