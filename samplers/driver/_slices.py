"""A dynamic-update-slice that stays one when batched over chains.

`jax.vmap` turns `lax.dynamic_update_slice` into a clipped scatter, whatever its indices,
and XLA lowers that scatter as a read of the old slice, a bounds check and a select before
the write. The driver's per-step trace row sits at an index that is the same for every
chain (it comes from the step number), and there the batched write is one plain
dynamic-update-slice along the chains' axis: on a TPU v5e at 16384 chains, 12 µs less
per MALA step and 9 µs per HMC step (docs/benchmarks.md §15).

Not for the streaming moments: reading and writing one of their two halves by index
instead of selecting over both made a 16384-chain MALA step 3.3x slower on the TPU (the
halves axis, of length 2, is tiled with the chains).
"""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from jaxtyping import Array


@jax.custom_batching.custom_vmap
def update_slice(buffer: Array, update: Array, start: tuple[Array, ...]) -> Array:
    """`lax.dynamic_update_slice(buffer, update, start)` for one chain; under `jax.vmap`
    with `start` the same for every chain, one dynamic-update-slice of the batch.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> rows = jax.vmap(update_slice, in_axes=(0, 0, None))(
        ...     jnp.zeros((2, 4)), jnp.ones((2, 2)), (jnp.int32(1),))
        >>> rows.tolist()
        [[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0]]
    """
    return jax.lax.dynamic_update_slice(*_one_type(buffer, update), start)


def _one_type(buffer: Array, update: Array) -> tuple[Array, Array]:
    """`buffer` and `update` with one sharding type, which dynamic_update_slice insists on.

    Under `jax.set_mesh` of an Explicit mesh, `enn.batch_invariant` traces one chain's code
    with a position typed on the mesh while the run's trace buffer (an operand) is typed
    on none; both are then typed replicated on the mesh (outside that trace the types
    agree and nothing changes)."""
    have, want = jax.typeof(update).sharding, jax.typeof(buffer).sharding
    if have == want:
        return buffer, update
    if getattr(want.mesh, "empty", False):
        return jax.sharding.reshard(buffer, P()), jax.sharding.reshard(update, P())
    return buffer, jax.sharding.reshard(update, want.spec)


@update_slice.def_vmap
def _batched(axis_size: int, in_batched: list, buffer: Array, update: Array,
             start: tuple[Array, ...]) -> tuple[Array, bool]:  # fmt: skip
    buffer_batched, update_batched, start_batched = in_batched
    if not buffer_batched:
        buffer = jnp.broadcast_to(buffer, (axis_size, *buffer.shape))
    if not update_batched:
        update = jnp.broadcast_to(update, (axis_size, *update.shape))
    if any(start_batched):  # a place per chain: vmap's own scatter
        axes = tuple(0 if b else None for b in start_batched)
        return jax.vmap(jax.lax.dynamic_update_slice, in_axes=(0, 0, axes))(
            buffer, update, start
        ), True
    chains = jnp.zeros((), jnp.result_type(*start)) if start else jnp.int32(0)
    return jax.lax.dynamic_update_slice(*_one_type(buffer, update), (chains, *start)), True
