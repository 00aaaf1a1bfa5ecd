"""The end of a run: ensemble diagnostics on device, and the `Result`."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

import ensemblenn as enn
from ensemblenn import BROADCAST, PER_CHAIN

from .. import diagnostics as diag
from ..adaptation import BiasMonitor
from ..kernels import Logdensity
from ._chunk import TRACE_STATS, Trace
from ._flat import Structure
from ._moments import ChainMoments, StreamingSums
from ._result import Diagnostics, Result, Unconstrained
from ._setup import Setup


def _diagnose_both(
    sums: StreamingSums,
    count: tuple[int, int],
    reference: Any,
    superchain_size: int | None,
    position: Structure,
    observed: Structure | None,
) -> tuple[ChainMoments, Diagnostics, Diagnostics]:
    """`(moments, diagnostics of the observable, of the position)`: the chain's moments
    of `count` steps per half, and the diagnostics each unravelled into its own structure
    (the same when the target has no observable), in one program."""
    # A barrier: the moments are values, as if read from memory, so that XLA cannot fuse
    # their arithmetic into the diagnostics' products (an FMA there or not, depending on
    # the number of chains per device, would change the last bit between device counts).
    moments = jax.lax.optimization_barrier(sums.moments(jnp.asarray(count, jnp.int32)))
    if observed is None:
        diagnostics = _diagnose(moments, reference, superchain_size).unravel(position)
        return moments, diagnostics, diagnostics
    unconstrained = _diagnose(moments, None, superchain_size).unravel(position)
    constrained = _diagnose(moments.observed, reference, superchain_size).unravel(observed)
    return moments, constrained, unconstrained


def _diagnose(moments: ChainMoments, reference: Any, superchain_size: int | None) -> Diagnostics:
    """Flat ensemble diagnostics from every chain's moments (identical on every device)."""

    half_mean, half_var = moments.half_mean_var()
    mean, var = moments.chain_mean_var()
    every = enn.chain_all_gather((half_mean, half_var, mean, var, moments.count))
    half_mean, half_var, mean, var, count = every
    dim = mean.shape[-1]
    n_half = count.min()
    rhat = diag.split_rhat_from_moments(
        half_mean.reshape(-1, dim), half_var.reshape(-1, dim), n_half
    )
    n = count.sum(-1).min()
    ess = diag.ess_from_moments(mean, var, n)
    nested = None
    if superchain_size is not None:
        nested = diag.nested_rhat_from_moments(mean, var, n, superchain_size)
    ens_mean = enn.chain_mean(moments.chain_mean_var()[0])
    ens_second = enn.chain_mean(moments.second_moment)
    b2_max = b2_mean = None
    if reference is not None:
        observed_second = enn.chain_mean(moments.second_moment)
        b2_max, b2_mean = diag.bias_squared(
            observed_second, reference.second_moment, reference.second_moment_var
        )
    return Diagnostics(
        mean=ens_mean,
        sd=jnp.sqrt(jnp.maximum(ens_second - ens_mean**2, 0.0)),
        second_moment=ens_second,
        rhat=rhat,
        nested_rhat=nested,
        ess=ess,
        bias_squared_max=b2_max,
        bias_squared_mean=b2_mean,
    )


def on_mesh_of(x: Any, fn: Any) -> Any:
    """`fn(x)` with `x`'s mesh as the context mesh: eager operations on arrays sharded over
    an Explicit mesh need it."""
    sharding = getattr(x, "sharding", None)
    if isinstance(x, jax.core.Tracer) or not isinstance(sharding, jax.sharding.NamedSharding):
        return fn(x)
    with jax.set_mesh(sharding.mesh):
        return fn(x)


class _Unravel(eqx.Module):
    """One chain's outputs in the user's structures (a Module, not a `functools.partial`,
    so that equal calls are equal and every run reuses one program)."""

    kept: int = eqx.field(static=True)  # draws kept by the run
    direct: bool = eqx.field(static=True)  # the positions buffer is the result's trace

    def __call__(
        self,
        logdensity: Logdensity,
        position: Structure,
        observed: Structure | None,
        final: Any,
        trace: Trace | None,
        lp: bool,
    ) -> tuple[Any, Any, Any, Any, Any]:
        """Its final position, its kept draws (from the run's trace buffers) as positions
        (None when `direct`) and as observables, their log densities (the trace's, None
        unless `lp`) and their other sample statistics (one program, not an eager slice
        each)."""
        final = position.unravel(final)
        if trace is None:
            return final, None, None, None, None
        draws, rows = (x[: self.kept] for x in trace.rows(position.dim))
        stats = {name: rows[:, i] for i, (name, _) in enumerate(TRACE_STATS)}
        lps = stats.pop("lp")
        observe = observed is not None
        trace = observed.unravel(jax.vmap(logdensity.observable)(draws)) if observe else None
        return (
            final,
            None if self.direct else position.unravel(draws),
            trace,
            lps if lp else None,
            stats,
        )


class _GradsHistory(eqx.Module):
    """The ensemble's gradients per chain after each sampling step, `(num_steps,)`, from the
    slots spread over the chains (chain `c` holds steps `c, c + n, ...`). A Module, so that
    equal calls are equal and reuse one program."""

    num_steps: int = eqx.field(static=True)

    def __call__(self, bias_grads: Any) -> Any:
        return enn.chain_all_gather(bias_grads).T.reshape(-1)[: self.num_steps]


def finalise(
    setup: Setup, at: Any, logdensity: Logdensity, *, adapted: bool, one_position: bool = True
) -> Result:
    """The `Result` of a run whose loop has ended at `at` (a `Sampled`); `logdensity` is
    the (flat) log density the chains used, for the observable of the kept draws;
    `adapted` whether an adaptation ran; `one_position` whether the log density takes one
    position (not a minibatch's estimate: then the kept draws have their log density)."""
    diagnose = enn.ensemble_map(
        _diagnose_both,
        in_roles=(PER_CHAIN, None, BROADCAST, None, None, None),
        out_roles=(PER_CHAIN, BROADCAST, BROADCAST),
        **setup.mapping,
    )
    carry = at.carry
    half = setup.config.half_point
    moments, diagnostics, unconstrained = diagnose(
        carry.moments, (half, setup.num_steps - half), setup.reference, setup.superchain_size,
        setup.position, setup.observed,
    )  # fmt: skip

    def joined(parts: list, axis: int) -> Any:
        if len(parts) < 2:  # none, or one chunk's: nothing to copy
            return parts[0] if parts else None
        return on_mesh_of(parts[0], lambda _: jnp.concatenate(parts, axis=axis))

    buffers, config = at.trace, setup.config
    kept = setup.num_kept
    # A plain position's kept draws are the buffer itself when it is laid out as the
    # result is and holds no scratch row: no copy of the run's largest array.
    direct = (
        buffers is not None
        and setup.position.plain
        and not config.flat_trace
        and config.rows == kept
    )
    outputs = enn.ensemble_map(
        _Unravel(kept, direct),
        in_roles=(None, None, None, PER_CHAIN, PER_CHAIN, None),
        out_roles=PER_CHAIN, **setup.mapping,
    )  # fmt: skip
    state, position_trace, trace, draw_logdensity, sample_stats = carry.state, *[None] * 4
    if buffers is not None or not setup.position.plain:  # else nothing to unravel
        final, position_trace, trace, draw_logdensity, sample_stats = outputs(
            logdensity, setup.position, setup.observed, carry.state.position, buffers,
            # The trace's `lp` is the state's log density: the draw's, unless the state has
            # none (a sampler of the user's own) or it is a minibatch's estimate.
            buffers is not None and one_position and hasattr(carry.state, "logdensity"),
        )  # fmt: skip
        state = eqx.tree_at(lambda s: s.position, carry.state, final)
    if direct:
        position_trace = buffers.positions
    trace = position_trace if trace is None else trace
    grads_history = None
    if carry.bias_grads is not None:
        history = enn.ensemble_map(
            _GradsHistory(setup.num_steps),
            in_roles=PER_CHAIN, out_roles=BROADCAST, **setup.mapping,
        )  # fmt: skip
        grads_history = history(carry.bias_grads)
    return Result(
        state=state,
        sampler=at.sampler,
        moments=moments,
        diagnostics=diagnostics,
        acceptance_rate=carry.acceptance / setup.total,
        num_divergent=carry.divergent,
        num_grads=carry.grads,
        trace=trace,
        sample_stats=sample_stats,
        bias_history=joined(at.bias_history, axis=0),
        adaptation_info=at.adaptation_info,
        num_steps=setup.num_steps,
        num_warmup=setup.num_warmup,
        superchain_size=setup.superchain_size,
        superchain_auto=setup.superchain_auto,
        unconstrained=Unconstrained(diagnostics=unconstrained, trace=position_trace),
        draw_logdensity=draw_logdensity,
        grads_history=grads_history,
        # The adaptation's own b² rows (see Adaptation.with_bias_monitor), NaN rows dropped.
        adaptation_bias=BiasMonitor.used_rows(getattr(at.adaptation_info, "bias_history", None)),
        reference=setup.reference,
        structure=setup.observed if setup.observed is not None else setup.position,
        adapted=adapted,
        thin=setup.thin,
        thin_auto=setup.thin_auto,
        target=_numpyro_target(logdensity),
    )


def _numpyro_target(logdensity: Logdensity) -> Any:
    """The run's `samplers.targets.from_numpyro` target, if it sampled one (the export to
    ArviZ reads its plates, data and likelihood), else None."""
    from ..targets import NumPyroTarget

    user = getattr(logdensity, "logdensity", logdensity)  # a FlatTarget wraps the user's
    return user if isinstance(user, NumPyroTarget) else None
