"""How the driver and the adaptations run ONE chain's `init`/`step` inside the ensemble:
in `enn.batch_invariant` blocks, so that results do not depend on the device count."""

from typing import Any

from jaxtyping import Array, PRNGKeyArray

import ensemblenn as enn

from ._base import Info, Logdensity, Sampler, State


def step_chain(
    sampler: Sampler, logdensity: Logdensity, state: State, key: PRNGKeyArray
) -> tuple[State, Info]:
    """`sampler.step` as the driver runs it: in `enn.batch_invariant` blocks when the
    enclosing `ensemble_map` has a `block_size` (so results do not depend on the device
    count), unless the kernel's step needs the ensemble.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> from samplers.kernels import step_chain
        >>> logdensity = lambda x: -0.5 * jnp.sum(x**2)
        >>> mala = samplers.MALA(step_size=0.5)
        >>> state = mala.init(logdensity, jnp.ones(3), jax.random.key(0))
        >>> new, info = step_chain(mala, logdensity, state, jax.random.key(1))
        >>> plain, _ = mala.step(logdensity, state, jax.random.key(1))
        >>> bool((new.position == plain.position).all())  # no ensemble, no block size
        True
    """
    if sampler.step_uses_ensemble:
        return sampler.step(logdensity, state, key)
    return _blocked(sampler, "step", logdensity, state, key)


def init_chain(
    sampler: Sampler, logdensity: Logdensity, position: Array, key: PRNGKeyArray
) -> State:
    """`sampler.init` as the driver runs it (see `step_chain`)."""
    if sampler.step_uses_ensemble:
        return sampler.init(logdensity, position, key)
    return _blocked(sampler, "init", logdensity, position, key)


def _blocked(sampler: Sampler, method: str, *args: Any) -> Any:
    try:
        return enn.batch_invariant(getattr(sampler, method))(*args)
    except enn.CollectiveError as err:
        if "batch_invariant" not in str(err):
            raise
        name = type(sampler).__name__
        raise enn.CollectiveError(
            f"{name}.{method} calls a cross-chain collective (enn.chain_mean, chain_sum, "
            "chain_all_gather or chain_index), but the driver runs each chain's init and "
            "step in blocks of chains (samplers.run's block_size, for results that do not "
            "depend on the device count), where a collective would see one block.\n  fix: "
            f"declare `step_uses_ensemble = True` in the body of class {name} (its init and "
            "step then run over the whole ensemble, unblocked), or pass block_size=None to "
            "samplers.run."
        ) from None
