"""One compiled chunk of steps for ONE chain: the program every chunk and phase of a run
reuses, so a run compiles once."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

import ensemblenn as enn

from .. import diagnostics as diag
from ..kernels import Logdensity, Sampler, step_chain
from ._moments import ChainMoments


class Config(eqx.Module):
    """The static shape of a chunk of steps (part of the compilation key).

    Every chunk of a run shares it, whatever its length or phase, so a run compiles once.
    """

    capacity: int = eqx.field(static=True)
    thin: int = eqx.field(static=True)
    half_point: int = eqx.field(static=True)
    first_sample: int = eqx.field(static=True)
    track_bias: bool = eqx.field(static=True)
    keep_trace: bool = eqx.field(static=True)


class Carry(eqx.Module):
    """What one chain carries from chunk to chunk: its state, moments and counters."""

    state: Any
    moments: ChainMoments
    acceptance: Float[Array, ""]
    divergent: Any
    grads: Any


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
    observe = getattr(logdensity, "observable", lambda x: x)
    dim = carry.state.position.shape[-1]
    draws = jnp.zeros((config.capacity // config.thin, dim), carry.state.position.dtype)
    bias = jnp.zeros((config.capacity, 2), jnp.float32)

    def body(loop: tuple) -> tuple:
        i, kept, c, draws, bias = loop
        t = start + i
        state, info = step_chain(sampler, logdensity, c.state, jax.random.fold_in(key, t))
        since = t - config.first_sample
        sampling = since >= 0
        observed = observe(state.position)
        updated = c.moments.update(
            state.position, (since >= config.half_point).astype(jnp.int32), observed
        )
        moments = jax.tree.map(lambda new, old: jnp.where(sampling, new, old), updated, c.moments)
        c = Carry(
            state,
            moments,
            c.acceptance + info.acceptance_rate.astype(c.acceptance.dtype),
            c.divergent + info.is_divergent.astype(jnp.int32),
            c.grads + info.num_grads,
        )
        if config.keep_trace:
            keep = sampling & ((since + 1) % config.thin == 0)
            draws = jnp.where(keep, draws.at[kept].set(state.position), draws)
            kept = kept + keep.astype(jnp.int32)
        if config.track_bias and reference is not None:
            estimate = enn.chain_mean(observed**2)
            b2 = jnp.stack(
                diag.bias_squared(estimate, reference.second_moment, reference.second_moment_var)
            )
            bias = bias.at[i].set(b2.astype(jnp.float32))
        return i + 1, kept, c, draws, bias

    acc_before = carry.acceptance
    loop = (jnp.int32(0), jnp.int32(0), carry, draws, bias)
    _, _, carry, draws, bias = jax.lax.while_loop(lambda lp: lp[0] < length, body, loop)
    chunk_acceptance = enn.chain_mean((carry.acceptance - acc_before) / length)
    return (
        carry,
        draws if config.keep_trace else None,
        (chunk_acceptance, bias if config.track_bias else None),
    )
