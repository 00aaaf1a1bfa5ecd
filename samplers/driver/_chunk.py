"""One compiled chunk of steps for ONE chain: the program every chunk and phase of a run
reuses, so a run compiles once."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

import ensemblenn as enn

from .. import diagnostics as diag
from .. import random
from ..kernels import Logdensity, Sampler, step_chain
from ._moments import StreamingSums
from ._slices import update_slice

TRACE_STATS = (
    ("diverging", "is_divergent"),
    ("acceptance_rate", "acceptance_rate"),
    ("n_steps", "num_grads"),
    ("step_size", "step_size"),
    ("energy_error", "energy_change"),
    ("tree_depth", "tree_depth"),
    ("energy", "energy"),
)
"""The per-draw sample statistics a kept trace row carries after the position: ArviZ's
name and the kernel's `Info` field it is read from. A field the kernel's info lacks is
`ABSENT` (`tree_depth` of a kernel other than NUTS), and the export leaves it out."""

ABSENT = -jnp.inf
"""The value of a statistic the kernel does not report: not NaN, which compares unequal
to itself (a multi-process restore checks that every process holds the same trace)."""


def trace_row(state: Any, info: Any) -> Float[Array, " width"]:
    """One chain's kept draw as one row: its position, then `TRACE_STATS` in the position's
    dtype (every count and flag here is exact in it), so the trace stays one array, laid
    out, saved and restored like the positions alone."""
    dtype = state.position.dtype

    def scalar(field: str) -> Array:
        value = jnp.asarray(getattr(info, field, ABSENT), dtype)
        # A per-coordinate value (a RandomWalk's step size per dimension): its mean, as
        # ArviZ's statistics are one number per draw.
        return value if value.ndim == 0 else jnp.mean(value)

    stats = [scalar(field) for _, field in TRACE_STATS]
    return jnp.concatenate([state.position, jnp.stack(stats)])


class Config(eqx.Module):
    """The static shape of a chunk of steps (part of the compilation key).

    Every chunk of a run shares it, whatever its phase, and on CPU whatever its length, so a
    run compiles once there (twice on an accelerator when the last chunk is shorter).
    """

    capacity: int = eqx.field(static=True)
    thin: int = eqx.field(static=True)
    half_point: int = eqx.field(static=True)
    first_sample: int = eqx.field(static=True)
    track_bias: bool = eqx.field(static=True)
    keep_trace: bool = eqx.field(static=True)
    num_chains: int = eqx.field(static=True, default=1)
    # The chunk's length when compiled into the program (accelerators), else None: the
    # length is then an operand, and one program serves every chunk (CPU). A loop whose
    # trip count XLA cannot see makes a GPU send its condition to the host every step.
    steps: int | None = eqx.field(static=True, default=None)
    # Write only the kept trace rows, each in a `lax.cond` on the step number, instead of
    # every step's row (to the scratch row when not kept). Where a cond runs on the device
    # (CPU, TPU: with automatic thinning 26 of 27 writes went to the scratch row, ~21 µs of
    # a 16384-chain step on a TPU v5e, benchmarks §15); not on a GPU, which sends a cond's
    # predicate to the host.
    skip_unkept: bool = eqx.field(static=True, default=False)


class Carry(eqx.Module):
    """What one chain carries from chunk to chunk: its state, moments and counters.

    `bias_grads` (with `track_bias`) is the ensemble's gradients per chain after each
    sampling step, spread over the chains (chain `c` holds steps `c, c + n, ...`), so that
    the history costs one number per step and is saved with the carry.
    """

    state: Any
    moments: StreamingSums  # turned into ChainMoments at the end of the run
    acceptance: Float[Array, ""]
    divergent: Any
    grads: Any
    bias_grads: Float[Array, " slots"] | None = None


def chunk(
    config: Config,
    sampler: Sampler,
    logdensity: Logdensity,
    carry: Carry,
    key: PRNGKeyArray,
    start: Array,
    length: Array,
    reference: Any,
) -> tuple:
    """`length` (<= capacity) steps of one chain, from global step `start`.

    Steps before `config.first_sample` are warmup: they move the chain but add nothing to
    the moments, the trace or the bias history.
    """
    observe = getattr(logdensity, "observable", None)
    separate = carry.moments.observed is not None
    width = carry.state.position.shape[-1] + len(TRACE_STATS)
    # One row per kept draw, and a scratch row: every step writes its row at the next free
    # slot, which only a kept draw claims (the next step overwrites any other), so the
    # write needs no read of the buffer and no select. The caller keeps the claimed rows.
    # Flat, reshaped once after the loop: a TPU tiles the last two axes of a batched
    # `(chains, rows, width)` buffer in (8, 128), so writing one row of every chain touched
    # a sublane of each chain's tile (~260-370 µs of a 16384-chain step, benchmarks §15);
    # in `(chains, rows * width)` a row of 8 chains lies in one or two tiles.
    draws = jnp.zeros(((config.capacity // config.thin + 1) * width,), carry.state.position.dtype)
    bias = jnp.zeros((config.capacity, 2), jnp.float32)

    def kept_before(t: Array) -> Array:
        # Kept draws among the sampling steps before global step `t`.
        return jnp.maximum(t - config.first_sample, 0) // config.thin

    def body(i: Array, loop: tuple) -> tuple:
        c, draws, bias = loop
        t = start + i
        state, info = step_chain(sampler, logdensity, c.state, random.fold_in(key, t))
        since = t - config.first_sample
        sampling = since >= 0
        observed = state.position if observe is None else observe(state.position)
        moments = c.moments.add(
            state.position,
            (since >= config.half_point).astype(jnp.int32),
            since == 0,
            sampling,
            observed if separate else None,
        )
        grads = c.grads + info.num_grads
        bias_grads = c.bias_grads
        if config.track_bias and bias_grads is not None:
            mine = sampling & (since % config.num_chains == enn.chain_index())
            slot = jnp.clip(since // config.num_chains, 0, bias_grads.shape[0] - 1)
            per_chain = enn.chain_mean(grads.astype(jnp.float32))
            bias_grads = jnp.where(mine, bias_grads.at[slot].set(per_chain), bias_grads)
        c = Carry(
            state,
            moments,
            c.acceptance + info.acceptance_rate.astype(c.acceptance.dtype),
            # Sampling transitions only, as NumPyro and Stan report them.
            c.divergent + (info.is_divergent & sampling).astype(jnp.int32),
            grads,
            bias_grads,
        )
        if config.keep_trace:
            # Written at the next free slot (see `draws`), found from the step number: no
            # counter carried, no select, no read, and no cond (on a GPU a cond sends its
            # predicate to the host every step). The slot never passes the scratch row
            # (capacity is a multiple of thin), so the slice's clamping never acts and it
            # needs no bounds check, which a scatter (`.at[].set`, or what `jax.vmap` makes
            # of a dynamic-update-slice: hence `update_slice`) would add.
            slot = kept_before(t) - kept_before(start)
            row = trace_row(state, info)
            if config.skip_unkept:
                # The predicate comes from the step number, the same for every chain, so
                # under `jax.vmap` this stays a cond (not a select over the buffer). The row
                # is built outside the cond: built inside its branch, the gain was gone on
                # a TPU v5e (MALA 167 -> 188 µs per step, benchmarks §15).
                kept = sampling & ((since + 1) % config.thin == 0)  # claims slot: see draws
                draws = jax.lax.cond(
                    kept, lambda d: update_slice(d, row, (slot * width,)), lambda d: d, draws
                )
            else:
                draws = update_slice(draws, row, (slot * width,))
        if config.track_bias and reference is not None:
            estimate = enn.chain_mean(observed**2)
            b2 = jnp.stack(
                diag.bias_squared(estimate, reference.second_moment, reference.second_moment_var)
            )
            bias = bias.at[i].set(b2.astype(jnp.float32))
        return c, draws, bias

    acc_before = carry.acceptance
    steps = length if config.steps is None else config.steps
    carry, draws, bias = jax.lax.fori_loop(0, steps, body, (carry, draws, bias))
    chunk_acceptance = enn.chain_mean((carry.acceptance - acc_before) / length)
    return (
        carry,
        draws.reshape(-1, width) if config.keep_trace else None,
        (chunk_acceptance, bias if config.track_bias else None),
    )
