"""Gradient-free ensemble moves: the affine-invariant stretch move and differential evolution.

Each walker (chain) proposes a move built from the positions of *other* walkers, so these
kernels need the whole ensemble: `step` gathers every walker's position with
`enn.chain_all_gather` and must run inside `enn.ensemble_map`, which `samplers.run` does.
Called anywhere else it raises `enn.CollectiveError`.

Red/blue split: the ensemble is cut by global chain index into a first half (walkers
`0 .. n/2 - 1`) and a second half (`n/2 .. n - 1`), wherever the walkers live on the mesh.
One `step` moves the first half with the second half held fixed as the complementary set,
gathers again, then moves the second half against the *updated* first half. Given a fixed
complement each walker's sub-step is an ordinary Metropolis-Hastings update whose proposal
does not depend on the walker itself, so each sub-step leaves the product of the targets
invariant, and so does their composition.

Cost: a walker keeps its log-density in its state, so a move evaluates the target once, at
the proposal, and only the moving half computes moves (see `_RedBlueMove`): a full `step`,
which moves every walker once, costs 1 log-density evaluation per walker and no gradients.
"""

from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

import ensemblenn as enn

from .. import random
from .._errors import SamplerError
from ._base import Hyper, Info, Logdensity, Sampler, State, hyperparameter, resolve
from ._transition import DIVERGENCE_THRESHOLD, is_divergent, log_density, next_count

MIN_WALKERS = 4
"""Fewest walkers: each half needs two, since differential evolution draws a pair j != k."""


def _half_size(kernel: str) -> int:
    """Walkers per half, after checking the ensemble size (a Python int, so at trace time)."""
    n = enn.num_chains()
    if n % 2 or n < MIN_WALKERS:
        raise enn.ChainCountError(
            f"{kernel} splits the ensemble into two halves of at least {MIN_WALKERS // 2} "
            f"walkers each, so it needs an even number of walkers >= {MIN_WALKERS}; got {n}."
            f"\n  fix: start from e.g. {max(MIN_WALKERS, n + n % 2)} positions (a multiple of "
            "the device count); ensemble moves work best with many more walkers than "
            "dimensions."
        )
    return n // 2


def _index_below(u: Array, n: int) -> Array:
    """A uniform integer in `[0, n)` from a uniform `u` in `[0, 1)` (n is at most a few
    thousand walkers, far below float32's 2^24 resolution)."""
    return jnp.minimum(jnp.floor(u.astype(jnp.float32) * n).astype(jnp.int32), n - 1)


def _concrete(value: Hyper) -> np.ndarray | None:
    """A hyperparameter's value if it is known before the run (not a schedule or tracer)."""
    if isinstance(value, enn.PerChainValue):
        value = value.value
    if value is None or callable(value) or isinstance(value, jax.core.Tracer):
        return None
    try:
        return np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        return None


def _accept(
    u: Float[Array, ""], log_ratio: Float[Array, ""], step_size: Array, threshold: float
) -> tuple[Bool[Array, ""], Info]:
    """`metropolis_info` with the acceptance uniform `u` given (drawn with the proposal's)."""
    log_ratio = jnp.where(jnp.isnan(log_ratio), -jnp.inf, log_ratio)
    energy_change = -log_ratio
    info = Info(
        acceptance_rate=jnp.minimum(1.0, jnp.exp(log_ratio)).astype(jnp.float32),
        is_divergent=is_divergent(energy_change, threshold),
        num_grads=jnp.int32(0),
        energy_change=energy_change.astype(jnp.float32),
        step_size=jnp.asarray(step_size, jnp.float32),
    )
    return jnp.log(u) < log_ratio, info


class _RedBlueMove(Sampler):
    """A Metropolis-Hastings move of one walker against the complementary half of the
    ensemble; subclasses supply `hyper`, `proposal` and `reported_scale`.

    How a step is computed (the same result as running every walker's move under `vmap`,
    at half the cost): every device gathers the whole ensemble (positions, log-densities,
    keys, hyperparameters), then computes the moves of its share of the moving half,
    `ceil(n / 2 / devices)` walkers, outside the ensemble's `vmap`; the moved half is
    gathered over devices, then the other half moves the same way, and each walker picks
    its own result. So each walker's log density is evaluated once per step, at its
    proposal (its current value is kept in the state), and each walker draws its random
    numbers once, from its own key: the draws do not depend on where the walker lives.
    The per-walker move runs in `enn.batch_invariant` blocks, so the bits do not depend on
    the device count either.
    """

    # `step` gathers the ensemble; the per-walker move inside it is blocked instead.
    step_uses_ensemble = True
    # Whether `proposal` needs `dim` uniforms of its own (for Gaussian noise).
    jitter: ClassVar[bool] = False

    divergence_threshold: float = eqx.field(static=True, default=DIVERGENCE_THRESHOLD, kw_only=True)

    def hyper(self, position: Float[Array, " dim"], count: Int[Array, ""]) -> Any:
        """This walker's hyperparameters at step `count` (a pytree of arrays): resolved
        per walker before the ensemble is gathered, since a walker's move may be computed
        on another device."""
        raise NotImplementedError

    def reported_scale(self, hyper: Any) -> Float[Array, ""]:
        """The scalar hyperparameter reported as `Info.step_size`."""
        raise NotImplementedError

    def proposal(
        self,
        jitter: Float[Array, " k"],
        u: Float[Array, " 2"],
        position: Float[Array, " dim"],
        ensemble: Float[Array, "chains dim"],
        start: int,
        size: int,
        hyper: Any,
    ) -> tuple[Float[Array, " dim"], Float[Array, ""]]:
        """The proposed position and the log proposal correction
        `log q(position | proposed) - log q(proposed | position)` (Jacobian included).

        `u` holds two uniforms in [0, 1) drawn for this walker, and `jitter` `dim`
        more when the class sets `jitter = True` (else none). `ensemble` holds every
        walker's position in global chain order; the complementary half is
        `ensemble[start : start + size]`, and only it may be used.
        """
        raise NotImplementedError

    @property
    def grads_per_step(self) -> int:
        return 0

    def init(
        self, logdensity: Logdensity, position: Float[Array, " dim"], key: PRNGKeyArray
    ) -> State:
        # Inside the ensemble the walker count is known at trace time: fail before the run.
        # Outside it (a single state, e.g. for inspection) there is nothing to check yet.
        try:
            _half_size(type(self).__name__)
        except enn.CollectiveError:
            pass
        position = jnp.asarray(position)
        logp = enn.batch_invariant(log_density)(logdensity, position)
        return State(position, logp, jnp.int32(0))

    def _move(
        self,
        logdensity: Logdensity,
        walkers: tuple,
        ensemble: Array,
        start: int,
        size: int,
    ) -> tuple[Array, Array, Info]:
        """The MH updates of a batch of walkers against `ensemble[start : start + size]`.

        Only the log density runs in `enn.batch_invariant` blocks: the rest is
        elementwise arithmetic (kept free of fused multiply-adds by `enn.rounded`), whose
        bits do not depend on the batch width, and a block loop around it would cost more
        than the move itself.
        """
        position, logp, key_data, hyper = walkers
        keys = jax.random.wrap_key_data(key_data)
        # One hash for all of a walker's random numbers: threefry, not the arithmetic, is
        # what a move spends its time on.
        dim = position.shape[-1]
        count = 3 + (dim if self.jitter else 0)
        u = jax.vmap(lambda k: random.uniforms(k, count, position.dtype))(keys)
        proposal = jax.vmap(self.proposal, in_axes=(0, 0, 0, None, None, None, 0))
        proposed, correction = proposal(
            u[:, 3:],
            u[:, :2],
            position,
            ensemble,
            start,
            size,
            hyper,
        )
        density = jax.vmap(enn.batch_invariant(log_density), in_axes=(None, 0))
        logp_proposed = density(logdensity, proposed)
        accept, info = jax.vmap(_accept, in_axes=(0, 0, 0, None))(
            u[:, 2],
            logp_proposed - logp + enn.rounded(correction),
            jax.vmap(self.reported_scale)(hyper),
            self.divergence_threshold,
        )
        return (
            jnp.where(accept[:, None], proposed, position),
            jnp.where(accept, logp_proposed, logp),
            info,
        )

    def step(self, logdensity: Logdensity, state: State, key: PRNGKeyArray) -> tuple[State, Info]:
        half = _half_size(type(self).__name__)
        hyper = self.hyper(state.position, state.count)
        walkers = enn.chain_all_gather(
            (state.position, state.logdensity, jax.random.key_data(key), hyper)
        )
        # This device's share of a half: a slice when the devices split it evenly
        # (static on one device); otherwise clipped at its end, a short last share
        # repeating a walker whose duplicate result is dropped.
        devices = enn.num_devices()
        share = -(-half // devices)
        first = 0 if devices == 1 else enn.device_index() * share
        clipped = None if half % devices == 0 else jnp.minimum(first + jnp.arange(share), half - 1)

        def take(x: Array, moving: int) -> Array:
            if clipped is None:
                return jax.lax.dynamic_slice_in_dim(x, moving + first, share)
            return x[moving + clipped]

        def gather(tree: Any) -> Any:
            # The shares of every device, in walker order: one half of the ensemble.
            return jax.tree.map(lambda x: x[:half], enn.device_all_gather(tree))

        # The first half moves against the second; then the second against the first as
        # it is *after* that move.
        ensemble = walkers[0]
        moved = []
        for moving, start in ((0, half), (half, 0)):
            chosen = jax.tree.map(lambda x: take(x, moving), walkers)
            moved.append(gather(self._move(logdensity, chosen, ensemble, start, half)))
            ensemble = jnp.concatenate([moved[0][0], walkers[0][half:]])
        both = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), *moved)
        position, logp, info = jax.tree.map(lambda x: x[enn.chain_index()], both)
        new = eqx.tree_at(lambda s: (s.position, s.logdensity), state, (position, logp))
        return next_count(new), info


class Stretch(_RedBlueMove):
    """The affine-invariant stretch move of Goodman & Weare (2010), emcee's default move.

    Walker `x` picks `x_j` uniformly from the complementary half and proposes
    `y = x_j + z (x - x_j)` with `z` drawn from `g(z) ∝ 1/sqrt(z)` on `[1/a, a]`; it accepts
    with probability `min(1, z^(d-1) p(y) / p(x))`, `d` the dimension. The move is invariant
    under affine maps of the space, so a linear change of variables (e.g. a correlated or
    badly scaled Gaussian) does not slow it down; the walkers' own spread sets the scale.

    The ensemble only explores the affine hull of its starting points: start the walkers at
    distinct points spanning every dimension (a small Gaussian ball is fine), with more
    walkers than dimensions (`2 d` at least; a few times that is better).

    One `step` moves the first half of the walkers (by global chain index), then the second
    half against the updated first half (see the module docstring), and costs 1
    log-density evaluation per walker and no gradients. `step` needs the whole ensemble,
    so it only runs inside `enn.ensemble_map` (as `samplers.run` calls it); elsewhere it
    raises `enn.CollectiveError`. The ensemble must have an even number of walkers, at
    least 4 (`enn.ChainCountError` otherwise).

    Attributes:
        a: the stretch scale, `> 1`, a scalar: a number, a scalar array, an
            `enn.PerChainValue` or an optax schedule of the step count. Reported as
            `Info.step_size`.
        divergence_threshold: (keyword-only) a proposal whose log-density falls more than
            this below the current one (or is not finite) is reported divergent.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> target = samplers.targets.IllConditionedGaussian(dim=3, condition_number=100.0)
        >>> x0 = jax.random.normal(jax.random.key(0), (32, 3))
        >>> result = samplers.run(samplers.Stretch(a=2.0), target, x0, key=jax.random.key(1),
        ...                       num_steps=400, num_warmup=100, progress=False)
        >>> result.state.position.shape, int(result.num_grads.sum())
        ((32, 3), 0)
        >>> ratio = result.diagnostics.second_moment / target.reference.second_moment
        >>> [round(float(r)) for r in ratio]  # E[x²] matches despite variances 1 to 100
        [1, 1, 1]
    """

    a: Hyper = hyperparameter(shape="scalar", default=2.0)

    def __check_init__(self) -> None:
        a = _concrete(self.a)
        if a is not None and not np.all(a > 1):
            raise SamplerError(
                f"Stretch needs a > 1 (z is drawn from [1/a, a]), got a={self.a!r}.\n  fix: "
                "a=2.0 is the usual choice."
            )

    def hyper(self, position: Float[Array, " dim"], count: Int[Array, ""]) -> Array:
        return resolve(self.a, count).astype(jnp.result_type(position))

    def reported_scale(self, hyper: Array) -> Array:
        return hyper

    def proposal(
        self,
        jitter: Float[Array, " k"],
        u: Float[Array, " 2"],
        position: Float[Array, " dim"],
        ensemble: Float[Array, "chains dim"],
        start: int,
        size: int,
        hyper: Array,
    ) -> tuple[Float[Array, " dim"], Float[Array, ""]]:
        a = hyper
        anchor = ensemble[start + _index_below(u[0], size)]
        # Inverse CDF of g(z) ∝ 1/sqrt(z) on [1/a, a]: sqrt(z) is uniform on
        # [1/sqrt(a), sqrt(a)], i.e. z = (1 + (a - 1) u)^2 / a.
        # (enn.rounded: no fused multiply-add, whose use depends on the batch width.)
        z = (1 + enn.rounded((a - 1) * u[1])) ** 2 / a
        proposed = anchor + enn.rounded(z * (position - anchor))
        # The map x -> y stretches all d directions by z; with g(1/z) = z g(z) the
        # correction is z^(d-1).
        return proposed, (position.shape[-1] - 1) * jnp.log(z)


class DifferentialEvolution(_RedBlueMove):
    """Differential-evolution Markov chain (ter Braak 2006) on the red/blue ensemble.

    Walker `x` draws two distinct walkers `x_j`, `x_k` from the complementary half and
    proposes `y = x + gamma (x_j - x_k) + eps`, `eps ~ N(0, sigma² I)`. The proposal is
    symmetric (swapping `j` and `k` is as likely), so it accepts with probability
    `min(1, p(y) / p(x))`. The jumps follow the ensemble's spread, so their scale and
    orientation adapt to the target without gradients. A schedule that sets `gamma = 1`
    every few steps lets walkers jump between modes of similar shape.

    Start the walkers at distinct points spanning every dimension (the small `eps` alone
    would take long to widen a degenerate ensemble), with more walkers than dimensions.

    Same structure and cost as `Stretch`: one `step` moves the first half of the walkers
    against the second, then the second against the updated first; 1 log-density
    evaluation per walker per step, no gradients; only
    inside `enn.ensemble_map` / `samplers.run`; an even number of walkers, at least 4.

    Attributes:
        gamma: the jump scale: None for ter Braak's `2.38 / sqrt(2 d)`, or a number, a
            broadcast array (a `(dim,)` array scales each coordinate), an
            `enn.PerChainValue` or an optax schedule of the step count. Reported as
            `Info.step_size` (its mean over coordinates).
        sigma: the standard deviation of the small Gaussian jitter `eps`, which makes the
            chain irreducible; same kinds of value as `gamma`.
        divergence_threshold: (keyword-only) a proposal whose log-density falls more than
            this below the current one (or is not finite) is reported divergent.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> target = samplers.targets.IllConditionedGaussian(dim=3, condition_number=100.0)
        >>> x0 = jax.random.normal(jax.random.key(0), (32, 3))
        >>> every_tenth = lambda count: jnp.where(count % 10 == 9, 1.0, 2.38 / jnp.sqrt(6.0))
        >>> result = samplers.run(samplers.DifferentialEvolution(gamma=every_tenth), target,
        ...                       x0, key=jax.random.key(1), num_steps=400, num_warmup=100,
        ...                       progress=False)
        >>> ratio = result.diagnostics.second_moment / target.reference.second_moment
        >>> [round(float(r)) for r in ratio]  # E[x²] matches despite variances 1 to 100
        [1, 1, 1]
    """

    gamma: Hyper = hyperparameter(positive=True, default=None)
    sigma: Hyper = hyperparameter(nonnegative=True, default=1e-5)
    jitter: ClassVar[bool] = True

    def __check_init__(self) -> None:
        gamma, sigma = _concrete(self.gamma), _concrete(self.sigma)
        if gamma is not None and not np.all(gamma > 0):
            raise SamplerError(
                f"DifferentialEvolution needs gamma > 0, got gamma={self.gamma!r}.\n  fix: "
                "gamma=None uses 2.38 / sqrt(2 dim)."
            )
        if sigma is not None and not np.all(sigma >= 0):
            raise SamplerError(f"DifferentialEvolution needs sigma >= 0, got sigma={self.sigma!r}.")

    def hyper(self, position: Float[Array, " dim"], count: Int[Array, ""]) -> tuple:
        dtype = jnp.result_type(position)
        if self.gamma is None:
            # ter Braak's optimum for a Gaussian target: the jump's scale is then that of
            # the target's, 2.38 / sqrt(d), since x_j - x_k has twice the target variance.
            gamma = jnp.asarray(2.38 / (2 * position.shape[-1]) ** 0.5, dtype)
        else:
            gamma = resolve(self.gamma, count).astype(dtype)
        return gamma, resolve(self.sigma, count).astype(dtype)

    def reported_scale(self, hyper: tuple) -> Array:
        return jnp.mean(hyper[0])

    def proposal(
        self,
        jitter: Float[Array, " k"],
        u: Float[Array, " 2"],
        position: Float[Array, " dim"],
        ensemble: Float[Array, "chains dim"],
        start: int,
        size: int,
        hyper: tuple,
    ) -> tuple[Float[Array, " dim"], Float[Array, ""]]:
        gamma, sigma = hyper
        j = _index_below(u[0], size)
        # k uniform over the other size - 1 walkers of the half: an offset in [1, size).
        k = (j + 1 + _index_below(u[1], size - 1)) % size
        difference = ensemble[start + j] - ensemble[start + k]
        eps = enn.rounded(sigma * random.normals(jitter))
        # (enn.rounded: no fused multiply-add, whose use depends on the batch width.)
        proposed = position + enn.rounded(gamma * difference) + eps
        return proposed, jnp.zeros((), position.dtype)
