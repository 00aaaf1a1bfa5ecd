"""The pieces every kernel's transition shares, in one home: the Metropolis-Hastings
accept/reject and its `Info`, the divergence rule, finiteness checks, the gradient-carrying
state and its initialisation, the step counter, the jittered path length, and the
Hamiltonian proposal (leapfrog trajectory plus Metropolis test) of HMC, GHMC and ChEES.

Every function that takes a PRNG key takes it LAST, as `Sampler.init` and `Sampler.step` do.
"""

from typing import Any, Self

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from .. import random
from ..integrators import kinetic_energy, leapfrog, value_and_grad
from ._base import Info, Logdensity, State

DIVERGENCE_THRESHOLD = 1000.0
"""An energy error above this (or a non-finite one) marks a transition divergent."""


def all_finite(*trees: Any) -> Bool[Array, ""]:
    """Whether every leaf of every tree is finite (no NaN, no inf).

    Example:
        >>> import jax.numpy as jnp
        >>> from samplers.kernels import all_finite
        >>> bool(all_finite(jnp.ones(2), {"a": jnp.float32(0.0)})), bool(all_finite(jnp.nan))
        (True, False)
    """
    leaves = [jnp.asarray(x) for x in jax.tree.leaves(trees)]
    if not leaves:
        return jnp.bool_(True)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def is_divergent(energy_change: Float[Array, ""], threshold: float) -> Bool[Array, ""]:
    """The divergence rule shared by every kernel: an energy error above `threshold`, or a
    non-finite one.

    Example:
        >>> import jax.numpy as jnp
        >>> from samplers.kernels import is_divergent
        >>> [bool(is_divergent(jnp.float32(e), 1000.0)) for e in (5.0, 2000.0, jnp.nan)]
        [False, True, True]
    """
    return ~jnp.isfinite(energy_change) | (energy_change > threshold)


def log_density(logdensity: Logdensity, position: Float[Array, " dim"]) -> Float[Array, ""]:
    """`logdensity(position)` as a scalar of the position's dtype (type-stable scan carries)."""
    return jnp.asarray(logdensity(position)).astype(jnp.result_type(position))


def jittered_steps(num_steps: Int[Array, ""], key: PRNGKeyArray) -> Int[Array, ""]:
    """A path length drawn uniformly from `{1, ..., 2 * num_steps - 1}` (mean `num_steps`,
    at least 1): what `jitter=True` does in HMC and AdjustedMCLMC.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from samplers.kernels._transition import jittered_steps
        >>> keys = jax.random.split(jax.random.key(0), 999)
        >>> n = jax.vmap(jittered_steps, (None, 0))(jnp.int32(5), keys)
        >>> int(n.min()), int(n.max())
        (1, 9)
    """
    return random.randint(key, (), 1, 2 * jnp.maximum(num_steps, 1))


def next_count(state: State) -> State:
    """`state` with its step count advanced (every step counts, accepted or not)."""
    return eqx.tree_at(lambda s: s.count, state, state.count + 1)


class GradientState(State):
    """A chain state that also stores the gradient of the log-density at `position`, so a
    step only differentiates at the proposal (MALA, HMC, GHMC and NUTS use it).

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> state = samplers.HMC(0.1, 5).init(lambda x: -0.5 * (x**2).sum(), jnp.ones(2),
        ...                                   jax.random.key(0))
        >>> isinstance(state, samplers.GradientState), state.grad.tolist()
        (True, [-1.0, -1.0])
    """

    grad: Float[Array, " dim"]

    @classmethod
    def at(cls, logdensity: Logdensity, position: Float[Array, " dim"]) -> "GradientState":
        """The state at `position`, step count 0, with its log density and gradient.

        Example:
            >>> import jax.numpy as jnp, samplers
            >>> s = samplers.GradientState.at(lambda x: -0.5 * (x**2).sum(), jnp.ones(2))
            >>> float(s.logdensity), s.grad.tolist(), int(s.count)
            (-1.0, [-1.0, -1.0], 0)
        """
        position = jnp.asarray(position)
        logp, grad = value_and_grad(logdensity)(position)
        return cls(position, logp, jnp.int32(0), grad)

    def moved(
        self,
        position: Float[Array, " dim"],
        logdensity: Float[Array, ""],
        grad: Float[Array, " dim"],
    ) -> Self:
        """This state at a proposal: the position, log density and gradient replaced, every
        other field (the step count, a subclass's own) kept.

        Example:
            >>> import jax.numpy as jnp, samplers
            >>> s = samplers.GradientState.at(lambda x: -0.5 * (x**2).sum(), jnp.ones(2))
            >>> s.moved(jnp.zeros(2), jnp.float32(0.0), jnp.zeros(2)).position.tolist()
            [0.0, 0.0]
        """
        return eqx.tree_at(
            lambda s: (s.position, s.logdensity, s.grad), self, (position, logdensity, grad)
        )


def unadjusted_info(
    num_grads: int | Array = 1,
    energy_change: Array | float = 0.0,
    step_size: Array | float = 0.0,
    is_divergent: Array | bool = False,
    *,
    dtype: Any = jnp.float32,
) -> Info:
    """`Info` for a kernel with no Metropolis step (acceptance 1), its floats in `dtype`
    (pass the position's dtype).

    Example:
        >>> import samplers
        >>> info = samplers.unadjusted_info(num_grads=2, step_size=0.5)
        >>> float(info.acceptance_rate), int(info.num_grads), float(info.step_size)
        (1.0, 2, 0.5)
    """
    return Info(
        acceptance_rate=jnp.ones((), dtype),
        is_divergent=jnp.asarray(is_divergent, bool),
        num_grads=jnp.asarray(num_grads, jnp.int32),
        energy_change=jnp.asarray(energy_change, dtype),
        step_size=jnp.asarray(step_size, dtype),
    )


def metropolis(
    log_ratio: Float[Array, ""], key: PRNGKeyArray
) -> tuple[Bool[Array, ""], Float[Array, ""]]:
    """Accept with probability `min(1, exp(log_ratio))`; NaN counts as reject.

    Returns `(accept, acceptance_probability)`.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> accept, prob = samplers.metropolis(jnp.float32(0.0), jax.random.key(0))
        >>> bool(accept), float(prob)  # a ratio of 1 is always accepted
        (True, 1.0)
        >>> accept, prob = samplers.metropolis(jnp.float32(jnp.nan), jax.random.key(0))
        >>> bool(accept), float(prob)
        (False, 0.0)
    """
    log_ratio = jnp.where(jnp.isnan(log_ratio), -jnp.inf, log_ratio)
    prob = jnp.minimum(1.0, jnp.exp(log_ratio))
    accept = jnp.log(random.uniform(key)) < log_ratio
    return accept, prob


def metropolis_info(
    energy_change: Float[Array, ""],
    key: PRNGKeyArray,
    *,
    num_grads: Int[Array, ""] | int,
    step_size: Float[Array, ""] | float,
    divergence_threshold: float,
) -> tuple[Bool[Array, ""], Info]:
    """Accept with probability `min(1, exp(-energy_change))` and fill the `Info`.

    `energy_change` is minus the log Metropolis-Hastings ratio: `H(new) - H(old)` for
    Hamiltonian kernels, and the same quantity including the proposal correction for the
    others. A NaN counts as a rejection and, like an error above `divergence_threshold`,
    as a divergence. The `Info` floats have the dtype of `energy_change` (the position's).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from samplers.kernels import metropolis_info
        >>> accept, info = metropolis_info(jnp.float32(0.0), jax.random.key(0), num_grads=3,
        ...                                step_size=0.1, divergence_threshold=1000.0)
        >>> bool(accept), float(info.acceptance_rate), int(info.num_grads)
        (True, 1.0, 3)
    """
    dtype = jnp.result_type(energy_change)
    accept, prob = metropolis(-energy_change, key)
    info = Info(
        acceptance_rate=jnp.asarray(prob, dtype),
        is_divergent=is_divergent(energy_change, divergence_threshold),
        num_grads=jnp.asarray(num_grads, jnp.int32),
        energy_change=jnp.asarray(energy_change, dtype),
        step_size=jnp.asarray(step_size, dtype),
    )
    return accept, info


def select(accept: Bool[Array, ""], new: Any, old: Any) -> Any:
    """Pick `new` where `accept` else `old`, leaf by leaf (pytrees of arrays).

    Example:
        >>> import jax.numpy as jnp, samplers
        >>> new, old = {"x": jnp.ones(2), "n": jnp.int32(1)}, {"x": jnp.zeros(2), "n": jnp.int32(0)}
        >>> picked = samplers.select(jnp.bool_(False), new, old)
        >>> picked["x"].tolist(), int(picked["n"])
        ([0.0, 0.0], 0)
    """
    return jax.tree.map(lambda a, b: jnp.where(accept, a, b), new, old)


class Trajectory(eqx.Module):
    """The end of a leapfrog trajectory: position, momentum, log density and gradient."""

    position: Float[Array, " dim"]
    momentum: Float[Array, " dim"]
    logdensity: Float[Array, ""]
    grad: Float[Array, " dim"]


def hamiltonian_proposal(
    logdensity: Logdensity,
    state: Any,
    momentum: Float[Array, " dim"],
    step_size: Float[Array, ""],
    inverse_mass_matrix: Array,
    num_steps: Int[Array, ""] | int,
    key: PRNGKeyArray,
    *,
    divergence_threshold: float,
) -> tuple[Bool[Array, ""], Info, Trajectory]:
    """`num_steps` leapfrog steps from `state` (a `GradientState`) with `momentum`, and the
    Metropolis test of where they end: `(accept, info, end)`.

    The one Hamiltonian transition of the library: HMC, GHMC and ChEES's kernel differ only
    in how they draw the momentum and the number of steps, and in what they keep of `end`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from samplers.kernels import GradientState, hamiltonian_proposal
        >>> logdensity = lambda x: -0.5 * (x**2).sum()
        >>> state = GradientState.at(logdensity, jnp.ones(2))
        >>> accept, info, end = hamiltonian_proposal(logdensity, state, jnp.zeros(2), 0.1, 1.0,
        ...                                          5, jax.random.key(0),
        ...                                          divergence_threshold=1000.0)
        >>> end.position.shape, int(info.num_grads), bool(info.is_divergent)
        ((2,), 5, False)
    """
    x, p, logp, grad = leapfrog(
        value_and_grad(logdensity),
        state.position,
        momentum,
        state.grad,
        step_size,
        inverse_mass_matrix,
        num_steps,
        logdensity=state.logdensity,
    )
    energy_change = (
        kinetic_energy(p, inverse_mass_matrix)
        - logp
        - kinetic_energy(momentum, inverse_mass_matrix)
        + state.logdensity
    )
    accept, info = metropolis_info(
        energy_change,
        key,
        num_grads=num_steps,
        step_size=step_size,
        divergence_threshold=divergence_threshold,
    )
    return accept, info, Trajectory(x, p, logp, grad)
