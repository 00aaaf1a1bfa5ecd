"""The No-U-Turn sampler: multinomial NUTS, its trajectory built by loops over fixed-shape
storage (no recursion), so one chain's code batches under `vmap`."""

import numbers
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from .. import random
from .._errors import SamplerError, SamplerTypeError
from ..integrators import (
    LogdensityAndGrad,
    kinetic_energy,
    leapfrog,
    sample_momentum,
    value_and_grad,
    velocity,
)
from ._base import Hyper, Info, Logdensity, Sampler, hyperparameter, resolve
from ._transition import DIVERGENCE_THRESHOLD, GradientState, is_divergent, next_count, select

MAX_TREE_DEPTH_LIMIT = 30
"""The largest `max_tree_depth` accepted: leaf counters are int32 (2^30 leapfrog steps)."""


class NUTSInfo(Info):
    """`Info` of a NUTS transition, plus the depth of its tree.

    `num_grads` is the number of leapfrog steps the transition took (one gradient each),
    `acceptance_rate` the mean Metropolis acceptance `min(1, exp(-energy error))` over
    them (the statistic step-size adaptation targets), `energy_change` the energy error
    of the selected point, and `is_divergent` whether some step's energy error exceeded
    the threshold or was not finite.

    Attributes:
        tree_depth: the number of doublings the tree went through (its last subtree
            included, even when that one was rejected); `max_tree_depth` when the
            trajectory never turned back.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> kernel = samplers.NUTS(step_size=1e-3, max_tree_depth=3)
        >>> logdensity = lambda x: -0.5 * (x**2).sum()
        >>> state = kernel.init(logdensity, jnp.ones(2), jax.random.key(0))
        >>> _, info = kernel.step(logdensity, state, jax.random.key(1))
        >>> int(info.tree_depth), int(info.num_grads)  # a tiny step never turns: 1 + 2 + 4
        (3, 7)
    """

    tree_depth: Int[Array, ""]


class _Point(eqx.Module):
    """One point of a trajectory."""

    position: Float[Array, " dim"]
    momentum: Float[Array, " dim"]
    grad: Float[Array, " dim"]
    logdensity: Float[Array, ""]


class _Sample(eqx.Module):
    """The point a (sub)tree currently proposes, with its energy error."""

    position: Float[Array, " dim"]
    grad: Float[Array, " dim"]
    logdensity: Float[Array, ""]
    energy_change: Float[Array, ""]


class _Subtree(eqx.Module):
    """The carry of the loop that builds one subtree, one leaf per iteration.

    `level_momentum[k - 1]` and `level_momentum_sum[k - 1]` describe the open block of
    `2^k` leaves (aligned on multiples of `2^k` within the subtree): its first leaf's
    momentum and the sum of its momenta so far. A block is checked for a U-turn when its
    last leaf is added, which covers every subtree of the binary tree with one slot per
    level and no recursion.
    """

    end: _Point
    num_leaves: Int[Array, ""]
    sample: _Sample
    log_weight: Float[Array, ""]
    momentum_sum: Float[Array, " dim"]
    level_momentum: Float[Array, "depth dim"]
    level_momentum_sum: Float[Array, "depth dim"]
    acceptance_sum: Float[Array, ""]
    turning: Bool[Array, ""]
    divergent: Bool[Array, ""]


class _Trajectory(eqx.Module):
    """The carry of the doubling loop: the whole trajectory built so far."""

    left: _Point
    right: _Point
    sample: _Sample
    log_weight: Float[Array, ""]
    momentum_sum: Float[Array, " dim"]
    depth: Int[Array, ""]
    num_steps: Int[Array, ""]
    acceptance_sum: Float[Array, ""]
    divergent: Bool[Array, ""]
    done: Bool[Array, ""]


def _turning(
    momentum_a: Float[Array, "*batch dim"],
    momentum_b: Float[Array, " dim"],
    momentum_sum: Float[Array, "*batch dim"],
    inverse_mass_matrix: Array,
) -> Bool[Array, "*batch"]:
    """The generalized U-turn criterion (Betancourt 2017): a span of the trajectory turns
    back when the velocity `M^{-1} p` at either end points against `rho`, the span's
    momentum integral, here its trapezoidal sum (the momentum sum less half of each end, as
    NumPyro and BlackJAX do). Symmetric in its ends: the direction of integration does not
    matter."""
    rho = momentum_sum - 0.5 * (momentum_a + momentum_b)
    # velocity() acts on the last axis only for a scalar or diagonal metric; a dense one
    # multiplies each row.
    if jnp.ndim(inverse_mass_matrix) == 2:
        velocity_a = momentum_a @ inverse_mass_matrix.T
    else:
        velocity_a = velocity(momentum_a, inverse_mass_matrix)
    velocity_b = velocity(momentum_b, inverse_mass_matrix)
    return (jnp.sum(velocity_a * rho, axis=-1) <= 0) | (jnp.sum(velocity_b * rho, axis=-1) <= 0)


class NUTS(Sampler):
    """The No-U-Turn sampler (Hoffman & Gelman 2014), multinomial variant (Betancourt 2017).

    Each transition draws a momentum `p ~ N(0, M)` and doubles a leapfrog trajectory,
    forwards or backwards in time at random, until it makes a U-turn (the generalized
    criterion, on every subtree of the binary tree and on the whole trajectory), a step
    diverges (energy error above `divergence_threshold`, or not finite), or
    `max_tree_depth` doublings are done. Within a new subtree a point is drawn with
    probability proportional to `exp(-H)` (multinomial); the subtree's draw replaces the
    current one with probability `min(1, W_new / W_old)` (biased progressive sampling,
    `W` the subtrees' total weights), so the chain favours points far from the start. A
    subtree that turns or diverges inside is discarded and ends the transition.

    The tree is built without recursion: a `lax.while_loop` over doublings, and within
    one a `lax.while_loop` over its `2^depth` leaves that keeps, for each level `k`, the
    first momentum and the momentum sum of the open block of `2^k` leaves, so every
    subtree's U-turn check runs as its last leaf is added (storage `max_tree_depth x dim`).

    **Cost under vmap.** Chains batched together (a device's block of chains under
    `samplers.run`'s `block_size`, or any `vmap`) run the while loops in lockstep: a
    transition lasts as long as the deepest tree of its block, the shallower chains
    standing still, and every chain pays for `2^depth` leapfrog steps of the slowest. On
    a target whose tree depth varies a lot between chains (funnels, heavy tails) most of
    the compute is idle. The ensemble schemes `samplers.ChEES` and `samplers.LAPS` avoid
    this: they tune one trajectory length shared by the ensemble, so every chain takes
    the same number of steps. `Info.num_grads` counts a chain's own leapfrog steps only.

    Every hyperparameter but `max_tree_depth` may be a number, a broadcast array, an
    `enn.PerChainValue` or an optax schedule of the step count. The class attribute
    `default_target_acceptance` (0.9) is the mean acceptance step-size adaptation aims at:
    what NumPyro's and Stan's NUTS reach in practice with their nominal 0.8 (their dual
    averaging ends on an averaged, smaller step; eight schools: 0.89), where
    `samplers.WindowAdaptation` lands on its target. At 0.8 one step size shared by every
    chain diverged 2-6x more often than NumPyro on real hierarchical models.

    Attributes:
        step_size: the leapfrog step; None (the default) leaves it to the adaptation.
        inverse_mass_matrix: `M^{-1}`: a scalar, diagonal `(dim,)` or dense `(dim, dim)`
            array; None is the identity.
        max_tree_depth: the most doublings per transition (a Python int, 1 to 30); a
            transition costs at most `2^max_tree_depth - 1` gradients.
        divergence_threshold: (keyword-only) an energy error above this (or a
            non-finite one) is reported divergent.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> logdensity = lambda x: -0.5 * (x**2).sum()
        >>> kernel = samplers.NUTS(step_size=0.5, inverse_mass_matrix=jnp.ones(3))
        >>> state = kernel.init(logdensity, jnp.ones(3), jax.random.key(0))
        >>> state, info = kernel.step(logdensity, state, jax.random.key(1))
        >>> state.position.shape, int(info.num_grads) == 2 ** int(info.tree_depth) - 1
        ((3,), True)
        >>> result = samplers.run(kernel, logdensity, jnp.zeros((8, 3)), key=jax.random.key(2),
        ...                       num_steps=50, progress=False)
        >>> result.state.position.shape
        (8, 3)
    """

    default_target_acceptance: ClassVar[float] = 0.9

    step_size: Hyper = hyperparameter(positive=True, tuned=True, default=None)
    inverse_mass_matrix: Hyper = hyperparameter(positive=True, shape="metric", default=None)
    max_tree_depth: int = eqx.field(static=True, default=10)
    divergence_threshold: float = eqx.field(static=True, default=DIVERGENCE_THRESHOLD, kw_only=True)

    def __check_init__(self) -> None:
        depth = self.max_tree_depth
        if isinstance(depth, bool) or not isinstance(depth, numbers.Integral):
            raise SamplerTypeError(
                f"NUTS.max_tree_depth must be a Python int, got {depth!r} "
                f"({type(depth).__name__}); it fixes the shape of the tree's storage, so it "
                f"cannot be an array, a schedule or a per-chain value.\n  fix: "
                f"samplers.NUTS(step_size=..., max_tree_depth=10)"
            )
        if not 1 <= depth <= MAX_TREE_DEPTH_LIMIT:
            raise SamplerError(
                f"NUTS.max_tree_depth must be between 1 and {MAX_TREE_DEPTH_LIMIT}, got "
                f"{depth}.\n  fix: samplers.NUTS(step_size=..., max_tree_depth=10) (a "
                f"transition takes at most 2^max_tree_depth - 1 leapfrog steps)"
            )

    @property
    def grads_per_step(self) -> int:
        """The most gradients a transition can take (the actual count is per chain, in
        `Info.num_grads`)."""
        return 2**self.max_tree_depth - 1

    def metric(self, count: Int[Array, ""] | int) -> Array:
        """The inverse mass matrix at step `count` (the identity, as 1.0, for None)."""
        if self.inverse_mass_matrix is None:
            return jnp.asarray(1.0)
        return resolve(self.inverse_mass_matrix, count)

    def init(
        self, logdensity: Logdensity, position: Float[Array, " dim"], key: PRNGKeyArray
    ) -> GradientState:
        return GradientState.at(logdensity, position)

    def step(
        self, logdensity: Logdensity, state: GradientState, key: PRNGKeyArray
    ) -> tuple[GradientState, NUTSInfo]:
        key_momentum, key_tree = random.split(key)
        dtype = jnp.result_type(state.position)
        count = state.count
        step_size = resolve(self.step_size, count).astype(dtype)
        inverse_mass_matrix = self.metric(count)
        p0 = sample_momentum(state.position, inverse_mass_matrix, key_momentum)
        energy0 = kinetic_energy(p0, inverse_mass_matrix) - state.logdensity
        start = _Point(state.position, p0, state.grad, state.logdensity)
        zero = jnp.zeros((), dtype)
        trajectory = _Trajectory(
            left=start,
            right=start,
            sample=_Sample(state.position, state.grad, state.logdensity, zero),
            log_weight=zero,  # log exp(-(H - H0)) at the start
            momentum_sum=p0,
            depth=jnp.int32(0),
            num_steps=jnp.int32(0),
            acceptance_sum=zero,
            divergent=jnp.bool_(False),
            done=jnp.bool_(False),
        )

        def double(t: _Trajectory) -> _Trajectory:
            key_direction, key_subtree, key_merge = random.split(
                random.fold_in(key_tree, t.depth), 3
            )
            forward = random.bernoulli(key_direction)
            sub = self.build_subtree(
                value_and_grad(logdensity),
                select(forward, t.right, t.left),
                jnp.where(forward, step_size, -step_size),
                inverse_mass_matrix,
                energy0,
                t.depth,
                key_subtree,
            )
            valid = ~sub.turning & ~sub.divergent
            # Biased progressive sampling: the new subtree's draw wins w.p. min(1, W_new/W_old).
            take = valid & (
                jnp.log(random.uniform(key_merge, dtype=dtype)) < sub.log_weight - t.log_weight
            )
            left = select(valid & ~forward, sub.end, t.left)
            right = select(valid & forward, sub.end, t.right)
            momentum_sum = jnp.where(valid, t.momentum_sum + sub.momentum_sum, t.momentum_sum)
            turning = _turning(left.momentum, right.momentum, momentum_sum, inverse_mass_matrix)
            return _Trajectory(
                left=left,
                right=right,
                sample=select(take, sub.sample, t.sample),
                log_weight=jnp.where(
                    valid, jnp.logaddexp(t.log_weight, sub.log_weight), t.log_weight
                ),
                momentum_sum=momentum_sum,
                depth=t.depth + 1,
                num_steps=t.num_steps + sub.num_leaves,
                acceptance_sum=t.acceptance_sum + sub.acceptance_sum,
                divergent=sub.divergent,
                done=~valid | turning,
            )

        t = lax.while_loop(lambda t: (t.depth < self.max_tree_depth) & ~t.done, double, trajectory)
        info = NUTSInfo(
            acceptance_rate=(t.acceptance_sum / t.num_steps).astype(dtype),
            is_divergent=t.divergent,
            num_grads=t.num_steps,
            energy_change=t.sample.energy_change.astype(dtype),
            step_size=step_size.astype(dtype),
            tree_depth=t.depth,
        )
        new = GradientState(t.sample.position, t.sample.logdensity, state.count, t.sample.grad)
        return next_count(new), info

    def build_subtree(
        self,
        logdensity_and_grad: LogdensityAndGrad,
        edge: _Point,
        step_size: Float[Array, ""],
        inverse_mass_matrix: Array,
        energy0: Float[Array, ""],
        depth: Int[Array, ""],
        key: PRNGKeyArray,
    ) -> _Subtree:
        """`2^depth` leapfrog steps from `edge` (backwards for a negative `step_size`),
        stopped early by a U-turn inside or a divergence; a multinomial draw among them."""
        levels = jnp.arange(1, self.max_tree_depth + 1, dtype=jnp.int32)
        block = jnp.left_shift(jnp.int32(1), levels)  # 2^k leaves per block of level k
        used = levels <= depth
        dim, dtype = edge.position.shape, edge.position.dtype
        storage = jnp.zeros((self.max_tree_depth, *dim), dtype)
        subtree = _Subtree(
            end=edge,
            num_leaves=jnp.int32(0),
            sample=_Sample(edge.position, edge.grad, edge.logdensity, jnp.zeros((), dtype)),
            log_weight=jnp.full((), -jnp.inf, dtype),
            momentum_sum=jnp.zeros(dim, dtype),
            level_momentum=storage,
            level_momentum_sum=storage,
            acceptance_sum=jnp.zeros((), dtype),
            turning=jnp.bool_(False),
            divergent=jnp.bool_(False),
        )

        def add_leaf(s: _Subtree) -> _Subtree:
            e, n = s.end, s.num_leaves
            x, p, logp, grad = leapfrog(
                logdensity_and_grad,
                e.position,
                e.momentum,
                e.grad,
                step_size,
                inverse_mass_matrix,
                1,
                logdensity=e.logdensity,
            )
            energy_change = kinetic_energy(p, inverse_mass_matrix) - logp - energy0
            divergent = is_divergent(energy_change, self.divergence_threshold)
            log_w = jnp.where(jnp.isfinite(energy_change), -energy_change, -jnp.inf)
            log_weight = jnp.logaddexp(s.log_weight, log_w)
            # Multinomial within the subtree: the new leaf replaces the draw w.p. w / W.
            replace = jnp.log(random.uniform(random.fold_in(key, n), dtype=dtype)) < (
                log_w - log_weight
            )
            accept_prob = jnp.where(divergent, 0.0, jnp.exp(jnp.minimum(-energy_change, 0.0)))
            opens = used & (n % block == 0)
            closes = used & ((n + 1) % block == 0)
            level_momentum = jnp.where(opens[:, None], p, s.level_momentum)
            level_momentum_sum = jnp.where(opens[:, None], p, s.level_momentum_sum + p)
            turning = jnp.any(
                closes & _turning(level_momentum, p, level_momentum_sum, inverse_mass_matrix)
            )
            return _Subtree(
                end=_Point(x, p, grad, logp),
                num_leaves=n + 1,
                sample=select(replace, _Sample(x, grad, logp, energy_change), s.sample),
                log_weight=log_weight,
                momentum_sum=s.momentum_sum + p,
                level_momentum=level_momentum,
                level_momentum_sum=level_momentum_sum,
                acceptance_sum=s.acceptance_sum + accept_prob,
                turning=turning,
                divergent=divergent,
            )

        size = jnp.left_shift(jnp.int32(1), depth)
        return lax.while_loop(
            lambda s: (s.num_leaves < size) & ~s.turning & ~s.divergent, add_leaf, subtree
        )
