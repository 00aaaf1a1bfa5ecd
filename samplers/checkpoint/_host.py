"""Host (numpy) copies of a run's values, and the run's values rebuilt from them.

With several processes the copies hold the whole (global) arrays: taking them is collective.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import ensemblenn as enn


def is_arrayish(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray | jax.ShapeDtypeStruct)


def is_key(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def to_host(tree: Any) -> Any:
    """The array leaves of `tree` as numpy arrays holding the WHOLE array (typed keys as
    their key data); other leaves become None. With several processes this is collective:
    every process must call it."""
    tree = jax.tree.map(lambda x: x if is_arrayish(x) else None, tree)
    tree = jax.tree.map(lambda x: jax.random.key_data(x) if is_key(x) else x, tree)
    return enn.distributed.gather(tree)


def host_like(template: Any) -> Any:
    """An empty numpy array shaped like each array leaf's host copy (typed keys as key
    data): what `eqx.tree_deserialise_leaves` fills in."""

    def like(x: Any) -> Any:
        if not is_arrayish(x):
            return None
        if is_key(x):
            x = jax.eval_shape(jax.random.key_data, x)
        return np.empty(x.shape, x.dtype)  # untouched pages: no memory until loaded

    return jax.tree.map(like, template)


def from_host(host: Any, template: Any, key_impl: Any) -> Any:
    """Rebuild the run's values: host arrays into the template's array slots (as jax arrays,
    typed keys re-wrapped, weak types restored); the template's other leaves as they are."""

    def back(x: Any, t: Any) -> Any:
        if not is_arrayish(t):
            return t
        if is_key(t):
            return jax.random.wrap_key_data(x, impl=key_impl)
        x = jnp.asarray(x)
        return enn.weakly_typed(x) if getattr(t, "weak_type", False) else x

    return jax.tree.map(back, host, template, is_leaf=lambda x: x is None)
