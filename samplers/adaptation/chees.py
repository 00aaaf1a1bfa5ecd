"""ChEES-HMC: HMC whose trajectory length is learnt by maximising the ChEES criterion.

Hoffman, Radul and Sountsov, "An Adaptive MCMC Scheme for Setting Trajectory Lengths in
Hamiltonian Monte Carlo" (AISTATS 2021). Many chains run the same jittered trajectory
length; after each transition the ensemble estimates the gradient of the ChEES criterion

    ChEES(T) = 1/4 E[(|x' - E x'|^2 - |x - E x|^2)^2]

(the expected squared change of the centered squared distance from the start `x` to the
proposal `x'`) with respect to the trajectory length `T`, and a user-given optax optimizer
takes one ascent step on `log T`. The step size follows dual averaging on the ensemble's
harmonic-mean acceptance probability, and the diagonal inverse mass matrix tracks the
cross-chain variance.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

import ensemblenn as enn

from .. import random
from ..integrators import value_and_grad, velocity
from ..kernels import (
    DIVERGENCE_THRESHOLD,
    HMC,
    GradientState,
    Info,
    Logdensity,
    Sampler,
    resolve,
)
from ._base import EnsembleAdaptation, finite_chain_mean
from ._dual_averaging import DualAveraging
from ._restart import RestartInfo, is_healthy, restart_after_run, restart_unhealthy

_DEFAULT_OPTIMIZER = optax.adam(0.025)
"""Adam on `log T` at learning rate 0.025 (one object, so default `ChEES()`s compare equal
and share their compilation)."""

_ACCEPTANCE_FLOOR = 1e-3
"""Acceptance probabilities are floored here before the harmonic mean (one rejected chain
then weighs like an acceptance of 1e-3 instead of sending the mean to exactly 0)."""

# Dual averaging constants (Hoffman and Gelman 2014, Nesterov 2009).


def pack(stats: dict[str, Array], layout: dict[str, tuple[int, ...]]) -> Array:
    """The statistics as one flat vector, in `layout` order.

    One vector means one cross-chain reduction per adaptation step instead of one per
    statistic, which keeps the compiled adaptation loop small.
    """
    dtype = jnp.result_type(*stats.values())
    parts = []
    for name, shape in layout.items():
        value = jnp.asarray(stats[name])
        assert value.shape == shape, (name, value.shape, shape)
        parts.append(jnp.ravel(value).astype(dtype))
    return jnp.concatenate(parts)


def unpack(flat: Array, layout: dict[str, tuple[int, ...]]) -> dict[str, Array]:
    """Inverse of `pack`."""
    out, start = {}, 0
    for name, shape in layout.items():
        size = math.prod(shape)
        out[name] = flat[start : start + size].reshape(shape)
        start += size
    return out


def van_der_corput(index: Int[Array, ""]) -> Float[Array, ""]:
    """The base-2 radical inverse of a non-negative integer: the 1-D Halton sequence.

    Successive indices fill `[0, 1)` evenly (0.5, 0.25, 0.75, 0.125, ...), so a jitter
    drawn from it averages out faster than i.i.d. uniforms, and it is the same in every
    chain without sharing a key.

    Example:
        >>> import jax.numpy as jnp
        >>> from samplers.adaptation.chees import van_der_corput
        >>> [float(van_der_corput(jnp.int32(i))) for i in range(1, 5)]
        [0.5, 0.25, 0.75, 0.125]
    """
    index = jnp.asarray(index, jnp.uint32)
    powers = jnp.arange(32, dtype=jnp.uint32)
    bits = (index >> powers) & jnp.uint32(1)
    return jnp.sum(bits.astype(jnp.float32) * jnp.exp2(-(powers.astype(jnp.float32) + 1)))


class _ChEESInfo(Info):
    """`Info` plus what the ChEES gradient needs from the transition (one chain)."""

    start: Float[Array, " dim"]
    proposal: Float[Array, " dim"]
    velocity: Float[Array, " dim"]
    time_scale: Float[Array, ""]
    start_healthy: Bool[Array, ""]


class _ChEESKernel(HMC):
    """HMC as ChEES runs it during adaptation: a trajectory of (jittered) length `T`.

    The jitter factor `h` is the same in every chain (a Halton sequence of the step count),
    so every chain integrates `ceil(h T / step_size)` leapfrog steps, capped at
    `max_num_steps` (`num_steps`, overridden). The step reports the start, the proposal and
    its velocity (through `HMC.transition`). Built with `_ChEESKernel.of`.
    """

    trajectory_length: Float[Array, ""] = eqx.field(kw_only=True)
    averaged_step_size: Float[Array, ""] = eqx.field(kw_only=True)
    time_jitter: float = eqx.field(static=True, kw_only=True)  # h in [1 - it, 1 + it)
    max_num_steps: int = eqx.field(static=True, kw_only=True)

    @classmethod
    def of(
        cls,
        step_size: Array,
        trajectory_length: Array,
        inverse_mass_matrix: Array,
        averaged_step_size: Array,
        time_jitter: float,
        max_num_steps: int,
        divergence_threshold: float,
    ) -> "_ChEESKernel":
        return cls(
            step_size,
            1,  # num_integration_steps: unused, `num_steps` follows the trajectory length
            inverse_mass_matrix,
            jitter=False,
            divergence_threshold=divergence_threshold,
            trajectory_length=trajectory_length,
            averaged_step_size=averaged_step_size,
            time_jitter=time_jitter,
            max_num_steps=max_num_steps,
        )

    def time_scale(self, count: Int[Array, ""]) -> Float[Array, ""]:
        """`h` in `[1 - jitter, 1 + jitter)`, mean 1: the trajectory is `h * T` long."""
        u = van_der_corput(count + 1)
        return 1.0 - self.time_jitter + 2.0 * self.time_jitter * u

    def num_steps(self, count: Int[Array, ""], key: PRNGKeyArray | None) -> Int[Array, ""]:
        length = self.time_scale(count) * self.trajectory_length / self.step_size
        return jnp.clip(jnp.ceil(length), 1, self.max_num_steps).astype(jnp.int32)

    def step(
        self, logdensity: Logdensity, state: GradientState, key: PRNGKeyArray
    ) -> tuple[GradientState, _ChEESInfo]:
        key_momentum, key_accept = random.split(key)  # the length needs no key
        new, info, end = self.transition(logdensity, state, key_momentum, None, key_accept)
        fields = ("acceptance_rate", "is_divergent", "num_grads", "energy_change", "step_size")
        info = _ChEESInfo(
            **{f: getattr(info, f) for f in fields},
            start=state.position,
            proposal=end.position,
            velocity=velocity(end.momentum, self.inverse_mass_matrix),
            time_scale=jnp.asarray(self.time_scale(state.count), jnp.float32),
            start_healthy=is_healthy(state),
        )
        return new, info


class _ChEESState(eqx.Module):
    log_trajectory_length: Float[Array, ""]
    optimizer_state: PyTree
    dual_averaging: DualAveraging


class ChEES(EnsembleAdaptation):
    """ChEES-HMC: learn the trajectory length of `samplers.HMC` across the ensemble.

    Each adaptation step every chain runs one HMC transition with the current step size
    `eps`, trajectory length `T` and diagonal inverse mass matrix. The trajectory is
    jittered: its length is `h_t T` with `h_t = 1 - jitter + 2 jitter u_t`, `u_t` the
    Halton (van der Corput) sequence of the step index, identical in every chain, so all
    chains integrate `ceil(h_t T / eps)` leapfrog steps (at most `max_num_steps`). Then:

    * **trajectory length**: with `c`, `c'` the ensemble means of the starts `x` and of the
      proposals `x'` (the latter weighted by the acceptance probabilities `a`), each chain's
      gradient of the ChEES criterion with respect to `log T` is
      `g = T h_t (|x' - c'|^2 - |x - c|^2) (x' - c') . v'`, `v' = M^{-1} p'` the velocity
      at the end of the trajectory. The ensemble gradient is the acceptance-weighted mean
      `sum a g / sum a`, divided by `S^2`, `S` the larger of `E|x - c|^2` and
      `E_a|x' - c'|^2` (chains started at one point have no spread before their first
      move). This makes it dimensionless: the criterion is rescaled by a positive
      constant, which does not move its maximum but makes plain SGD learning rates
      independent of the target's scale. `optimizer` takes one step on `log T` with minus
      that gradient; `T` is then kept in `[eps, max_num_steps * eps]`.
    * **step size**: dual averaging (Hoffman and Gelman 2014) of `log eps` towards
      `target_acceptance` of the ensemble's harmonic-mean acceptance probability
      `1 / mean(1 / a)`, which chains with low acceptance pull down; the tuned sampler
      gets the averaged iterate.
    * **mass matrix** (`mass_matrix=True`): the diagonal inverse mass matrix is an
      exponential moving average, with rate `mass_matrix_rate` per step, of the cross-chain
      variance of the positions.

    Every statistic is a cross-chain mean over the chains whose statistics are finite
    and whose state before the step was finite (log density, gradient and `x^2`;
    `finite_chain_mean`): such a chain is left out and counted in
    `adaptation_info.num_excluded` (a `RestartInfo`). A chain that is not finite before
    the adaptation (it starts outside the support, or at a NaN) is counted there too and
    restarted at a healthy chain's position (round robin, a fresh `init` there); so is
    any chain still not finite after it (`num_restarted` counts both).
    The hyperparameters and the optax state are computed from these means, so they are
    identical in every chain (broadcast); the whole adaptation is one `while_loop` inside
    the run's `ensemble_map`, with no host sync.

    `samplers.run` returns the tuned `samplers.HMC`: `step_size` (the averaged step size),
    `num_integration_steps = T / step_size` as a float array (HMC rounds it, so
    `step_size * num_integration_steps` is the learnt trajectory length exactly),
    `inverse_mass_matrix` a `(dim,)` array, all broadcast, and `jitter=True` when
    `jitter > 0` (HMC's own jitter: uniform on `1 .. 2n - 1` steps, mean `n`).

    Attributes:
        optimizer: any `optax.GradientTransformation` for `log T`, learning-rate schedules
            included (its state is part of the adaptation state). Adam with learning rate
            0.025 works well; the gradient it sees is dimensionless, so e.g.
            `optax.sgd(optax.exponential_decay(0.05, 100, 0.5))` is reasonable too.
        num_steps: adaptation steps.
        target_acceptance: the harmonic-mean acceptance dual averaging aims at.
        initial_step_size: `eps` at the start (default: the sampler's `step_size`, or 0.1
            without a sampler).
        initial_trajectory_length: `T` at the start (default: the sampler's
            `step_size * num_integration_steps`, or the initial step size).
        jitter: in `[0, 1]`; 1 draws trajectory lengths over `(0, 2T)`, 0 never jitters.
        max_num_steps: cap on the leapfrog steps of one transition.
        mass_matrix: adapt a diagonal inverse mass matrix (otherwise the sampler's is kept).
        mass_matrix_rate: weight of the newest cross-chain variance in the moving average.
        bias_monitor: a `BiasMonitor` that `samplers.run(..., track_bias=True)` attaches
            (`with_bias_monitor`) to record b² after every step; None otherwise.

    Example:
        >>> import jax, jax.numpy as jnp, optax, samplers
        >>> target = samplers.targets.IllConditionedGaussian(dim=4, condition_number=10.0)
        >>> adaptation = samplers.ChEES(optax.adam(0.05), num_steps=100)
        >>> kernel = samplers.HMC(step_size=0.1, num_integration_steps=2)
        >>> result = samplers.run(kernel, target, jnp.zeros((16, 4)), key=jax.random.key(0),
        ...                       num_steps=50, adaptation=adaptation, progress=False)
        >>> tuned = result.sampler
        >>> type(tuned).__name__, tuned.inverse_mass_matrix.shape, tuned.jitter
        ('HMC', (4,), True)
        >>> bool(tuned.step_size * tuned.num_integration_steps > 0.2)  # T grew from 0.2
        True
    """

    optimizer: optax.GradientTransformation = eqx.field(static=True, default=_DEFAULT_OPTIMIZER)
    num_steps: int = eqx.field(static=True, default=500)
    target_acceptance: float = eqx.field(static=True, default=0.651)
    initial_step_size: float | None = eqx.field(static=True, default=None)
    initial_trajectory_length: float | None = eqx.field(static=True, default=None)
    jitter: float = eqx.field(static=True, default=1.0)
    max_num_steps: int = eqx.field(static=True, default=1000)
    mass_matrix: bool = eqx.field(static=True, default=True)
    mass_matrix_rate: float = eqx.field(static=True, default=0.05)

    def __check_init__(self) -> None:
        if not (hasattr(self.optimizer, "init") and hasattr(self.optimizer, "update")):
            raise enn.EnsembleError(
                f"ChEES needs an optax.GradientTransformation as optimizer, got "
                f"{type(self.optimizer).__name__}.\n  fix: samplers.ChEES(optax.adam(0.025))"
            )
        if not 0.0 <= self.jitter <= 1.0:
            raise enn.EnsembleError(f"ChEES jitter must be in [0, 1], got {self.jitter!r}.")
        if not 0.0 < self.target_acceptance < 1.0:
            raise enn.EnsembleError(
                f"ChEES target_acceptance must be in (0, 1), got {self.target_acceptance!r}."
            )
        if not 0.0 < self.mass_matrix_rate <= 1.0:
            raise enn.EnsembleError(
                f"ChEES mass_matrix_rate must be in (0, 1], got {self.mass_matrix_rate!r}."
            )
        for name in ("num_steps", "max_num_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise enn.EnsembleError(f"ChEES {name} must be an int >= 1, got {value!r}.")

    # -- setting up ------------------------------------------------------------------------

    def _check_sampler(self, sampler: Sampler | None) -> None:
        if sampler is not None and not isinstance(sampler, HMC):
            raise enn.EnsembleError(
                f"ChEES adapts a samplers.HMC, got {type(sampler).__name__}.\n  fix: "
                "samplers.run(samplers.HMC(step_size=0.1, num_integration_steps=10), ..., "
                "adaptation=samplers.ChEES(...)), or pass sampler=None."
            )

    def _initial(self, sampler: HMC | None) -> tuple[Array, Array]:
        """Initial `(step_size, trajectory_length)` as float32 arrays (per chain)."""
        if self.initial_step_size is not None:
            eps = jnp.asarray(self.initial_step_size, jnp.float32)
        elif sampler is not None:
            eps = resolve(sampler.step_size, 0).astype(jnp.float32)
        else:
            eps = jnp.float32(0.1)
        if self.initial_trajectory_length is not None:
            length = jnp.asarray(self.initial_trajectory_length, jnp.float32)
        elif sampler is not None:
            n = jnp.maximum(jnp.round(resolve(sampler.num_integration_steps, 0)), 1)
            length = eps * n.astype(jnp.float32)
        else:
            length = eps
        return eps, length

    def initial_state(
        self, sampler: Sampler | None, logdensity: Logdensity, position: Array, key: PRNGKeyArray
    ) -> GradientState:
        self._check_sampler(sampler)
        position = jnp.asarray(position)
        logp, grad = value_and_grad(logdensity)(position)
        return GradientState(position, logp, jnp.int32(0), grad)

    def run(
        self, sampler: HMC | None, logdensity: Logdensity, state: GradientState, key: PRNGKeyArray
    ) -> tuple[HMC, GradientState, RestartInfo]:
        self._check_sampler(sampler)
        eps, length = self._initial(sampler)
        dtype = jnp.result_type(state.position)
        imm = jnp.ones(state.position.shape, dtype)
        threshold = DIVERGENCE_THRESHOLD
        if sampler is not None:
            threshold = sampler.divergence_threshold
            given = resolve(sampler.inverse_mass_matrix, 0).astype(dtype)
            if given.ndim <= 1:
                imm = jnp.broadcast_to(given, state.position.shape).astype(dtype)
            elif not self.mass_matrix:
                imm = given  # a dense matrix, kept as is
            else:
                imm = jnp.diagonal(given)
        kernel = _ChEESKernel.of(
            eps,
            jnp.maximum(length, eps),
            imm,
            eps,
            float(self.jitter),
            self.max_num_steps,
            threshold,
        )
        # Non-finite chains: excluded from the first step's means, then restarted at healthy
        # chains' positions; once healthy, an HMC chain never accepts a non-finite proposal.
        restart_key = random.fold_in(key, 2**31 - 1)  # not a step's fold_in(key, t)
        bad_before = enn.chain_sum((~is_healthy(state)).astype(jnp.int32))
        state, restarted = restart_unhealthy(
            kernel, logdensity, state, random.fold_in(restart_key, 0)
        )
        kernel, state, info = super().run(kernel, logdensity, state, key)
        tuned = HMC(
            step_size=kernel.averaged_step_size,
            num_integration_steps=kernel.trajectory_length / kernel.averaged_step_size,
            inverse_mass_matrix=kernel.inverse_mass_matrix,
            jitter=self.jitter > 0,
            divergence_threshold=threshold,
        )
        state, info = restart_after_run(
            tuned, logdensity, state, random.fold_in(restart_key, 1), info,
            excluded_before=bad_before, restarted_before=restarted,
        )  # fmt: skip
        return tuned, state, info

    # -- the EnsembleAdaptation protocol ----------------------------------------------------

    def init_state(self, sampler: _ChEESKernel, state: GradientState) -> _ChEESState:
        log_length = jnp.log(sampler.trajectory_length)
        log_eps = jnp.log(sampler.step_size)
        averaging = DualAveraging(log_eps, log_eps, jnp.float32(0.0), jnp.log(10.0) + log_eps)
        return _ChEESState(log_length, self.optimizer.init(log_length), averaging)

    def statistics(self, sampler: _ChEESKernel, state: GradientState, info: _ChEESInfo) -> PyTree:
        a = info.acceptance_rate
        # A rejected proposal moves nothing: zero it so that an overflowing proposal of a
        # healthy chain does not exclude the chain from the means.
        x1 = jnp.where(a > 0, info.proposal, info.start)
        v1 = jnp.where(a > 0, info.velocity, jnp.zeros_like(info.velocity))
        x0 = info.start
        dim = x0.shape
        layout = {"x0": dim, "x0sq": dim, "ax1": dim, "ax1sq": dim, "a": ()}
        # A chain that started the step non-finite (its log density, gradient or x^2) is
        # left out of every mean: NaN statistics are what finite_chain_mean excludes.
        nan_unless_healthy = lambda v: jnp.where(info.start_healthy, v, jnp.nan)
        centers, _ = finite_chain_mean(
            nan_unless_healthy(
                pack({"x0": x0, "x0sq": x0**2, "ax1": a * x1, "ax1sq": a * x1**2, "a": a}, layout)
            )
        )
        centers = unpack(centers, layout)
        c0 = centers["x0"]
        weight = jnp.maximum(centers["a"], 1e-12)
        c1 = centers["ax1"] / weight
        # The ensemble's spread (before or after the move, whichever is larger: chains
        # started at one point have none before) sets the scale of the criterion.
        # Sums over dimensions in one fixed order (enn.ordered_sum), and products rounded
        # before a subtraction: XLA would otherwise round them differently for another
        # number of chains per device, and the tuned values would depend on the device count.
        spread = jnp.maximum(
            enn.ordered_sum(centers["x0sq"] - enn.rounded(c0**2)),
            enn.ordered_sum(centers["ax1sq"] / weight - enn.rounded(c1**2)),
        )
        spread = jnp.maximum(spread, 1e-15)
        d0 = enn.ordered_sum((x0 - c0) ** 2)
        d1 = enn.ordered_sum((x1 - c1) ** 2)
        grad_log_t = (
            sampler.trajectory_length
            * info.time_scale
            * (d1 - d0)
            * enn.ordered_sum((x1 - c1) * v1)
        )
        grad_log_t = grad_log_t / spread**2
        x = state.position
        stats = {
            "one": jnp.float32(1.0),
            "a": a,
            "a_grad": a * grad_log_t,
            "inverse_a": 1.0 / jnp.maximum(a, _ACCEPTANCE_FLOOR),
            "x": x,
            "x2": x**2,
            "start2": x0**2,  # a start overflowing to inf marks the chain as diverging
        }
        return nan_unless_healthy(pack(stats, self._layout(x.shape[-1])))

    @staticmethod
    def _layout(dim: int) -> dict[str, tuple[int, ...]]:
        scalar, vector = (), (dim,)
        return {
            "one": scalar,
            "a": scalar,
            "a_grad": scalar,
            "inverse_a": scalar,
            "x": vector,
            "x2": vector,
            "start2": vector,
        }

    def update(
        self,
        sampler: _ChEESKernel,
        adaptation_state: _ChEESState,
        means: PyTree,
        step: Int[Array, ""],
    ) -> tuple[_ChEESKernel, _ChEESState]:
        means = unpack(means, self._layout(sampler.inverse_mass_matrix.shape[-1]))
        valid = means["one"] > 0  # False only if every chain diverged: then change nothing
        grad = means["a_grad"] / jnp.maximum(means["a"], 1e-12)
        harmonic = 1.0 / jnp.maximum(means["inverse_a"], 1.0)

        log_length = adaptation_state.log_trajectory_length
        updates, opt_state = self.optimizer.update(
            -grad, adaptation_state.optimizer_state, log_length
        )
        new_log_length = optax.apply_updates(log_length, updates)
        averaging = adaptation_state.dual_averaging.update(
            harmonic, self.target_acceptance, step + 1
        )
        log_eps = averaging.log_step_size
        new_log_length = jnp.clip(new_log_length, log_eps, log_eps + math.log(self.max_num_steps))

        imm = sampler.inverse_mass_matrix
        if self.mass_matrix and imm.ndim == 1:
            var = means["x2"] - means["x"] ** 2
            ok = valid & jnp.all(var > 0) & jnp.all(jnp.isfinite(var))
            new_imm = (1 - self.mass_matrix_rate) * imm + self.mass_matrix_rate * var
            imm = jnp.where(ok, new_imm.astype(imm.dtype), imm)

        new_state = _ChEESState(new_log_length, opt_state, averaging)
        new_state = jax.tree.map(lambda n, o: jnp.where(valid, n, o), new_state, adaptation_state)
        kernel = _ChEESKernel.of(
            jnp.exp(new_state.dual_averaging.log_step_size).astype(jnp.float32),
            jnp.exp(new_state.log_trajectory_length).astype(jnp.float32),
            imm,
            jnp.exp(new_state.dual_averaging.log_averaged).astype(jnp.float32),
            sampler.time_jitter,
            sampler.max_num_steps,
            sampler.divergence_threshold,
        )
        return kernel, new_state
