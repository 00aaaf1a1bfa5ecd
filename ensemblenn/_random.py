"""Per-chain PRNG keys that depend on the global chain index only."""

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array

from ._errors import EnsembleError, EnsembleTypeError
from ._mesh import resolve_mesh
from .distributed import place


def _check_key(key: Array) -> bool:
    """Validate a single key; return True for a typed key, False for a raw uint32[2]."""
    if isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise EnsembleError(
                f"chain_keys expects ONE key, got a typed key array of shape {key.shape}.\n"
                "  fix: pass jax.random.key(seed); chain_keys makes the per-chain keys."
            )
        return True
    shape, dtype = jnp.shape(key), getattr(key, "dtype", None)
    if shape != (2,) or dtype != jnp.uint32:
        wrong_type = dtype is None or dtype != jnp.uint32
        raise (EnsembleTypeError if wrong_type else EnsembleError)(
            f"chain_keys expects a typed key (jax.random.key) or a raw uint32[2] key "
            f"(jax.random.PRNGKey), got {dtype}{list(shape)}.\n"
            "  fix: key = jax.random.key(0)"
        )
    return False


@functools.partial(jax.jit, static_argnums=1)
def _fold_in_range(key: Array, num_chains: int) -> Array:
    # One compiled program, not an eager vmap of a dozen dispatches (~1.5 ms a call).
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(num_chains))


def chain_keys(key: Array, num_chains: int, *, mesh: Any = None, axis: str = "chains") -> Array:
    """One PRNG key per chain: key `i` is `fold_in(key, i)`.

    Key `i` depends only on `key` and `i`, not on the device count or on how many chains
    there are, so adding chains or devices never changes an existing chain's randomness.
    Typed keys give a `key<impl>[num_chains]` array, raw `uint32[2]` keys give
    `uint32[num_chains, 2]` (chains on the leading axis, never transposed).

    With several processes (`jax.distributed.initialize`) the keys come back as one global
    array laid out over `axis` of `mesh` (resolved as `enn.resolve_mesh` does), which every
    process can pass to `ensemble_map`; with one process they are returned as computed
    (`ensemble_map` places them), whatever `mesh` is.

    Example:
        >>> import jax, ensemblenn as enn
        >>> keys = enn.chain_keys(jax.random.key(0), 8)
        >>> keys.shape
        (8,)
        >>> bool((jax.random.key_data(keys[3]) ==
        ...       jax.random.key_data(enn.chain_keys(jax.random.key(0), 4)[3])).all())
        True
    """
    if not isinstance(num_chains, int) or isinstance(num_chains, bool):
        raise EnsembleTypeError(
            f"num_chains must be a positive int, got {num_chains!r} "
            f"({type(num_chains).__name__}).\n  fix: chain_keys(key, 8)."
        )
    if num_chains < 1:
        raise EnsembleError(
            f"num_chains must be a positive int, got {num_chains!r}.\n  fix: chain_keys(key, 8)."
        )
    if not isinstance(axis, str):
        raise EnsembleTypeError(f"axis must be a mesh axis name (a str), got {axis!r}.")
    _check_key(key)
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    keys = _fold_in_range(key, num_chains)
    if jax.process_count() == 1 or isinstance(keys, jax.core.Tracer):
        return keys
    return place(keys, NamedSharding(resolve_mesh(mesh, axis), P(axis)))
