"""The host loop over chunks: one compiled program, progress, trace and checkpoints."""

import time
from typing import Any, NamedTuple

import jax.numpy as jnp

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
    sampled = range(max(start, setup.num_warmup), start + length)
    return sum(1 for t in sampled if (t - setup.num_warmup + 1) % setup.config.thin == 0)


def chunk_loop(
    setup: Setup,
    logdensity: Logdensity,
    at: Sampled,
    first_step: int,
    store: "checkpoint.Store | None",
    bar: Progress,
) -> Sampled:
    """Run the chunks from `first_step` to the end, saving when the store says so."""
    run_chunk = enn.ensemble_map(
        chunk,
        in_roles=(None, None, None, PER_CHAIN, PER_CHAIN, BROADCAST, BROADCAST, None),
        out_roles=(PER_CHAIN, PER_CHAIN, BROADCAST),
        **setup.mapping,
    )
    carry, capacity = at.carry, setup.config.capacity
    for start in range(first_step, setup.total, capacity):
        length = min(capacity, setup.total - start)
        tick = time.perf_counter()
        carry, draws, (acceptance, bias) = run_chunk(
            setup.config, at.sampler, logdensity, carry, setup.run_keys,
            jnp.int32(start), jnp.int32(length), setup.reference,
        )  # fmt: skip
        kept = _kept_draws(setup, start, length) if setup.thin else 0
        if kept:
            at.trace.append(on_mesh_of(draws, lambda d, k=kept: d[:, :k]))
        first_sampled = max(start, setup.num_warmup)
        if bias is not None and first_sampled < start + length:
            at.bias_history.append(on_mesh_of(bias, lambda b: b[first_sampled - start : length]))
        phase = "warmup" if start + length <= setup.num_warmup else "sampling"
        bar.update(length, acceptance, time.perf_counter() - tick, phase)
        at = at._replace(carry=carry)
        if store is not None and store.due(start + length, setup.total):
            save(store, setup, at, start + length)
    return at


def save(store: "checkpoint.Store", setup: Setup, at: Sampled, step: int) -> None:
    """Save the run as it stands after `step` steps."""
    snapshot = checkpoint.Snapshot.of_run(
        step, at.sampler, at.carry, at.adaptation_info, setup.run_keys,
        at.trace if setup.thin else None,
        at.bias_history if setup.config.track_bias else None,
    )  # fmt: skip
    store.save(snapshot, setup.total)
