"""The host loop over chunks: one compiled program, progress, trace and checkpoints."""

import dataclasses
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

import ensemblenn as enn
from ensemblenn import BROADCAST, PER_CHAIN

from .. import checkpoint
from ..kernels import Logdensity, Sampler
from ._chunk import TRACE_STATS, Carry, Config, Trace, chunk
from ._finalise import on_mesh_of
from ._progress import Progress
from ._setup import Setup


class Sampled(NamedTuple):
    """Where the loop stands: the carry, the run's trace buffers (None: none kept) and the
    host-side pieces of the b² history."""

    sampler: Sampler
    carry: Carry
    adaptation_info: Any
    trace: Trace | None
    bias_history: list


def _fill(config: Config, position: Any, saved: Any) -> Trace:
    # One chain's run-wide buffers, holding the rows of a checkpoint (if any) first.
    trace = Trace.empty(config, position)
    return trace if saved is None else trace.starting_with(saved, position.shape[-1])


def new_trace(setup: Setup, carry: Carry, saved: Any = None) -> Trace | None:
    """The run's trace buffers (None when it keeps no draw), with a checkpoint's kept rows
    `(chains, draws, dim + len(TRACE_STATS))` written first."""
    if setup.num_kept == 0:
        return None
    width = setup.position.dim + len(TRACE_STATS)
    if saved is not None and saved.shape[-1] != width:
        raise checkpoint.CheckpointError(
            f"The checkpoint's kept draws are rows of {saved.shape[-1]} numbers where this "
            f"run writes {width} (the position's {setup.position.dim} and "
            f"{len(TRACE_STATS)} statistics): it was written by another version of "
            "samplers.\n  fix: start afresh in a new checkpoint_dir (or resume with the "
            "version that wrote it)."
        )
    fill = enn.ensemble_map(
        _fill, in_roles=(None, PER_CHAIN, PER_CHAIN), out_roles=PER_CHAIN, **setup.mapping
    )
    return fill(setup.config, carry.state.position, saved)


class _KeptRows(eqx.Module):
    # One chain's first `kept` draws as checkpoint rows (a Module: equal saves are equal).
    dim: int = eqx.field(static=True)
    kept: int = eqx.field(static=True)

    def __call__(self, trace: Trace) -> Any:
        positions, stats = trace.rows(self.dim)
        return jnp.concatenate([positions[: self.kept], stats[: self.kept]], axis=1)


def kept_rows(setup: Setup, trace: Trace, dim: int, kept: int) -> Any:
    """The first `kept` draws of the run's buffers as checkpoint rows (a copy)."""
    rows = enn.ensemble_map(
        _KeptRows(dim, kept), in_roles=PER_CHAIN, out_roles=PER_CHAIN, **setup.mapping
    )
    return rows(trace)


def _kept_draws(setup: Setup, start: int, length: int) -> int:
    # Sampling step s (from 0) is kept when thin divides s + 1: count those in [first, end).
    thin, warmup = setup.config.thin, setup.num_warmup
    first, end = max(start, warmup) - warmup, start + length - warmup
    return max(end // thin - first // thin, 0)


def chunk_loop(
    setup: Setup,
    logdensity: Logdensity,
    at: Sampled,
    first_step: int,
    store: "checkpoint.Store | None",
    bar: Progress,
    on_chunk: Callable[[int, int], None] | None = None,
) -> tuple[Sampled, int]:
    """Run the chunks from `first_step` to the end, saving when the store says so and
    calling `on_chunk(steps done, total)` after each chunk (and its save). Returns the run
    as dispatched and the steps known to have run; `wait` blocks until all have."""
    run_chunk = enn.ensemble_map(
        chunk,
        in_roles=(None, None, None, PER_CHAIN, PER_CHAIN, BROADCAST, BROADCAST, None, PER_CHAIN),
        out_roles=(PER_CHAIN, PER_CHAIN, BROADCAST),
        # The trace buffers are written in place, chunk after chunk.
        donate_argnums=8,
        **setup.mapping,
    )
    carry, capacity = at.carry, setup.config.capacity

    def call(start: int, length: int, trace: Trace | None) -> tuple:
        config = setup.config
        if setup.static_chunks:
            config = dataclasses.replace(config, steps=length)
        return run_chunk(
            config, at.sampler, logdensity, carry, setup.run_keys,
            jnp.int32(start), jnp.int32(length), setup.reference, trace,
        )  # fmt: skip

    if bar.enabled and first_step < setup.total and not setup.static_chunks:
        # A chunk of no steps: compiles the program (once per run) without moving the
        # chains, so the bar can show the compilation as a phase of its own.
        with bar.phase("compiling") as produced:
            compiled, trace, _ = call(first_step, 0, at.trace)
            at = at._replace(trace=trace)  # the buffers given were donated to the call
            produced.append(compiled)
    done, in_flight = first_step, None
    try:
        if on_chunk is not None and not setup.traced:
            on_chunk(first_step, setup.total)  # initialised and adapted (or restored)
        for start in range(first_step, setup.total, capacity):
            length = min(capacity, setup.total - start)
            tick = time.perf_counter()
            carry, trace, (acceptance, bias) = call(start, length, at.trace)
            at = at._replace(trace=trace)
            _keep(setup, at, start, length, bias)
            if bar.enabled:
                jax.block_until_ready(carry)  # time the steps, not their dispatch
                phase = "warmup" if start + length <= setup.num_warmup else "sampling"
                bar.advance(length, acceptance, time.perf_counter() - tick, phase)
            elif in_flight is not None:
                # Keep one chunk in flight: the host stays ahead, and on Ctrl-C the step
                # reached is known (the chunk before the one still running).
                jax.block_until_ready(in_flight[0])
                done = in_flight[1]
            in_flight = (carry, start + length)
            at = at._replace(carry=carry)
            if store is not None and store.due(start + length, setup.total):
                save(store, setup, at, start + length)  # blocks: this chunk is done
                done = start + length
            elif bar.enabled:
                done = start + length
            if on_chunk is not None and not setup.traced:
                jax.block_until_ready(carry)  # the steps it is told of have run
                done = start + length
                on_chunk(done, setup.total)
    except KeyboardInterrupt as err:
        _note(err, done, setup.total)
        raise
    # Not waited for here: what the caller dispatches next (the run's finalise) overlaps
    # the last chunk's steps; `wait` then blocks with the same word on Ctrl-C.
    return at, done


def wait(at: Sampled, done: int, total: int) -> None:
    """Block until the last chunk has run (`done`: the steps known to have run)."""
    try:
        jax.block_until_ready(at.carry)
    except KeyboardInterrupt as err:
        _note(err, done, total)
        raise


def _note(err: KeyboardInterrupt, done: int, total: int) -> None:
    """Say how far the run got (the CLI prints it); the checkpoint, if any, holds the
    last save."""
    err.step = done
    err.add_note(f"samplers.run: interrupted at step {done} of {total}")


def _keep(setup: Setup, at: Sampled, start: int, length: int, bias: Any) -> None:
    """Append a chunk's b² history to the host-side list of `at`."""
    # A lax slice: one program, where basic indexing (`b[lo:]`) is a gather and its index
    # arrays, more programs to compile or load in a fresh process.
    first_sampled = max(start, setup.num_warmup)
    if bias is not None and first_sampled < start + length:
        lo = first_sampled - start
        at.bias_history.append(on_mesh_of(bias, lambda b: lax.slice_in_dim(b, lo, length)))


def save(store: "checkpoint.Store", setup: Setup, at: Sampled, step: int) -> None:
    """Save the run as it stands after `step` steps."""
    trace = None
    if setup.thin:
        kept = _kept_draws(setup, 0, step)
        dim = at.carry.state.position.shape[-1]
        trace = [kept_rows(setup, at.trace, dim, kept)] if kept else []
    snapshot = checkpoint.Snapshot.of_run(
        step, at.sampler, at.carry, at.adaptation_info, setup.run_keys, trace,
        at.bias_history if setup.config.track_bias else None,
    )  # fmt: skip
    store.save(snapshot, setup.total)
