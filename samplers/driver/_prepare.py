"""Initialisation and adaptation: every chain's starting state and the tuned sampler."""

from typing import Any

import jax
import numpy as np
from jaxtyping import Array, PRNGKeyArray

import ensemblenn as enn
from ensemblenn import BROADCAST, PER_CHAIN

from ..adaptation import Adaptation, BiasMonitor, ticking
from ..kernels import Logdensity, Sampler, init_chain
from ._chunk import Carry
from ._progress import Progress
from ._setup import CarryPlan, Setup


def _init_chain(
    sampler: Sampler | None,
    adaptation: Adaptation | None,
    logdensity: Logdensity,
    position: Array,
    key: PRNGKeyArray,
    plan: CarryPlan,
) -> Any:
    """One chain's initial state, or, without an adaptation, its carry at step 0."""
    if adaptation is not None:
        return adaptation.initial_state(sampler, logdensity, position, key)
    return plan.initial_carry(init_chain(sampler, logdensity, position, key))


def _adapt_chain(
    adaptation: Adaptation,
    sampler: Sampler | None,
    logdensity: Logdensity,
    state: Any,
    key: PRNGKeyArray,
    monitor: BiasMonitor | None,
    plan: CarryPlan,
    every: int | None,
) -> tuple[Sampler, Carry, Any]:
    """The tuned sampler, one chain's carry at step 0, and the adaptation's info; with
    `every`, the adaptation's `tick`s reach the progress bar (see `adaptation.tick`)."""
    if monitor is not None:  # b² after every adaptation step, where supported
        adaptation = adaptation.with_bias_monitor(monitor)
    with ticking(every):
        sampler, state, info = adaptation.run(sampler, logdensity, state, key)
    return sampler, plan.initial_carry(state), info


def _check_some_finite(setup: Setup, state: Any) -> None:
    if (
        setup.traced
        or jax.process_count() > 1
        or isinstance(state.logdensity, jax.core.Tracer)  # resume: shapes only
        or bool(np.isfinite(np.asarray(state.logdensity)).any())  # on the host: no program
    ):
        return
    raise enn.EnsembleError(
        "logdensity is not finite (NaN or -inf) at any initial position, so no chain "
        "can move.\n  fix: check the log-density and start the chains inside its support."
    )


def prepare(
    setup: Setup,
    sampler: Sampler | None,
    adaptation: Adaptation | None,
    logdensity: Logdensity,
    positions: Any,
    bar: Progress | None = None,
) -> tuple[Sampler, Carry, Any]:
    """`(tuned sampler, carry at step 0, adaptation info)`: the chains initialised, then
    adapted when an adaptation is given. `bar` shows both as phases (None when traced,
    as for the shapes of a resumed run)."""
    bar = bar or Progress(0, enabled=False)
    per_chain_args = (None, None, None, PER_CHAIN, PER_CHAIN)
    init = enn.ensemble_map(_init_chain, in_roles=(*per_chain_args, None),
                            out_roles=PER_CHAIN, **setup.mapping)  # fmt: skip
    plan = setup.carry_plan
    with bar.phase("initialising") as produced:
        # Without an adaptation, already the carry at step 0 (see `_init_chain`).
        initial = init(sampler, adaptation, logdensity, positions, setup.init_keys, plan)
        produced.append(initial)
    if adaptation is None:
        _check_some_finite(setup, initial.state)
        return sampler, initial, None
    _check_some_finite(setup, initial)
    adapt = enn.ensemble_map(
        _adapt_chain, in_roles=(*per_chain_args, BROADCAST, None, None),
        out_roles=(None, PER_CHAIN, None), **setup.mapping,
    )  # fmt: skip
    # Only with track_bias (and a reference): a run without it compiles as before.
    track = setup.config.track_bias
    monitor = BiasMonitor.of(setup.reference) if track else None
    # One program, compiling included; it moves the bar when the adaptation ticks.
    with bar.adapting(adaptation.total_steps) as (every, produced):
        sampler, carry, adaptation_info = adapt(
            adaptation, sampler, logdensity, initial, setup.adapt_keys, monitor, plan, every
        )
        produced.append(carry)
    return sampler, carry, adaptation_info
