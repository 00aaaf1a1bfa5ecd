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
        >>> step_sizes = enn.PerChainValue(jnp.linspace(0.1, 0.8, 8))
        >>> f = enn.ensemble_map(lambda s, x: x * s.value, in_roles=(None, enn.PER_CHAIN))
        >>> f(step_sizes, jnp.ones(8)).round(2).tolist()
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    """

    value: Array = per_chain()
