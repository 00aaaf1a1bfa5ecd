"""A value with one entry per chain, for places whose role is otherwise broadcast."""

import equinox as eqx
from jaxtyping import Array

from ._roles import per_chain


class PerChainValue(eqx.Module):
    """Wraps an array whose leading axis is the ensemble axis.

    Useful where a field is broadcast by default, e.g. a sampler hyperparameter: the
    innermost declared role wins, so the wrapped array is sharded per chain and each
    chain's function sees its own entry as `.value`.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> step_sizes = enn.PerChainValue(jnp.arange(1.0, 9.0))
        >>> f = enn.ensemble_map(lambda s, x: x * s.value, in_roles=(None, enn.PER_CHAIN))
        >>> f(step_sizes, jnp.full(8, 0.5)).tolist()
        [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
    """

    value: Array = per_chain()
