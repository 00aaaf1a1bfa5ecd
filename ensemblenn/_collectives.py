"""Cross-chain operations for functions run by `ensemble_map`.

They reduce over the whole ensemble: the chains of one device (the vmap axis) and the
devices (the mesh axis). Sums use one fixed association order, a balanced binary tree over
the global chain index (padded with zeros to a power of two), so results are bitwise
identical on any device count: each device reduces its block of chains, the partial sums
are gathered and the tree is finished. When a device's block is not a power of two in
size, each device sums the tree's nodes that lie inside its block (at most 2 log2 of the
block size) and those node sums are gathered, so the tree is still the same one.
"""

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Int, PyTree

from ._context import EnsembleFrame, current_frame
from ._errors import CollectiveError


def _frame(name: str, across_chains: bool = True) -> EnsembleFrame:
    frame = current_frame()
    if frame is None:
        raise CollectiveError(
            f"enn.{name}() was called outside a function run by ensemble_map, so there is "
            "no ensemble to reduce over.\n  fix: call it inside the per-chain function, e.g. "
            f"enn.ensemble_map(lambda x: x - enn.chain_mean(x), ...)."
        )
    if across_chains and frame.inside_block:
        raise CollectiveError(
            f"enn.{name}() was called inside a function wrapped in enn.batch_invariant, "
            "which runs a device's chains a block at a time, so a collective would see one "
            "block, not the ensemble.\n  fix: call the collective outside the wrapped "
            "function and pass its result in (or do not wrap code that needs the ensemble)."
        )
    return frame


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


_WORD = (jnp.dtype(jnp.float32), jnp.dtype(jnp.int32), jnp.dtype(jnp.uint32), jnp.dtype(bool))


def _carrier(dtype: Any) -> Any:
    """The dtype a leaf travels as in `_gather_devices`: float32 for the 32-bit kinds.

    float32, not uint32: the float leaves, which most programs gather, then reach their
    consumers untouched (a bitcast on their path changed XLA's fusion of the consumer, and
    with it the last bit of an R-hat on one device but not four).
    """
    return jnp.dtype(jnp.float32) if dtype in _WORD else dtype


def _to_carrier(x: Array, carrier: Any) -> Array:
    if x.dtype == carrier:
        return x
    if x.dtype == bool:
        x = x.astype(jnp.uint32)
    return lax.bitcast_convert_type(x, carrier)


def _from_carrier(x: Array, dtype: Any) -> Array:
    if x.dtype == dtype:
        return x
    if jnp.dtype(dtype) == jnp.dtype(bool):
        return lax.bitcast_convert_type(x, jnp.uint32) != 0
    return lax.bitcast_convert_type(x, dtype)


def _gather_devices(leaves: list, frame: EnsembleFrame, *, tiled: bool) -> list:
    """`lax.all_gather` of each leaf over the mesh axis, as one collective per width.

    Gathers are exact copies, so packing leaves into one flat buffer changes no bit: the
    32-bit leaves (float32, int32, uint32, and booleans widened) travel as their bits in
    one float32 buffer, other dtypes one buffer each. On CPU each collective has a fixed
    cost (a rendezvous of the device threads, tens of microseconds when simulated devices
    share cores) that a sampler's step pays once per leaf otherwise.

    On one device there is nothing to send, but the result must still end a fusion as a
    gather does: the code around it relies on that (without it, XLA fuses a value's
    producer into its consumer and may round the pair differently than on more devices).
    There each dtype's buffer passes an `optimization_barrier`, which XLA never fuses,
    with no bitcasts (they cost a Stretch step ~7 us); a barrier per leaf instead changed
    the fusion of a final R-hat.
    """
    send = frame.num_devices > 1
    leaves = [jnp.asarray(x) for x in leaves]
    out: list = [None] * len(leaves)
    groups: dict = {}
    for i, x in enumerate(leaves):
        if tiled and x.ndim == 0:  # lax's own error for a scalar tiled gather
            out[i] = lax.all_gather(x, frame.mesh_axis, tiled=True)
        else:
            groups.setdefault(_carrier(x.dtype) if send else x.dtype, []).append(i)
    for carrier, members in groups.items():
        flat = jnp.concatenate([_to_carrier(leaves[i], carrier).reshape(-1) for i in members])
        if send:
            every = lax.all_gather(flat, frame.mesh_axis)  # (devices, total)
        else:
            every = lax.optimization_barrier(flat)[None]
        offset = 0
        for i in members:
            x = leaves[i]
            part = every[:, offset : offset + x.size].reshape(frame.num_devices, *x.shape)
            part = _from_carrier(part, x.dtype)
            offset += x.size
            out[i] = part.reshape(-1, *x.shape[1:]) if tiled else part
    return out


def tree_sum(x: Array) -> Array:
    """Sum over axis 0 in a balanced binary tree: pairs (0,1), (2,3), ... then pairs of
    pairs. Pads with zeros to a power of two. The order depends only on the length."""
    # Two levels at a time, as a reshape and unit slices (XLA:CPU vectorises these, not
    # strided slices), each level padded only up to a multiple of 4: the zeros the full
    # power-of-two padding would add meet the same nodes, so the bits are the same, and
    # the (often long, fused) leaves are not padded.
    while x.shape[0] > 1:
        width = 4 if x.shape[0] > 2 else 2
        if x.shape[0] % width:
            pad = jnp.zeros((width - x.shape[0] % width,) + x.shape[1:], x.dtype)
            x = jnp.concatenate([x, pad])
        q = x.reshape((-1, width) + x.shape[1:])
        x = q[:, 0] + q[:, 1] if width == 2 else (q[:, 0] + q[:, 1]) + (q[:, 2] + q[:, 3])
    return x[0]


def _bits_promised() -> bool:
    """Whether per-chain arithmetic must come out the same on any device count here:
    outside `ensemble_map` (the caller's program is not ours to judge), inside one with a
    `block_size` (the bitwise mode) or inside `batch_invariant` code. An `ensemble_map`
    without one promises its results to rounding only, and `rounded` / `ordered_sum` are
    plain arithmetic there."""
    frame = current_frame()
    return frame is None or frame.block_size is not None or frame.inside_block


def _round(x: Array) -> Array:
    """`rounded`, whatever the frame (the cross-chain sums keep their bits everywhere)."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return x
    # The 1.0 comes from one element, not from each: a per-element select and multiply
    # cost more than the arithmetic they guard (a third of a Stretch step).
    first = x.reshape(-1)[0] if x.size else jnp.zeros((), x.dtype)
    one = 1.0 + 0.0 * jnp.where(jnp.isfinite(first), first, jnp.zeros_like(first))
    return x * one


def rounded(x: Array) -> Array:
    """`x`, rounded to its dtype before any addition sees it, where bits are promised.

    XLA may contract a multiply into the addition that follows (`a*b + c` as one FMA), and
    whether it does depends on fusion, hence on the program around it, hence on the number
    of chains per device. Multiplying by a 1.0 that XLA cannot constant-fold ends the
    caller's expression in a plain rounding multiply (an FMA of `a * 1.0 + b` equals
    `a + b` exactly), so what follows sees the same value in every program.

    The guard acts outside `ensemble_map`, inside one with a `block_size` (the bitwise
    mode) and in `enn.batch_invariant` code. Inside an `ensemble_map` without one, whose
    results are the same to rounding only, it returns `x` untouched: the guard ends a
    fusion, so `x` makes a trip through memory, which on an accelerator is most of a cheap
    step (a MALA step at 16384 chains on a TPU v5e: 270 µs guarded, 78.5 µs not, with
    `ordered_sum` likewise; docs/benchmarks.md §15).

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> m1, m2 = jnp.float32(1.5), jnp.float32(3.0)
        >>> float(m2 - enn.rounded(m1 * m1))  # a variance that no FMA can reorder
        0.75
    """
    x = jnp.asarray(x)
    return _round(x) if _bits_promised() else x


def ordered_sum(x: Array, axis: int = -1) -> Array:
    """Sum along `axis` in one fixed order, the same in every program, where bits are
    promised (as for `enn.rounded`: outside `ensemble_map`, inside one with a
    `block_size`, in `enn.batch_invariant` code); elsewhere `jnp.sum`.

    `jnp.sum`'s association order is XLA's choice and changes with the batch shape (the
    number of chains per device) and fusion. This sums a balanced binary tree over the
    axis (padded with zeros to a power of two) after `enn.rounded`, so per-chain
    statistics such as a mean over dimensions come out bitwise the same on any device
    count. Slower than `jnp.sum` for long axes (on a TPU v5e, 28 against 11 µs for 16384
    sums of 100), hence `jnp.sum` where the results are promised to rounding only.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> float(enn.ordered_sum(jnp.arange(5.0)))  # ((0 + 1) + (2 + 3)) + (4 + 0)
        10.0
        >>> enn.ordered_sum(jnp.ones((2, 3)), axis=0).tolist()
        [2.0, 2.0, 2.0]
    """
    x = jnp.asarray(x)
    if not _bits_promised():
        return jnp.sum(x, axis=axis)
    return tree_sum(jnp.moveaxis(_round(x), axis, 0))


def _tree_nodes(start: int, stop: int) -> list[tuple[int, int]]:
    """The maximal nodes `(level, index)` of the global tree (node `(k, i)` covers chains
    `[i 2^k, (i + 1) 2^k)`) that tile `[start, stop)`: at most 2 log2(stop - start)."""
    nodes = []
    while start < stop:
        level = 0
        while (start % (2 << level) == 0) and start + (2 << level) <= stop:
            level += 1
        nodes.append((level, start >> level))
        start += 1 << level
    return nodes


def _sum_by_nodes(local: Array, frame: EnsembleFrame) -> Array:
    """The fixed-tree sum when a device's block of chains is not a power of two: each
    device sums the tree nodes that lie inside its block, the node sums are gathered (a
    few per device rather than every chain's value) and the top of the tree is finished
    from them, in the same order as `tree_sum` over every chain."""
    n, per = frame.num_chains, frame.num_local
    nodes = [_tree_nodes(d * per, (d + 1) * per) for d in range(frame.num_devices)]
    width = max(len(ns) for ns in nodes)
    zero = jnp.zeros_like(local[0])

    def branch(d: int) -> Any:
        def node_sums(local: Array) -> Array:
            sums = [
                tree_sum(local[i * (1 << k) - d * per : (i + 1) * (1 << k) - d * per])
                for k, i in nodes[d]
            ]
            return jnp.stack(sums + [zero] * (width - len(sums)))

        return node_sums

    mine = lax.switch(
        lax.axis_index(frame.mesh_axis), [branch(d) for d in range(frame.num_devices)], local
    )
    (every,) = _gather_devices([mine], frame, tiled=False)  # (devices, width, ...)
    where = {node: (d, slot) for d, ns in enumerate(nodes) for slot, node in enumerate(ns)}

    def node(k: int, i: int) -> Array:
        if (k, i) in where:
            return every[where[(k, i)]]
        if i << k >= n:
            return zero  # only the zero padding below this node
        return node(k - 1, 2 * i) + node(k - 1, 2 * i + 1)

    return node(max(n - 1, 0).bit_length(), 0)


def _sum_leaves(tree: PyTree, frame: EnsembleFrame) -> PyTree:
    leaves, treedef = jax.tree.flatten(tree)
    # (num_local, ...) per leaf: the same for every local chain.
    local = [lax.all_gather(_round(x), frame.local_axis) for x in leaves]
    if not _is_pow2(frame.num_local):
        return jax.tree.unflatten(treedef, [_sum_by_nodes(x, frame) for x in local])
    partials = _gather_devices([tree_sum(x) for x in local], frame, tiled=False)
    return jax.tree.unflatten(treedef, [tree_sum(p) for p in partials])


def chain_sum(tree: PyTree) -> PyTree:
    """Sum of each leaf over every chain in the ensemble.

    Bitwise identical whatever the number of devices (see the module docstring).

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> f = enn.ensemble_map(lambda x: enn.chain_sum(x), in_roles=enn.PER_CHAIN)
        >>> float(f(jnp.arange(8.0)))
        28.0
    """
    return _sum_leaves(tree, _frame("chain_sum"))


def chain_mean(tree: PyTree) -> PyTree:
    """Mean of each leaf over every chain (the same value in every chain).

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> f = enn.ensemble_map(lambda x: x - enn.chain_mean(x), in_roles=enn.PER_CHAIN)
        >>> f(jnp.arange(4.0)).tolist()
        [-1.5, -0.5, 0.5, 1.5]
    """
    frame = _frame("chain_mean")
    return jax.tree.map(lambda x: x / frame.num_chains, _sum_leaves(tree, frame))


def chain_all_gather(tree: PyTree) -> PyTree:
    """Every chain's value of each leaf, stacked in global chain order: `(num_chains, ...)`.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> f = enn.ensemble_map(lambda x: enn.chain_all_gather(x)[::-1].sum() * 0 + x,
        ...                      in_roles=enn.PER_CHAIN)
        >>> f(jnp.arange(4.0)).tolist()
        [0.0, 1.0, 2.0, 3.0]
    """
    frame = _frame("chain_all_gather")
    leaves, treedef = jax.tree.flatten(tree)
    local = [lax.all_gather(jnp.asarray(x), frame.local_axis) for x in leaves]
    return jax.tree.unflatten(treedef, _gather_devices(local, frame, tiled=True))


def chain_index() -> Int[Array, ""]:
    """This chain's global index in `[0, num_chains)`, the same on any device count.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> f = enn.ensemble_map(lambda x: x * 0 + enn.chain_index(), in_roles=enn.PER_CHAIN)
        >>> f(jnp.zeros(4, jnp.int32)).tolist()
        [0, 1, 2, 3]
    """
    frame = _frame("chain_index")
    device = lax.axis_index(frame.mesh_axis)
    return device * frame.num_local + lax.axis_index(frame.local_axis)


def num_chains() -> int:
    """The number of chains in the ensemble (a Python int).

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> f = enn.ensemble_map(lambda x: x + enn.num_chains(), in_roles=enn.PER_CHAIN)
        >>> f(jnp.zeros(4)).tolist()
        [4.0, 4.0, 4.0, 4.0]
    """
    return _frame("num_chains", across_chains=False).num_chains


def num_devices() -> int:
    """The number of devices the ensemble is sharded over (a Python int).

    Example:
        >>> import jax, jax.numpy as jnp, ensemblenn as enn
        >>> f = enn.ensemble_map(lambda x: x + enn.num_devices(), in_roles=enn.PER_CHAIN)
        >>> f(jnp.zeros(4)).tolist() == [float(jax.device_count())] * 4
        True
    """
    return _frame("num_devices", across_chains=False).num_devices


def device_index() -> Int[Array, ""]:
    """This device's position along the ensemble's mesh axis: chains
    `device_index() * num_chains() // num_devices()` onwards live on it.

    The value is the same for every chain of a device, so work that depends only on it
    (and on values gathered across chains) runs once per device, not once per chain:
    the pattern for splitting an ensemble-wide computation into per-device shares,
    recombined with `device_all_gather`.

    Example:
        >>> import jax, jax.numpy as jnp, ensemblenn as enn
        >>> f = enn.ensemble_map(lambda x: x + enn.device_index(), in_roles=enn.PER_CHAIN)
        >>> per_device = jax.device_count()
        >>> f(jnp.zeros(per_device)).tolist() == [float(i) for i in range(per_device)]
        True
    """
    return jax.lax.axis_index(_frame("device_index").mesh_axis)


def device_all_gather(tree: PyTree) -> PyTree:
    """Every device's value of `tree` (computed once per device, e.g. from
    `device_index()`), concatenated along the leading axis in device order.

    Example:
        >>> import jax, jax.numpy as jnp, ensemblenn as enn
        >>> share = lambda x: enn.device_all_gather(enn.device_index()[None])[enn.chain_index()]
        >>> f = enn.ensemble_map(share, in_roles=enn.PER_CHAIN)
        >>> n = jax.device_count()
        >>> f(jnp.zeros(n)).tolist() == list(range(n))
        True
    """
    frame = _frame("device_all_gather")
    leaves, treedef = jax.tree.flatten(tree)
    return jax.tree.unflatten(treedef, _gather_devices(leaves, frame, tiled=True))
