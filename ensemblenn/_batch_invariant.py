"""Per-chain code whose floating-point results do not depend on the local batch size.

`ensemble_map` runs per-chain code under `jax.vmap` over the chains a device holds, so one
device with 64 chains compiles it for a batch of 64 and eight devices compile it for 8.
XLA picks a different reduction order (and vectorisation) for different batch shapes, so
`jnp.sum`, `jnp.dot` and `jnp.linalg.norm` inside a log density or an integrator can
differ in the last bit between device counts (measured on CPU, jax 0.10.2: for a
100-dimensional sum of squares every local batch below 64 rounds differently from 256),
and an MCMC trajectory amplifies a last bit to 1e-4 in float32 within a hundred steps.

`batch_invariant` removes the dependence: the function is always compiled for a block of
`block_size` chains, and a loop walks the local chains block by block. The loop's trip
count is hidden from XLA and its buffers hold one spare block, so XLA can neither inline a
single-trip loop nor simplify its slices into whole-array operations: the block body is
the same program on every device count.
"""

import contextlib
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.extend import core as jex_core

from ._context import current_frame, entered
from ._errors import EnsembleError, EnsembleTypeError
from ._jax_private import is_batched_over

__all__ = ["batch_invariant"]

_T = TypeVar("_T")
_PROBE_AXIS = "_enn_batch_invariant_probe"


def _pad_rows(x: jax.Array, rows: int) -> jax.Array:
    # Padding repeats the first chain: real data, so the spare rows cannot produce NaNs
    # that would trip a debug_nans run.
    extra = rows - x.shape[0]
    return jnp.concatenate([x, jnp.broadcast_to(x[:1], (extra, *x.shape[1:]))])


def _typed_like(update: jax.Array, buffer: jax.Array) -> jax.Array:
    """`update` with `buffer`'s sharding type, which dynamic_update_slice insists on.

    Under `jax.set_mesh` with an Explicit mesh the buffer is typed on that mesh, while an
    output computed from constants alone is typed on no mesh at all.
    """
    have, want = jax.typeof(update).sharding, jax.typeof(buffer).sharding
    if have == want or not getattr(have.mesh, "empty", False):
        return update
    return jax.sharding.reshard(update, want.spec)


def _by_blocks(
    one_chain: Callable[..., list],
    operands: list,
    batched: list[bool],
    num_chains: int,
    block_size: int,
    out_avals: list,
) -> tuple[list, list[bool]]:
    """`one_chain` over `num_chains` chains, `block_size` at a time, in a loop; and which
    of its outputs a plain `vmap` over the batched operands would batch.

    `out_avals` are one chain's output types: the buffers are sized from them, and the
    block body, traced once, also tells which outputs vary, so `one_chain` is evaluated
    only once here (tracing time matters: a run has dozens of these).
    """
    num_blocks = -(-num_chains // block_size)
    rows = (num_blocks + 1) * block_size  # one spare block; see the module docstring
    padded = [_pad_rows(x, rows) if b else x for x, b in zip(operands, batched)]
    in_axes = [0 if b else None for b in batched]
    varies: list[bool] = []

    def probe(ops: list) -> list:
        out = one_chain(ops)
        varies[:] = [is_batched_over(o, _PROBE_AXIS) for o in out]
        return out

    block_fn = jax.vmap(probe, in_axes=(in_axes,), axis_name=_PROBE_AXIS)

    def block_of(i: jax.Array) -> list:
        return [
            jax.lax.dynamic_slice_in_dim(x, i * block_size, block_size) if b else x
            for x, b in zip(padded, batched)
        ]

    outputs = [jnp.zeros((rows, *a.shape), a.dtype) for a in out_avals]

    def body(i: jax.Array, outputs: list) -> list:
        results = block_fn(block_of(i))
        return [
            jax.lax.dynamic_update_slice_in_dim(o, _typed_like(r, o), i * block_size, 0)
            for o, r in zip(outputs, results)
        ]

    trip_count = jax.lax.optimization_barrier(jnp.int32(num_blocks))
    outputs = jax.lax.fori_loop(0, trip_count, body, outputs)
    return [o[:num_chains] for o in outputs], varies


AUTO_BLOCKS = 8
"""`block_size="auto"` is `num_chains // AUTO_BLOCKS`: no padding on up to 8 devices."""


def check_block_size(
    block_size: Any, *, allow_none: bool, allow_auto: bool = False
) -> int | str | None:
    """`block_size` if it is a positive int (or None / "auto" where allowed), else a clear
    error."""
    if block_size is None and allow_none:
        return None
    if block_size == "auto" and allow_auto:
        return "auto"
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        options = " or None" if allow_none else ""
        options += ' or "auto"' if allow_auto else ""
        wrong_type = isinstance(block_size, bool) or not isinstance(block_size, int)
        raise (EnsembleTypeError if wrong_type else EnsembleError)(
            f"block_size={block_size!r}: it must be a positive int (chains per compiled "
            f"block){options}.\n  fix: block_size=16."
        )
    return block_size


def resolve_block_size(block_size: int | str | None, num_chains: int) -> int | None:
    """The block for an ensemble of `num_chains`: "auto" depends on the chain count only,
    never on the device count, so every device count gets the same block."""
    if block_size == "auto":
        return max(1, num_chains // AUTO_BLOCKS)
    return block_size  # type: ignore[return-value]


def batch_invariant(fn: Callable[..., _T], *, block_size: int | None = None) -> Callable[..., _T]:
    """Wrap per-chain code so its results are the same for any number of chains per device.

    Use it inside per-chain code around collective-free work (a log density and its
    gradient, an MCMC transition). Under the ensemble's `vmap` it walks the device's
    chains `block_size` at a time, so every device count runs the same compiled block and
    gets the same bits; called on a single chain it runs that chain as a block. The price
    is a loop over blocks instead of one wide batch, and a device holding fewer than
    `block_size` chains pads its block with copies of its first chain. Equal `block_size`
    gives equal bits; another `block_size` may change the last bits.

    Args:
        fn: a function of one chain's values. What it closes over (per-chain values
            included) is handled. It must not call collectives such as `enn.chain_mean`
            (they would see one block, not the ensemble), and a `jax.vmap` inside the
            per-chain code is batched as usual (only the ensemble's own vmap is blocked).
            Take gradients inside `fn`: the wrapper itself cannot be differentiated in
            reverse mode.
        block_size: chains per compiled block. `None` (the default) takes the
            `block_size` of the enclosing `enn.ensemble_map`; when that is `None` too,
            `fn` runs unchanged, over all of a device's chains at once.

    Returns:
        A function with `fn`'s signature and outputs.

    Raises:
        EnsembleError: for a `block_size` that is not a positive integer.

    Example:
        The same per-chain norm on 1 and on 4 devices (64 and 16 chains per device):

        >>> import jax, jax.numpy as jnp, numpy as np, ensemblenn as enn
        >>> x = jnp.asarray(np.random.default_rng(0).standard_normal((64, 100)), jnp.float32)
        >>> norm = enn.batch_invariant(lambda v: jnp.sqrt(jnp.sum(v * v)))
        >>> def on(devices):
        ...     mesh = jax.make_mesh((devices,), ("chains",), devices=jax.devices()[:devices])
        ...     return enn.ensemble_map(norm, mesh=mesh, in_roles=enn.PER_CHAIN,
        ...                             block_size=8)(x)
        >>> bool(np.array_equal(on(1), on(4)))
        True
    """
    block_size = check_block_size(block_size, allow_none=True)

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        frame = current_frame()
        size = block_size if block_size is not None else getattr(frame, "block_size", None)
        if size is None:
            return fn(*args, **kwargs)
        dynamic, static = eqx.partition((args, kwargs), eqx.is_array)
        leaves, treedef = jax.tree.flatten(dynamic)
        static_out: list = []

        def flat(*leaves: Any) -> list:
            a, k = eqx.combine(jax.tree.unflatten(treedef, list(leaves)), static)
            out_dynamic, out_static = eqx.partition(fn(*a, **k), eqx.is_array)
            static_out[:] = [out_static]
            out_leaves, out_tree = jax.tree.flatten(out_dynamic)
            static_out.append(out_tree)
            return out_leaves

        # Trace once to turn everything `fn` closes over into explicit operands: a
        # closed-over per-chain value must be batched like an argument.
        with entered(frame._replace(inside_block=True)) if frame else contextlib.nullcontext():
            closed = jax.make_jaxpr(flat)(*leaves)
        out_static, out_tree = static_out
        jaxpr, consts = closed.jaxpr, list(closed.consts)
        out_avals = list(closed.out_avals)
        num_consts = len(consts)

        def one_chain(operands: list) -> list:
            c, x = operands[:num_consts], operands[num_consts:]
            return jex_core.jaxpr_as_fun(jex_core.ClosedJaxpr(jaxpr, c))(*x)

        @jax.custom_batching.custom_vmap
        def call(operands: list) -> list:
            # One chain alone runs the same blocked program as a batch of one.
            batched = [False] * num_consts + [True] * (len(operands) - num_consts)
            stacked = [x[None] if b else x for x, b in zip(operands, batched)]
            out, _ = _by_blocks(one_chain, stacked, batched, 1, size, out_avals)
            return [o[0] for o in out]

        @call.def_vmap
        def call_batched(axis_size: int, in_batched: list, operands: list) -> tuple:
            (batched,) = in_batched
            out, varies = _by_blocks(one_chain, operands, list(batched), axis_size, size, out_avals)
            # An output that depends on no per-chain input stays unbatched, as under vmap
            # (a caller may declare it BROADCAST); every row holds the same value.
            return [o if v else o[0] for o, v in zip(out, varies)], varies

        try:
            out_leaves = call([*consts, *leaves])
        except ValueError as err:
            if "Linearization failed" not in str(err):
                raise
            raise EnsembleError(
                f"{getattr(fn, '__qualname__', fn)!r} is wrapped in enn.batch_invariant and "
                "is being differentiated in reverse mode, which the blocked loop does not "
                "support.\n  fix: take the gradient inside the wrapped function (as a "
                "kernel step does: enn.batch_invariant(step) where step calls jax.grad), or "
                "leave this function unwrapped."
            ) from None
        return eqx.combine(jax.tree.unflatten(out_tree, out_leaves), out_static)

    return wrapped
