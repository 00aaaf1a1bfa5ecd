"""Non-finite chains during adaptation: detect them, restart them at healthy chains.

A chain whose log density, gradient or squared position is not finite (it started outside
the support, or at a NaN) would poison every cross-chain mean it entered and, for most
kernels, never move again. The ensemble adaptations leave such chains out of their
statistics and move them onto the position of a healthy chain (round robin), where a
fresh `init` gives them a finite state.
"""

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

import ensemblenn as enn

from .. import random
from ..kernels import Logdensity, Sampler, State, init_chain, select
from ._base import AdaptationInfo


def is_healthy(state: State | Any) -> Bool[Array, ""]:
    """True where a chain's state can enter an ensemble statistic.

    Its log density, its gradient (if the state stores one) and the square of its
    position (which the second moments use) must all be finite.

    Example:
        >>> import jax.numpy as jnp, samplers
        >>> from samplers.adaptation._restart import is_healthy
        >>> ok = samplers.State(jnp.ones(2), jnp.float32(-1.0), jnp.int32(0))
        >>> bad = samplers.State(jnp.ones(2), jnp.float32(-jnp.inf), jnp.int32(0))
        >>> bool(is_healthy(ok)), bool(is_healthy(bad))
        (True, False)
    """
    position = jnp.asarray(state.position)
    checks = [
        jnp.all(jnp.isfinite(jnp.asarray(state.logdensity))),
        jnp.all(jnp.isfinite(position * position)),
    ]
    grad = getattr(state, "grad", None)
    if grad is not None:
        checks.append(jnp.all(jnp.isfinite(grad)))
    return jnp.all(jnp.stack(checks))


def _donor_position(position: Float[Array, " dim"], healthy: Bool[Array, ""]) -> Array:
    """This chain's position if healthy, else the position of a healthy chain: the k-th
    unhealthy chain (by global index) takes the (k mod number healthy)-th healthy one."""
    every_ok = enn.chain_all_gather(healthy)
    every_x = enn.chain_all_gather(position)
    num_ok = every_ok.sum()
    rank = (jnp.cumsum(~every_ok)[enn.chain_index()] - 1) % jnp.maximum(num_ok, 1)
    donor = jnp.argmax(every_ok & (jnp.cumsum(every_ok) - 1 == rank))
    return jnp.where(healthy, position, every_x[donor])


def restart_unhealthy(
    sampler: Sampler, logdensity: Logdensity, state: State | Any, key: PRNGKeyArray
) -> tuple[State | Any, Int[Array, ""]]:
    """Restart every unhealthy chain at a healthy chain's position (one chain's view).

    The restarted chain gets `sampler.init` at its donor's position (with its own `key`);
    healthy chains are untouched. Nothing happens (and no position is gathered) when
    every chain is healthy, or when none is. Returns the state and the number of chains
    restarted (the same in every chain).

    Example:
        >>> import jax, jax.numpy as jnp, ensemblenn as enn, samplers
        >>> from samplers.adaptation._restart import restart_unhealthy
        >>> logdensity = lambda x: jnp.where(x[0] > 3, -jnp.inf, -0.5 * jnp.sum(x**2))
        >>> kernel = samplers.MALA(step_size=0.5)
        >>> def restart(x, key):
        ...     return restart_unhealthy(kernel, logdensity, kernel.init(logdensity, x, key), key)
        >>> fn = enn.ensemble_map(restart, in_roles=enn.PER_CHAIN, out_roles=(enn.PER_CHAIN, None))
        >>> x = jnp.array([[0.0, 1.0], [5.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
        >>> state, num = fn(x, enn.chain_keys(jax.random.key(0), 4))
        >>> state.position.tolist(), int(num)   # chain 1 took chain 0's position
        ([[0.0, 1.0], [0.0, 1.0], [1.0, 1.0], [2.0, 2.0]], 1)
    """
    healthy = is_healthy(state)
    num_bad = enn.chain_sum((~healthy).astype(jnp.int32))
    num_ok = enn.num_chains() - num_bad

    def restart(state: Any) -> Any:
        position = _donor_position(state.position, healthy)
        fresh = init_chain(sampler, logdensity, position, key)
        fresh = jax.tree.map(lambda f, s: jnp.asarray(f).astype(jnp.result_type(s)), fresh, state)
        return select(healthy, state, fresh)

    # num_bad and num_ok are ensemble-wide, so every device takes the same branch.
    state = jax.lax.cond((num_bad > 0) & (num_ok > 0), restart, lambda s: s, state)
    return state, jnp.where(num_ok > 0, num_bad, 0).astype(jnp.int32)


def restart_after_run(
    sampler: Sampler,
    logdensity: Logdensity,
    state: State | Any,
    key: PRNGKeyArray,
    info: AdaptationInfo,
    *,
    excluded_before: Int[Array, ""],
    restarted_before: Int[Array, ""],
) -> tuple[State | Any, "RestartInfo"]:
    """The tail of an `EnsembleAdaptation` that restarts unhealthy chains before and after
    its loop (ChEES, MEADS): restart the chains unhealthy at the end (for the tuned
    `sampler`), and report the run's `info` with every exclusion and restart counted."""
    excluded_after = enn.chain_sum((~is_healthy(state)).astype(jnp.int32))
    state, restarted_after = restart_unhealthy(sampler, logdensity, state, key)
    return state, RestartInfo(
        num_steps=info.num_steps,
        num_excluded=info.num_excluded + excluded_before + excluded_after,
        num_grads=info.num_grads,
        num_restarted=restarted_before + restarted_after,
        bias_history=info.bias_history,
    )


class RestartInfo(AdaptationInfo):
    """`AdaptationInfo` plus the chains restarted for being non-finite (ChEES, MEADS).

    Attributes:
        num_restarted: chains moved to a healthy chain's position because their state was
            not finite (before the adaptation, and again after it).

    Example:
        >>> import jax.numpy as jnp
        >>> from samplers.adaptation import RestartInfo
        >>> info = RestartInfo(num_steps=jnp.int32(10), num_excluded=jnp.int32(1),
        ...                    num_grads=jnp.int32(20), num_restarted=jnp.int32(1))
        >>> int(info.num_restarted)
        1
    """

    num_restarted: Int[Array, ""] = enn.broadcast()


def restart_at_donors(
    sampler: Sampler,
    logdensity: Logdensity,
    state: State | Any,
    restart: Bool[Array, ""],
    key: PRNGKeyArray,
) -> tuple[State | Any, Int[Array, ""]]:
    """Restart the chains where `restart` is True at the position of a donor (one chain's
    view): a chain that is healthy and not restarted, drawn uniformly with this chain's
    own `key` (so the draw does not depend on the device count), then `sampler.init`
    there. Nothing happens when no chain restarts, or when there is no donor. Returns the
    state and the number of chains restarted (the same in every chain).

    Example:
        >>> import jax, jax.numpy as jnp, ensemblenn as enn, samplers
        >>> from samplers.adaptation._restart import restart_at_donors
        >>> logdensity = lambda x: -0.5 * jnp.sum(x**2)
        >>> kernel = samplers.MALA(step_size=0.5)
        >>> def restart(x, key):
        ...     state = kernel.init(logdensity, x, key)
        ...     return restart_at_donors(kernel, logdensity, state, x[0] > 10.0, key)
        >>> fn = enn.ensemble_map(restart, in_roles=enn.PER_CHAIN, out_roles=(enn.PER_CHAIN, None))
        >>> x = jnp.array([[0.0, 1.0], [50.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
        >>> state, num = fn(x, enn.chain_keys(jax.random.key(0), 4))
        >>> int(num), state.position[1].tolist() in x[jnp.array([0, 2, 3])].tolist()
        (1, True)
    """
    donor_ok = is_healthy(state) & ~restart
    num_restart = enn.chain_sum(restart.astype(jnp.int32))
    num_donors = enn.chain_sum(donor_ok.astype(jnp.int32))

    def move(state: Any) -> Any:
        every_ok = enn.chain_all_gather(donor_ok)
        every_x = enn.chain_all_gather(state.position)
        rank = jnp.floor(random.uniform(key, ()) * num_donors).astype(jnp.int32)
        rank = jnp.clip(rank, 0, jnp.maximum(num_donors - 1, 0))
        donor = jnp.argmax(every_ok & (jnp.cumsum(every_ok) - 1 == rank))
        fresh = init_chain(sampler, logdensity, every_x[donor], key)
        fresh = jax.tree.map(lambda f, s: jnp.asarray(f).astype(jnp.result_type(s)), fresh, state)
        return select(restart, fresh, state)

    # Both counts are ensemble-wide, so every device takes the same branch.
    go = (num_restart > 0) & (num_donors > 0)
    state = jax.lax.cond(go, move, lambda s: s, state)
    return state, jnp.where(go, num_restart, 0).astype(jnp.int32)
