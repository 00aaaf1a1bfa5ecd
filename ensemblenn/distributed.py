"""Ensembles that span several processes: placement, and the runtime's CPU collectives.

After `jax.distributed.initialize`, `jax.devices()` lists every process's devices and a
mesh over them holds *global* arrays, of which each process addresses only its own shards.
`ensemble_map` places host data that is the same on every process by itself; this module
covers the rest: arrays assembled from each process's own block of chains (`global_array`),
typed PRNG keys (`place`, which `jax.device_put` refuses for other processes' devices), and
the two runtime checks a launcher needs (`backends_started`, `pin_cpu_collectives`).
`enn.chain_keys(key, n, mesh=...)` uses `place` to give the keys as one global array.

With one process every function here is the plain single-process operation.

Example:
    >>> import numpy as np, jax, ensemblenn as enn
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = enn.resolve_mesh()
    >>> keys = enn.distributed.place(jax.random.split(jax.random.key(0), 4),
    ...                              NamedSharding(mesh, P("chains")))
    >>> keys.shape, enn.distributed.global_array(np.zeros((4, 2))).shape
    ((4,), (4, 2))
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array

from . import _jax_private
from ._mesh import resolve_mesh

__all__ = ["backends_started", "global_array", "pin_cpu_collectives", "place"]


def place(x: Any, sharding: NamedSharding) -> Any:
    """`jax.device_put(x, sharding)`, typed PRNG keys included, for any process count.

    `x` is host data (or an array) that is the same on every process. `jax.device_put`
    refuses typed key arrays for shardings with other processes' devices; their key data
    it accepts, so keys are placed as data and re-wrapped with the same implementation.

    Example:
        >>> import jax, ensemblenn as enn
        >>> from jax.sharding import NamedSharding, PartitionSpec as P
        >>> keys = jax.random.split(jax.random.key(0), 4)
        >>> placed = enn.distributed.place(keys, NamedSharding(enn.resolve_mesh(), P("chains")))
        >>> bool((jax.random.key_data(placed) == jax.random.key_data(keys)).all())
        True
    """
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        data = jax.device_put(jax.random.key_data(x), sharding)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    return jax.device_put(x, sharding)


def global_array(local: Any, mesh: Any = None, axis: str = "chains") -> Array:
    """One global per-chain array from each process's own block of chains.

    Process `p` passes the chains its devices hold, in process order; the result has every
    process's chains along the leading axis, sharded over `axis` of `mesh` (resolved as
    `enn.resolve_mesh` does). With one process it is `local`, placed.

    Raises:
        enn.MeshError: the mesh has no axis named `axis`.

    Example:
        >>> import numpy as np, ensemblenn as enn
        >>> enn.distributed.global_array(np.zeros((8, 3), np.float32)).shape
        (8, 3)
    """
    sharding = NamedSharding(resolve_mesh(mesh, axis), P(axis))
    return jax.make_array_from_process_local_data(sharding, np.asarray(local))


def backends_started() -> bool:
    """Whether JAX has created its backends in this process: after that,
    `jax.distributed.initialize` is too late.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> _ = jnp.zeros(1)   # any computation starts the backends
        >>> enn.distributed.backends_started()
        True
    """
    return _jax_private.backends_started()


def pin_cpu_collectives(host: str) -> bool:
    """Make the CPU backend's gloo collectives listen on `host` (e.g. the loopback) rather
    than on the address the machine's hostname resolves to, which may be a public one.

    Call it after choosing gloo (`jax_cpu_collectives_implementation`) and before the first
    computation. It relies on JAX internals, so it is guarded: if they moved, nothing is
    changed and False is returned (the collectives then listen on the default address).

    Example:
        A launcher pins before any computation (`samplers.distributed.initialize` does):

        >>> import jax, ensemblenn as enn
        >>> def start(num_processes, process_id, port):
        ...     jax.config.update("jax_cpu_collectives_implementation", "gloo")
        ...     enn.distributed.pin_cpu_collectives("127.0.0.1")
        ...     jax.distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id)
    """
    try:
        _jax_private.pin_cpu_collectives_to(host)
        return True
    except Exception:  # noqa: BLE001 - only the pinning is lost
        return False
