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
    ("lp", "logdensity"),
)
"""The per-draw sample statistics a kept trace row carries after the position: ArviZ's
name and the field it is read from, the kernel's `Info`'s, or for `lp` the new state's
log density (the draw's, as the chain computed it: the run does not evaluate the log
density of every kept draw again at its end, which at 512 chains of a 100-d MALA run cost
as much as 25 µs per step, benchmarks §15). A field the kernel's info lacks is `ABSENT`
(`tree_depth` of a kernel other than NUTS), and the export leaves it out."""

ABSENT = -jnp.inf
"""The value of a statistic the kernel does not report: not NaN, which compares unequal
to itself (a multi-process restore checks that every process holds the same trace)."""


def trace_stats(state: Any, info: Any, dtype: Any) -> Float[Array, " stats"]:
    """One kept draw's `TRACE_STATS` in the position's dtype (every count and flag here is
    exact in it), one number each."""

    def scalar(field: str) -> Array:
        source = state if field == "logdensity" else info
        value = jnp.asarray(getattr(source, field, ABSENT), dtype)
        # A per-coordinate value (a RandomWalk's step size per dimension): its mean, as
        # ArviZ's statistics are one number per draw.
        return value if value.ndim == 0 else jnp.mean(value)

    return jnp.stack([scalar(field) for _, field in TRACE_STATS])


def _flat_width(dim: int) -> int:
    """A flat trace row's width: the position and `TRACE_STATS`, padded so that no row
    straddles a TPU's 128-lane tile and a wide one starts on a tile (at most twice the
    bytes: a power of two up to 128, whole tiles above). A MALA step at 16384 chains,
    gauss100, TPU v5e: 177 µs with rows of 107, 165 with rows of 128 (benchmarks §15)."""
    width = dim + len(TRACE_STATS)
    return 1 << (width - 1).bit_length() if width <= 128 else -(-width // 128) * 128


class Trace(eqx.Module):
    """One chain's kept draws of the whole run, written in place by every chunk (the
    buffers are donated to each chunk's call) and handed to the result without a copy
    where its layout is the result's (on a CPU, slicing, joining and splitting the chunks'
    rows cost as much as sampling did: a MALA run at 512 chains, benchmarks §15).

    On a CPU, `positions` is `(rows, dim)` and `stats` `(rows, len(TRACE_STATS))`: the
    result's trace is `positions` itself. On an accelerator one flat buffer holds rows of
    the position then the statistics (`stats` is None), each padded (`_flat_width`): a TPU
    tiles the last two axes of a batched `(chains, rows, dim)` buffer in (8, 128), so
    writing one row of every chain touched a sublane of each chain's tile (~260-370 µs of a
    16384-chain step); flat, a row of 8 chains lies in one or two tiles. A GPU, which
    writes every step's row (see `Config.skip_unkept`), has a scratch row after the kept
    ones for the steps after the last kept draw.
    """

    positions: Float[Array, "..."]
    stats: Float[Array, "..."] | None

    @staticmethod
    def empty(config: "Config", position: Array) -> "Trace":
        """One chain's buffers for the run's kept draws (`position` gives dim and dtype)."""
        dim, n, dtype = position.shape[-1], len(TRACE_STATS), position.dtype
        if config.flat_trace:
            return Trace(jnp.zeros((config.rows * _flat_width(dim),), dtype), None)
        return Trace(jnp.zeros((config.rows, dim), dtype), jnp.zeros((config.rows, n), dtype))

    def rows(self, dim: int) -> tuple[Array, Array]:
        """`(positions (rows, dim), stats (rows, len(TRACE_STATS)))`, scratch row included."""
        if self.stats is not None:
            return self.positions, self.stats
        rows = self.positions.reshape(-1, _flat_width(dim))
        return rows[:, :dim], rows[:, dim : dim + len(TRACE_STATS)]

    def starting_with(self, saved: Array, dim: int) -> "Trace":
        """These buffers with `saved` rows (a checkpoint's: position, then statistics)
        written first."""
        if self.stats is None:
            rows = self.positions.reshape(-1, _flat_width(dim))
            rows = rows.at[: saved.shape[0], : saved.shape[1]].set(saved)
            return Trace(rows.reshape(-1), None)
        k = saved.shape[0]
        return Trace(
            self.positions.at[:k].set(saved[:, :dim]), self.stats.at[:k].set(saved[:, dim:])
        )

    def draw(self, position: Array, stats: Array) -> Any:
        """One kept draw as `written` takes it: one row where the buffer is flat."""
        if self.stats is not None:
            return position, stats
        pad = _flat_width(position.shape[-1]) - position.shape[-1] - stats.shape[-1]
        return jnp.concatenate([position, stats, jnp.zeros(pad, position.dtype)])

    def written(self, draw: Any, slot: Array) -> "Trace":
        """These buffers with `draw` written at row `slot` (the same for every chain, so
        that the batched write is one dynamic-update-slice: see `update_slice`)."""
        if self.stats is None:
            return Trace(update_slice(self.positions, draw, (slot * draw.shape[0],)), None)
        position, stats = draw
        at = (slot, jnp.zeros_like(slot))
        return Trace(
            update_slice(self.positions, position[None], at),
            update_slice(self.stats, stats[None], at),
        )


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
    # The run's trace buffer: its rows (kept draws, plus a scratch row where every step
    # writes) and whether it is flat (see `Trace`).
    rows: int = eqx.field(static=True, default=1)
    flat_trace: bool = eqx.field(static=True, default=False)


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
    trace: Trace | None,
) -> tuple:
    """`length` (<= capacity) steps of one chain, from global step `start`, writing the
    kept draws into `trace` (the run's buffers, or None to keep none).

    Steps before `config.first_sample` are warmup: they move the chain but add nothing to
    the moments, the trace or the bias history.
    """
    observe = getattr(logdensity, "observable", None)
    separate = carry.moments.observed is not None

    bias = jnp.zeros((config.capacity, 2), jnp.float32)

    def body(i: Array, loop: tuple) -> tuple:
        c, trace, bias = loop
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
        if trace is not None:
            # Written at the next free slot, found from the step number: kept draws before
            # this step. Where every step writes (no `skip_unkept`), a step that is not kept
            # writes the slot its next kept step overwrites (or, after the last one, the
            # scratch row): no counter carried, no select, no read. The slot never passes
            # the last row, so the slice's clamping never acts and it needs no bounds
            # check, which a scatter (`.at[].set`, or what `jax.vmap` makes of a
            # dynamic-update-slice: hence `update_slice`) would add.
            slot = jnp.maximum(t - config.first_sample, 0) // config.thin
            draw = trace.draw(state.position, trace_stats(state, info, state.position.dtype))

            def write(tr: Trace) -> Trace:
                return tr.written(draw, slot)

            if config.skip_unkept:
                # The predicate comes from the step number, the same for every chain, so
                # under `jax.vmap` this stays a cond (not a select over the buffer). The
                # draw is built outside the cond: a row built inside its branch lost the
                # gain on a TPU v5e (MALA 167 -> 188 µs per step, benchmarks §15).
                kept = sampling & ((since + 1) % config.thin == 0)
                trace = jax.lax.cond(kept, write, lambda tr: tr, trace)
            else:
                trace = write(trace)
        if config.track_bias and reference is not None:
            estimate = enn.chain_mean(observed**2)
            b2 = jnp.stack(
                diag.bias_squared(estimate, reference.second_moment, reference.second_moment_var)
            )
            bias = bias.at[i].set(b2.astype(jnp.float32))
        return c, trace, bias

    acc_before = carry.acceptance
    steps = length if config.steps is None else config.steps
    carry, trace, bias = jax.lax.fori_loop(0, steps, body, (carry, trace, bias))
    chunk_acceptance = enn.chain_mean((carry.acceptance - acc_before) / length)
    return carry, trace, (chunk_acceptance, bias if config.track_bias else None)
