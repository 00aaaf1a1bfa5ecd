"""What `samplers.run` fills in when the user leaves it out: the starting points (drawn
from the target) and the step sizes an adaptation tunes (started at 1.0)."""

from typing import Any

import equinox as eqx
import jax
import numpy as np
from jaxtyping import PRNGKeyArray

from .._errors import SamplerError, SamplerTypeError
from ..adaptation import Adaptation
from ..kernels import Sampler

INITIAL_STEP_SIZE = 1.0
"""Where an unset step size starts: the adaptation's step-size search rescales it."""

_DRAWS = 0x5EED  # the stream of `key` the starting points come from, apart from the run's


def initial_positions(logdensity: Any, positions: Any, num_chains: Any, key: PRNGKeyArray) -> Any:
    """`positions`, or starting points drawn from the target when they are None.

    A target with `initial_positions(key, num_chains)` (`samplers.targets.from_numpyro`:
    NumPyro's `init_to_uniform`) or `initial_position(key)` (the standard targets) draws
    them, from a stream of the run's key of its own.
    """
    if num_chains is not None and (
        isinstance(num_chains, bool) or not isinstance(num_chains, int | np.integer)
    ):
        raise SamplerTypeError(f"num_chains must be an int >= 1, got {num_chains!r}.")
    if num_chains is not None and num_chains < 1:
        raise SamplerError(f"num_chains must be an int >= 1, got {num_chains!r}.")
    if positions is not None:
        leading = {np.shape(x)[0] for x in jax.tree.leaves(positions) if np.ndim(x) >= 1}
        if num_chains is not None and leading and leading != {num_chains}:
            raise SamplerError(
                f"num_chains={num_chains}, but the positions have {sorted(leading)} chains "
                "(their leading axis).\n  fix: leave num_chains out when you pass positions."
            )
        return positions
    if num_chains is None:
        raise SamplerTypeError(
            "positions=None needs num_chains: how many chains to start.\n  fix: "
            "samplers.run(sampler, target, num_chains=128, key=..., num_steps=...), or "
            "pass positions of shape (num_chains, dim) (or a pytree of such arrays)."
        )
    draws_key = jax.random.fold_in(key, _DRAWS)
    many = getattr(logdensity, "initial_positions", None)
    if callable(many):
        return many(draws_key, int(num_chains))
    one = getattr(logdensity, "initial_position", None)
    if callable(one):
        return jax.vmap(one)(jax.random.split(draws_key, int(num_chains)))
    raise SamplerError(
        f"positions=None, but the log density ({type(logdensity).__name__}) cannot draw "
        "starting points: only a target with initial_positions(key, num_chains) or "
        "initial_position(key) can.\n  fix: pass positions, e.g. "
        "jax.random.normal(key, (num_chains, dim)), or a pytree with a leading chain axis."
    )


def start_unset(sampler: Sampler | None, adaptation: Adaptation | None) -> Sampler | None:
    """The sampler with its unset (None) step sizes at `INITIAL_STEP_SIZE` when an
    adaptation will tune them; without one, an error naming them."""
    if not isinstance(sampler, Sampler):
        return sampler
    unset = sampler.unset_hyperparameters()
    if not unset:
        return sampler
    name = type(sampler).__name__
    if adaptation is None:
        raise SamplerError(
            f"{name}.{unset[0]} is not set, and no adaptation is given to tune it.\n  fix: "
            f"samplers.{name}({unset[0]}=0.1, ...), or "
            "adaptation=samplers.WindowAdaptation() to tune it."
        )
    return eqx.tree_at(
        lambda s: [getattr(s, field) for field in unset],
        sampler,
        [INITIAL_STEP_SIZE] * len(unset),
        is_leaf=lambda x: x is None,
    )
