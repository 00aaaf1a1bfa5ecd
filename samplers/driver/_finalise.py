"""The end of a run: ensemble diagnostics on device, and the `Result`."""

from typing import Any

import jax
import jax.numpy as jnp

import ensemblenn as enn
from ensemblenn import BROADCAST, PER_CHAIN

from .. import diagnostics as diag
from ._moments import ChainMoments
from ._result import Diagnostics, Result
from ._setup import Setup


def _diagnose(moments: ChainMoments, reference: Any, superchain_size: int | None) -> Diagnostics:
    """Ensemble diagnostics from every chain's moments (identical on every device)."""

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
        observed_second = enn.chain_mean(moments.observable_second_moment)
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


def finalise(setup: Setup, at: Any) -> Result:
    """The `Result` of a run whose loop has ended at `at` (a `Sampled`)."""
    diagnose = enn.ensemble_map(
        _diagnose, in_roles=(PER_CHAIN, BROADCAST, None), out_roles=BROADCAST, **setup.mapping
    )
    carry = at.carry
    diagnostics = diagnose(carry.moments, setup.reference, setup.superchain_size)

    def joined(parts: list, axis: int) -> Any:
        if not parts:
            return None
        return on_mesh_of(parts[0], lambda _: jnp.concatenate(parts, axis=axis))

    return Result(
        state=carry.state,
        sampler=at.sampler,
        moments=carry.moments,
        diagnostics=diagnostics,
        acceptance_rate=carry.acceptance / setup.total,
        num_divergent=carry.divergent,
        num_grads=carry.grads,
        trace=joined(at.trace, axis=1),
        bias_history=joined(at.bias_history, axis=0),
        adaptation_info=at.adaptation_info,
        num_steps=setup.num_steps,
        num_warmup=setup.num_warmup,
        superchain_size=setup.superchain_size,
    )
