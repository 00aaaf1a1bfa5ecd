"""`chain_take`: each chain reads another chain's value, moving only the rows it needs.

A gather by global chain index. `chain_all_gather` followed by indexing gives the same
values, but every device then receives every chain (`(D - 1) / D` of the ensemble's bytes).
When each chain reads a chain near its own index (the ancestors of systematic resampling,
a shift, a neighbour in a ring), a device needs only its own block and the edges of the
two blocks beside it: with `reach=r`, each device sends its first and last `r` chains to
its neighbours (two `ppermute`s, `2 r` rows received) and reads from that window. Whether
every index lies in its device's window is decided for the whole ensemble at once; if one
does not, every device takes the all-gather path instead. The values are copies either
way, so the result does not depend on the path, the reach or the device count.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, ArrayLike, Int, PyTree

from ._collectives import _frame, _gather_devices
from ._errors import CollectiveError


def _check(index: Array, reach: int | None) -> None:
    if index.ndim != 0 or not jnp.issubdtype(index.dtype, jnp.integer):
        raise CollectiveError(
            f"enn.chain_take(tree, index): index has shape {index.shape} and dtype "
            f"{index.dtype}; it must be one integer per chain (the global index of the chain "
            "to read).\n  fix: pass a scalar int per chain, e.g. "
            "enn.chain_take(x, (enn.chain_index() + 1) % enn.num_chains())."
        )
    if reach is not None and (isinstance(reach, bool) or not isinstance(reach, int) or reach < 0):
        raise CollectiveError(
            f"enn.chain_take(..., reach={reach!r}): reach must be None (gather every chain) "
            "or an int >= 0 (the chains each device sends to each neighbour).\n"
            "  fix: e.g. reach=enn.num_chains() // enn.num_devices() (one whole block)."
        )


def _window(block: list, frame, reach: int) -> list:
    """Each leaf's rows `[start - reach, stop + reach)` around this device's block `[start,
    stop)`; rows past the ensemble's ends are zeros (never read)."""
    last = frame.num_devices - 1
    to_next = [(d, d + 1) for d in range(last)]
    to_prev = [(d + 1, d) for d in range(last)]
    out = []
    for x in block:
        before = lax.ppermute(x[x.shape[0] - reach :], frame.mesh_axis, to_next)
        after = lax.ppermute(x[:reach], frame.mesh_axis, to_prev)
        out.append(jnp.concatenate([before, x, after]))
    # As the all-gather path does: the window ends a fusion, so the rows read are the
    # stored bits, not a producer recomputed inside the reader.
    return list(lax.optimization_barrier(out))


def chain_take(tree: PyTree, index: Int[ArrayLike, ""], *, reach: int | None = None) -> PyTree:
    """The value of each leaf of `tree` at global chain `index` (one index per chain).

    Call it inside a function run by `ensemble_map`. `reach=None` gathers every chain's
    value (as `chain_all_gather(tree)[index]`). With `reach=r`, a device receives only the
    `r` chains before its block and the `r` after it, when every chain of the ensemble reads
    within that window, and otherwise falls back to gathering every chain; the result is
    the same on either path and on any device count. Worth it when chains read near
    their own index and the ensemble's bytes are large against the links between devices.

    Args:
        tree: this chain's pytree of arrays.
        index: the global index of the chain to read, an integer scalar per chain.
        reach: chains exchanged with each neighbouring device (clipped to a device's
            block), or None.

    Returns:
        A pytree like `tree`: chain `index`'s values.

    Raises:
        CollectiveError: outside `ensemble_map`, for an index that is not one integer per
            chain, or a reach that is not None or an int >= 0.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> shift = lambda x: enn.chain_take(x, (enn.chain_index() + 1) % enn.num_chains(),
        ...                                  reach=1)
        >>> enn.ensemble_map(shift, in_roles=enn.PER_CHAIN)(jnp.arange(8.0)).tolist()
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 0.0]
    """
    frame = _frame("chain_take")
    index = jnp.asarray(index)
    _check(index, reach)
    leaves, treedef = jax.tree.flatten(tree)
    block = [lax.all_gather(jnp.asarray(x), frame.local_axis) for x in leaves]

    def everywhere(block: list, index: Array) -> list:
        return [x[index] for x in _gather_devices(block, frame, tiled=True)]

    if reach is None or frame.num_devices == 1:
        return jax.tree.unflatten(treedef, everywhere(block, index))
    reach = min(reach, frame.num_local)
    start = lax.axis_index(frame.mesh_axis) * frame.num_local
    offset = index - (start - reach)
    outside = ((offset < 0) | (offset >= frame.num_local + 2 * reach)).astype(jnp.int32)
    outside = lax.psum(lax.psum(outside, frame.local_axis), frame.mesh_axis)

    def near(block: list, index: Array) -> list:
        return [x[index - (start - reach)] for x in _window(block, frame, reach)]

    taken = lax.cond(outside == 0, near, everywhere, block, index)
    return jax.tree.unflatten(treedef, taken)
