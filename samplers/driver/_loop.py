"""The host loop over chunks: one compiled program, progress, trace and checkpoints."""

import dataclasses
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

import ensemblenn as enn
from ensemblenn import BROADCAST, PER_CHAIN

from .. import checkpoint
from ..kernels import Logdensity, Sampler
from ._chunk import Carry, chunk
from ._finalise import on_mesh_of
from ._progress import Progress
from ._setup import Setup


class Sampled(NamedTuple):
    """Where the loop stands: the carry, and the host-side pieces of trace and b² history."""

    sampler: Sampler
    carry: Carry
    adaptation_info: Any
    trace: list
    bias_history: list


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
) -> Sampled:
    """Run the chunks from `first_step` to the end, saving when the store says so and
    calling `on_chunk(steps done, total)` after each chunk (and its save)."""
    run_chunk = enn.ensemble_map(
        chunk,
        in_roles=(None, None, None, PER_CHAIN, PER_CHAIN, BROADCAST, BROADCAST, None),
        out_roles=(PER_CHAIN, PER_CHAIN, BROADCAST),
        **setup.mapping,
    )
    carry, capacity = at.carry, setup.config.capacity

    def call(start: int, length: int) -> tuple:
        config = setup.config
        if setup.static_chunks:
            config = dataclasses.replace(config, steps=length)
        return run_chunk(
            config, at.sampler, logdensity, carry, setup.run_keys,
            jnp.int32(start), jnp.int32(length), setup.reference,
        )  # fmt: skip

    if bar.enabled and first_step < setup.total and not setup.static_chunks:
        # A chunk of no steps: compiles the program (once per run) without moving the
        # chains, so the bar can show the compilation as a phase of its own.
        with bar.phase("compiling") as produced:
            produced.append(call(first_step, 0)[0])
    done, in_flight = first_step, None
    try:
        if on_chunk is not None and not setup.traced:
            on_chunk(first_step, setup.total)  # initialised and adapted (or restored)
        for start in range(first_step, setup.total, capacity):
            length = min(capacity, setup.total - start)
            tick = time.perf_counter()
            carry, draws, (acceptance, bias) = call(start, length)
            _keep(setup, at, start, length, draws, bias)
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
        jax.block_until_ready(carry)
    except KeyboardInterrupt as err:
        # Say how far the run got (the CLI prints it); the checkpoint, if any, holds the
        # last save.
        err.step = done
        err.add_note(f"samplers.run: interrupted at step {done} of {setup.total}")
        raise
    return at


def _keep(setup: Setup, at: Sampled, start: int, length: int, draws: Any, bias: Any) -> None:
    """Append a chunk's kept draws and b² history to the host-side lists of `at`."""
    # lax slices: one program each, where basic indexing (`d[:, :k]`) is a gather and its
    # index arrays, four programs to compile or load in a fresh process.
    kept = _kept_draws(setup, start, length) if setup.thin else 0
    if kept:
        at.trace.append(on_mesh_of(draws, lambda d, k=kept: lax.slice_in_dim(d, 0, k, axis=1)))
    first_sampled = max(start, setup.num_warmup)
    if bias is not None and first_sampled < start + length:
        lo = first_sampled - start
        at.bias_history.append(on_mesh_of(bias, lambda b: lax.slice_in_dim(b, lo, length)))


def save(store: "checkpoint.Store", setup: Setup, at: Sampled, step: int) -> None:
    """Save the run as it stands after `step` steps."""
    snapshot = checkpoint.Snapshot.of_run(
        step, at.sampler, at.carry, at.adaptation_info, setup.run_keys,
        at.trace if setup.thin else None,
        at.bias_history if setup.config.track_bias else None,
    )  # fmt: skip
    store.save(snapshot, setup.total)
