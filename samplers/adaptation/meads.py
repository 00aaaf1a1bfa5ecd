"""MEADS: generalized HMC tuned by cross-chain statistics of K folds of chains.

Hoffman and Sountsov, "Tuning-Free Generalized Hamiltonian Monte Carlo" (AISTATS 2022).
GHMC takes one leapfrog step per transition with a partially refreshed momentum; its three
hyperparameters (diagonal preconditioner, step size, damping) are set from statistics of
the ensemble, with the chains split into folds so that no chain's hyperparameters depend
on its own state.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray, PyTree

import ensemblenn as enn

from .. import random
from ..kernels import (
    GHMC,
    GHMCState,
    Info,
    Logdensity,
    Sampler,
    next_count,
    resolve,
    select,
    step_chain,
)
from ._base import EnsembleAdaptation, finite_chain_mean
from ._restart import RestartInfo, is_healthy, restart_after_run, restart_unhealthy
from .chees import pack, unpack

_TINY = 1e-30


class _HeldFold(Sampler):
    """GHMC with per-chain hyperparameters, where the chains of one fold stand still.

    `held_fold` is the fold whose statistics set everyone else's hyperparameters for this
    step, so it must not move during it. `directions[0, k]` and `directions[1, k]` are the
    power-iteration vectors of fold `k` for the position covariance and the gradient second
    moment (in the original coordinates). `momentum_scale` is `sqrt(M^{-1}_old / M^{-1})`
    since the chain's last step: the persistent momentum is rescaled by it first, so that
    it stays `N(0, M)` when the preconditioner changes (the momentum of the preconditioned
    coordinates persists). Without it a chain whose inverse mass matrix grows would carry
    kinetic energy far above equilibrium into its next trajectories.
    """

    step_uses_ensemble = True  # the fold is the chain index; the kernel step is blocked

    kernel: GHMC
    held_fold: Int[Array, ""]
    directions: Float[Array, "2 folds dim"]
    momentum_scale: Float[Array, " dim"]
    num_folds: int = eqx.field(static=True)

    def init(
        self, logdensity: Logdensity, position: Float[Array, " dim"], key: PRNGKeyArray
    ) -> GHMCState:
        return self.kernel.init(logdensity, position, key)

    def fold(self) -> Int[Array, ""]:
        return enn.chain_index() % self.num_folds

    def step(
        self, logdensity: Logdensity, state: GHMCState, key: PRNGKeyArray
    ) -> tuple[GHMCState, Info]:
        moving = eqx.tree_at(lambda s: s.momentum, state, state.momentum * self.momentum_scale)
        new, info = step_chain(self.kernel, logdensity, moving, key)
        held = self.fold() == self.held_fold
        return select(held, next_count(state), new), info


# Divisions kept as written: XLA rewrites `x / share` differently on one device and on
# several (CSE runs only when partitioning), which changed the tuned values' last bits.
@enn.exact_divisions
def _fold_estimates(means: PyTree, directions: Array, multiplier: float) -> dict:
    """Per-fold preconditioner, eigenvalue estimates and new power-iteration directions.

    Every leaf of `means` has a leading fold axis; a fold's mean is its entry divided by
    the fold's share `w` of the chains.
    """
    w = means["w"]
    n = means["n"]  # finite chains in each fold
    share = jnp.maximum(w, _TINY)
    unbias = n / jnp.maximum(n - 1.0, 1.0)
    mean = means["x"] / share[:, None]
    var = (means["x2"] / share[:, None] - mean**2) * unbias[:, None]
    scale2 = jnp.maximum(var, _TINY)  # sigma^2, the new diagonal inverse mass matrix

    # Position covariance in preconditioned coordinates x / sigma: one power-iteration
    # step from the carried direction u, and its Rayleigh quotient (a lower bound of the
    # largest eigenvalue; the largest diagonal entry, 1 by construction, is another).
    u_x = directions[0]
    mean_u = means["sx"] / share
    cov_uu = (means["sx2"] / share - mean_u**2) * unbias
    cov_u = (means["xsx"] / share[:, None] - mean * mean_u[:, None]) * unbias[:, None]
    rayleigh_x = cov_uu / jnp.maximum(jnp.sum(scale2 * u_x**2, -1), _TINY)
    eig_x = jnp.maximum(rayleigh_x, 1.0)
    next_x = cov_u / scale2
    next_x = next_x / jnp.sqrt(jnp.maximum(jnp.sum(scale2 * next_x**2, -1), _TINY))[:, None]

    # Gradient second moment in preconditioned coordinates sigma * grad (for a Gaussian,
    # the preconditioned Hessian): same estimate, floored by its largest diagonal entry.
    u_g = directions[1]
    q = means["sg2"] / share
    g_u = means["gsg"] / share[:, None]
    rayleigh_g = q / jnp.maximum(jnp.sum(u_g**2 / scale2, -1), _TINY)
    diag_g = jnp.max(scale2 * means["g2"] / share[:, None], -1)
    # For a Gaussian target E[g (x - mean)^T] = -H Cov(x) whatever the chains' spread, so
    # -Cov(g_d, x_d) is the preconditioned Hessian's diagonal (H_dd sigma_d^2) even while
    # the chains are under-dispersed, when the second moment of g underestimates it.
    cross = (means["gx"] / share[:, None] - means["g"] / share[:, None] * mean) * unbias[:, None]
    stein_g = jnp.max(-cross, -1)
    eig_g = jnp.maximum(jnp.maximum(rayleigh_g, diag_g), stein_g)
    next_g = scale2 * g_u
    next_g = next_g / jnp.sqrt(jnp.maximum(jnp.sum(next_g**2 / scale2, -1), _TINY))[:, None]

    step_size = multiplier / jnp.sqrt(jnp.maximum(eig_g, _TINY))
    finite = (
        jnp.all(jnp.isfinite(var), -1)
        & jnp.isfinite(eig_x)
        & jnp.isfinite(eig_g)
        & jnp.all(jnp.isfinite(next_x), -1)
        & jnp.all(jnp.isfinite(next_g), -1)
    )
    ok = (n >= 1.5) & finite & jnp.all(var > 0, -1) & (eig_g > 0)
    return {
        "ok": ok,
        "inverse_mass_matrix": scale2,
        "step_size": step_size,
        "damping": 1.0 / jnp.sqrt(eig_x),
        "directions": jnp.stack([next_x, next_g]),
    }


class MEADS(EnsembleAdaptation):
    """MEADS: tune `samplers.GHMC` from the cross-chain statistics of K folds of chains.

    Chains are split into `num_folds` folds by global chain index (`chain_index() % K`).
    Before adaptation step `t`, fold `k = t mod K` is *held*: its chains do not move
    during step `t`, and the statistics of its current states set the hyperparameters of
    every other fold, so no chain's hyperparameters depend on its own state. Fold
    statistics are masked cross-chain means (each chain contributes to its own fold only;
    a chain whose state, log density included, or statistics are not finite is left out
    and counted in `adaptation_info.num_excluded`, a `RestartInfo`). A chain not finite
    before the adaptation is left out of the initial statistics, counted, and restarted
    at a healthy chain's position (round robin, a fresh `init` there), as is any chain
    still not finite after it (`num_restarted` counts both):

    * **preconditioner**: the diagonal inverse mass matrix is the fold's cross-chain
      variance `sigma^2` of each coordinate;
    * **step size**: `step_size_multiplier / sqrt(lambda_g)`, with `lambda_g` the largest
      eigenvalue of the preconditioned Hessian, which bounds the stable leapfrog step. It
      is estimated from the preconditioned gradient second moment `E[(sigma g)(sigma
      g)^T]` (the preconditioned Hessian for a Gaussian at equilibrium), and, since that
      underestimates it while the chains are under-dispersed (e.g. all started at one
      point), also from the largest `-Cov(g_d, x_d)`, which for a Gaussian target is the
      preconditioned Hessian's diagonal whatever the chains' spread; the larger wins;
    * **damping**: `gamma = 1 / sqrt(lambda_x)` per unit time, with `lambda_x` the largest
      eigenvalue of the fold's covariance in preconditioned coordinates `x / sigma` (the
      slowest direction's time scale), so the momentum persists about as long as it takes
      to cross the widest direction. Early on it is floored so that the persistence
      `exp(-gamma * step_size)` is at most `exp(-damping_slowdown / (t + 1))`: momentum
      does not outlive the adaptation so far while chains are still far from the target.

    The largest eigenvalues are estimated without any `dim x dim` matrix: each fold carries
    one vector per matrix, improved by one power-iteration step per adaptation step (a
    masked cross-chain mean of `x (x . u)` or `g (g . u)`), and the estimate is the largest
    of the Rayleigh quotient and the largest diagonal entry (both lower bounds). Initial
    hyperparameters come from fold 0's initial states; a fold statistic that is unusable
    (fewer than 2 finite chains, zero variance as when every chain starts at one point)
    leaves the hyperparameters where they were, initially the given sampler's.

    When a chain's preconditioner changes, its persistent momentum is rescaled by
    `sqrt(old / new)` before its next step, so it stays `N(0, M)`: the momentum of the
    preconditioned coordinates persists, and a growing preconditioner does not heat the
    chain up.

    Hyperparameters then differ by fold, so the tuned sampler is a plain `samplers.GHMC`
    whose `step_size`, `damping` and `inverse_mass_matrix` are `enn.PerChainValue`s (one
    entry per chain, its fold's; `(num_chains,)`, `(num_chains,)` and
    `(num_chains, dim)`): `samplers.run` can run it again with the same number of chains.
    The whole adaptation is one `while_loop` inside the run's `ensemble_map`.

    Attributes:
        num_steps: adaptation steps (each fold is held, and idle, one step in K).
        num_folds: K, at least 2; the ensemble needs at least 2 chains per fold.
        step_size_multiplier: step size times `sqrt(lambda_g)`.
        damping_slowdown: how slowly the early damping floor relaxes (larger: more
            damping for longer).
        bias_monitor: a `BiasMonitor` that `samplers.run(..., track_bias=True)` attaches
            (`with_bias_monitor`) to record b² after every step; None otherwise.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> target = samplers.targets.IllConditionedGaussian(dim=4, condition_number=10.0)
        >>> x0 = jax.random.normal(jax.random.key(1), (16, 4))
        >>> result = samplers.run(samplers.GHMC(step_size=0.1, damping=1.0), target, x0,
        ...                       key=jax.random.key(0), num_steps=50,
        ...                       adaptation=samplers.MEADS(num_steps=100), progress=False)
        >>> tuned = result.sampler
        >>> tuned.step_size.value.shape, tuned.inverse_mass_matrix.value.shape
        ((16,), (16, 4))
        >>> bool(jnp.all(tuned.step_size.value[0::4] == tuned.step_size.value[0]))  # fold 0
        True
    """

    num_steps: int = eqx.field(static=True, default=500)
    num_folds: int = eqx.field(static=True, default=4)
    step_size_multiplier: float = eqx.field(static=True, default=0.5)
    damping_slowdown: float = eqx.field(static=True, default=1.0)

    def __check_init__(self) -> None:
        for name, low in (("num_steps", 1), ("num_folds", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise enn.EnsembleError(f"MEADS {name} must be an int >= {low}, got {value!r}.")
        if not self.step_size_multiplier > 0:
            raise enn.EnsembleError(
                f"MEADS step_size_multiplier must be > 0, got {self.step_size_multiplier!r}."
            )
        if not self.damping_slowdown >= 0:
            raise enn.EnsembleError(
                f"MEADS damping_slowdown must be >= 0, got {self.damping_slowdown!r}."
            )

    @staticmethod
    def _ghmc(sampler: Sampler | None) -> GHMC:
        if sampler is None:
            return GHMC(step_size=0.1, damping=1.0)
        if not isinstance(sampler, GHMC):
            raise enn.EnsembleError(
                f"MEADS adapts a samplers.GHMC, got {type(sampler).__name__}.\n  fix: "
                "samplers.run(samplers.GHMC(step_size=0.1, damping=1.0), ..., "
                "adaptation=samplers.MEADS(...)), or pass sampler=None."
            )
        return sampler

    def initial_state(
        self, sampler: Sampler | None, logdensity: Logdensity, position: Array, key: PRNGKeyArray
    ) -> GHMCState:
        return self._ghmc(sampler).init(logdensity, position, key)

    def run(
        self, sampler: GHMC | None, logdensity: Logdensity, state: GHMCState, key: PRNGKeyArray
    ) -> tuple[GHMC, GHMCState, RestartInfo]:
        ghmc = self._ghmc(sampler)
        num_chains = enn.num_chains()
        if num_chains < 2 * self.num_folds:
            raise enn.EnsembleError(
                f"MEADS with num_folds={self.num_folds} needs at least {2 * self.num_folds} "
                f"chains (2 per fold), got {num_chains}.\n  fix: run more chains or "
                "lower num_folds."
            )
        dtype = jnp.result_type(state.position)
        shape = state.position.shape
        eps = resolve(ghmc.step_size, 0).astype(jnp.float32)
        if ghmc.damping is not None:
            gamma = resolve(ghmc.damping, 0).astype(jnp.float32)
        else:
            alpha = jnp.clip(resolve(ghmc.momentum_persistence, 0), 1e-6, 1 - 1e-6)
            gamma = (-jnp.log(alpha) / eps).astype(jnp.float32)
        imm = resolve(ghmc.inverse_mass_matrix, 0).astype(dtype)
        imm = jnp.diagonal(imm) if imm.ndim == 2 else jnp.broadcast_to(imm, shape)
        per_chain = GHMC(
            step_size=enn.PerChainValue(eps),
            damping=enn.PerChainValue(gamma),
            inverse_mass_matrix=enn.PerChainValue(imm.astype(dtype)),
            divergence_threshold=ghmc.divergence_threshold,
        )
        # Fixed start directions for the power iterations (identical in every chain).
        start = jax.random.normal(jax.random.key(0), shape, dtype)
        start = start / jnp.linalg.norm(start)
        directions = jnp.broadcast_to(start, (2, self.num_folds) + shape)
        kernel = _HeldFold(
            per_chain, jnp.int32(0), directions, jnp.ones(shape, dtype), self.num_folds
        )
        # Non-finite chains: excluded from the initial statistics, then restarted at healthy
        # chains' positions; once healthy, a GHMC chain never accepts a non-finite proposal.
        restart_key = random.fold_in(key, 2**31 - 1)  # not a step's fold_in(key, t)
        means, bad_before = finite_chain_mean(self.statistics(kernel, state, None))
        state, restarted = restart_unhealthy(
            per_chain, logdensity, state, random.fold_in(restart_key, 0)
        )
        # Step 0's hyperparameters come from the initial states of fold 0 (held in step 0).
        means, _ = finite_chain_mean(self.statistics(kernel, state, None))
        kernel, _ = self.update(kernel, None, means, jnp.int32(-1))
        kernel, state, info = super().run(kernel, logdensity, state, key)
        # The last update may have changed this chain's preconditioner after its last step.
        state = eqx.tree_at(lambda s: s.momentum, state, state.momentum * kernel.momentum_scale)
        state, info = restart_after_run(
            kernel.kernel, logdensity, state, random.fold_in(restart_key, 1), info,
            excluded_before=bad_before, restarted_before=restarted,
        )  # fmt: skip
        return kernel.kernel, state, info

    # -- the EnsembleAdaptation protocol ----------------------------------------------------

    def init_state(self, sampler: _HeldFold, state: GHMCState) -> None:
        return None

    def statistics(self, sampler: _HeldFold, state: GHMCState, info: Info | None) -> PyTree:
        fold = sampler.fold()
        x, g = state.position, state.grad
        onehot = (jnp.arange(self.num_folds) == fold).astype(x.dtype)
        u_x, u_g = sampler.directions[0, fold], sampler.directions[1, fold]
        # Fixed-order sums: the same bits for any number of chains per device.
        sx, sg = enn.ordered_sum(x * u_x), enn.ordered_sum(g * u_g)
        per_fold = lambda v: onehot.reshape(onehot.shape + (1,) * v.ndim) * v
        stats = {
            "w": onehot,
            "x": per_fold(x),
            "x2": per_fold(x**2),
            "sx": per_fold(sx),
            "sx2": per_fold(sx**2),
            "xsx": per_fold(x * sx),
            "g": per_fold(g),
            "g2": per_fold(g**2),
            "gx": per_fold(g * x),
            "sg2": per_fold(sg**2),
            "gsg": per_fold(g * sg),
        }
        # Healthy chains per fold: finite statistics and a finite state (a chain stuck where
        # the log density is -inf or NaN can have a finite x and gradient, and would
        # inflate its fold's variance). The others get NaN statistics, which the
        # cross-chain means leave out (and count).
        finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(v)) for v in jax.tree.leaves(stats)]))
        healthy = finite & is_healthy(state)
        stats["n"] = enn.chain_sum(onehot * healthy.astype(x.dtype))
        return jnp.where(healthy, pack(stats, self._layout(x.shape[-1])), jnp.nan)

    def _layout(self, dim: int) -> dict[str, tuple[int, ...]]:
        folds, vectors = (self.num_folds,), (self.num_folds, dim)
        return {
            "w": folds,
            "x": vectors,
            "x2": vectors,
            "sx": folds,
            "sx2": folds,
            "xsx": vectors,
            "g": vectors,
            "g2": vectors,
            "gx": vectors,
            "sg2": folds,
            "gsg": vectors,
            "n": folds,
        }

    def update(
        self, sampler: _HeldFold, adaptation_state: None, means: PyTree, step: Int[Array, ""]
    ) -> tuple[_HeldFold, None]:
        means = unpack(means, self._layout(sampler.directions.shape[-1]))
        est = _fold_estimates(means, sampler.directions, self.step_size_multiplier)
        held = ((step + 1) % self.num_folds).astype(jnp.int32)  # held during the next step
        directions = jnp.where(
            est["ok"][None, :, None],
            est["directions"].astype(sampler.directions.dtype),
            sampler.directions,
        )

        kernel = sampler.kernel
        eps = est["step_size"][held]
        # Persistence exp(-gamma eps) at most exp(-slowdown / (t + 1)) for the next step t.
        floor = self.damping_slowdown / (eps * (step + 2).astype(jnp.float32))
        gamma = jnp.maximum(est["damping"][held], floor)
        change = est["ok"][held] & (sampler.fold() != held)
        old_imm = kernel.inverse_mass_matrix.value
        new = (
            jnp.where(change, eps, kernel.step_size.value).astype(jnp.float32),
            jnp.where(change, gamma, kernel.damping.value).astype(jnp.float32),
            jnp.where(change, est["inverse_mass_matrix"][held].astype(old_imm.dtype), old_imm),
        )
        kernel = eqx.tree_at(
            lambda k: (k.step_size.value, k.damping.value, k.inverse_mass_matrix.value), kernel, new
        )
        scale = jnp.sqrt(old_imm / new[2]).astype(old_imm.dtype)
        return _HeldFold(kernel, held, directions, scale, self.num_folds), adaptation_state
