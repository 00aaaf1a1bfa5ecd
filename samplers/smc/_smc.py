"""`samplers.SMC`: adaptive tempered Sequential Monte Carlo with resample-move."""

import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray, PyTree

import ensemblenn as enn

from .. import random
from .._errors import SamplerError, SamplerTypeError
from ..kernels import Sampler
from ._checkpoint import StageStore, fingerprint, saved_stage
from ._history import History
from ._particles import Particles, Tempered
from ._progress import StageProgress
from ._result import SMCResult
from ._schedule import increment, next_delta
from ._stage import Evaluate, Move, MoveChains, Resample, ResampleChains
from ._tuning import (
    Metric,
    check_metric,
    initial_step_size,
    metric_mode,
    next_step_size,
    tunes_step_size,
    with_tuning,
)
from ._validate import (
    check_callable,
    check_density,
    check_fields,
    check_initial,
    check_key,
    check_not_traced,
    check_particles,
    check_waste_free_run,
    split_target,
)


def _as_schedule(value: Any) -> Any:
    """A list or array of temperatures as a tuple of floats (a static field must hash);
    anything else is left for `__check_init__` to explain."""
    if value is None or isinstance(value, str):
        return value
    try:
        return tuple(float(v) for v in np.asarray(value, np.float64).reshape(-1))
    except (TypeError, ValueError):
        return value


class SMC(eqx.Module):
    """Adaptive tempered Sequential Monte Carlo with resample-move, over sharded particles.

    From draws of the prior (`beta = 0`) to the posterior (`beta = 1`) through the tempered
    targets `prior(x) L(x)^beta`. At each stage the next temperature is found by bisection
    so that the incremental weights `L^(beta' - beta)` keep an ESS of `target_ess * N`
    (or taken from a fixed `schedule`); the particles are reweighted, resampled
    (`samplers.smc.resample`, across devices) and moved by `num_mutation_steps` steps of
    any `samplers.Sampler` targeting the new tempered distribution. The kernel is tuned at
    every stage from the population: its metric (`inverse_mass_matrix`, or a random walk's
    per-coordinate scale) is the resampled particles' variance (`metric="diagonal"`) or
    covariance (`"dense"`), and the step size of a Metropolis-adjusted kernel moves once
    per stage towards `target_acceptance` from the previous stage's mean acceptance
    (`eps * exp(acceptance - target)`). With `waste_free=P`, waste-free SMC instead: `N / P`
    particles are resampled and each runs a chain of `P` states, all kept as particles.

    The evidence: `log Z = sum_t log(mean_i w_i^t)`, the log of the standard unbiased
    estimate of `Z`. Its standard error is a genealogy (Eve-index) estimate, in the spirit
    of Lee & Whiteley (2018), of the first-order expansion
    `log Z_hat - log Z ~ sum_t sum_i r_i^t / N`, `r_i^t = w_i^t / mean_i w^t - 1`: the
    terms are summed over the stages within each lineage (the particles that descend
    from one initial particle, its Eve), and the lineages' totals squared and added,
    `se^2 = sum_k (sum_t sum_{i: Eve(i) = k} r_i^t / N)^2`. Lineages are independent
    given the initial draws, while the moves leave a lineage's particles correlated
    within and across stages, which this counts; for independent particles it is
    `sum_t (N / ESS_t - 1) / N`. Measured over seeds it is within a factor 1.5 of the
    spread of `log Z` (above it with well-mixed moves, systematic resampling being better
    than independent draws), and it is unreliable once few lineages survive (the
    verdict says so: `SMCResult.num_lineages`). log Z is relative to the prior's
    normalisation: it is the log marginal likelihood only when `log_prior` is a
    normalised density (NumPyro priors are) and the particles are draws from it.

    Every stage is one `enn.ensemble_map` program (compiled once, reused at every
    temperature); the host only picks temperatures and step sizes from `N` log
    likelihoods per stage, in float64 numpy. With `block_size` the whole run is the same
    bits on any number of devices.

    Attributes:
        kernel: the mutation kernel (any `samplers.Sampler`).
        num_mutation_steps: kernel steps per particle and stage (with `waste_free`, between
            consecutive states of a chain).
        target_ess: the fraction of `N` each reweighting keeps as ESS (adaptive schedule).
        schedule: fixed temperatures (increasing, in (0, 1], ending at 1) instead of the
            adaptive ones; None: adaptive.
        resampling: "systematic" (default), "stratified", "multinomial" or "residual".
        metric: "diagonal" (default), "dense" or None (keep the kernel's own).
        target_acceptance: the acceptance the step size is tuned to; None takes the
            kernel's `default_target_acceptance`. Unadjusted kernels keep their step size.
        max_stages: the most stages an adaptive schedule may take (a schedule that stalls
            stops there: `SMCResult.verdict` says so).
        decorrelation: None (the default) runs `num_mutation_steps` per stage. A number in
            (0, 1) runs rounds of `num_mutation_steps` until the particles' correlation
            with where the stage's moves started (Pearson, across particles, the largest
            over coordinates) is at most this, or `max_mutation_steps` ran.
        max_mutation_steps: the most steps per stage with `decorrelation`.
        waste_free: None (the default) resamples all `N` particles and moves each one.
            An int `P >= 2` (dividing `N`) runs waste-free SMC (Dau & Chopin 2022): only
            `M = N / P` particles are resampled, each starts a chain of `P` states, each
            state `num_mutation_steps` kernel steps after the one before, and every state
            of every chain is kept: the `M` chains' paths are the next `N` particles. A
            stage takes `(P - 1) / P` of the kernel steps of resample-move with the same
            `num_mutation_steps`, spent on longer chains from fewer starts; the weights and
            log Z use all `N` particles as before. The metric is the `M` starts' (keep `M`
            well above the dimension for "dense"). Not with `decorrelation`; `M` must be a
            multiple of the device count.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> log_prior = lambda x: -0.5 * jnp.sum(x**2) - jnp.log(2 * jnp.pi)   # N(0, I), 2-d
        >>> log_likelihood = lambda x: -0.5 * jnp.sum((x - 1.0) ** 2) - jnp.log(2 * jnp.pi)
        >>> particles = jax.random.normal(jax.random.key(0), (256, 2))
        >>> smc = samplers.SMC(samplers.MALA(step_size=0.5), num_mutation_steps=5)
        >>> result = smc.run(log_prior, log_likelihood, particles, key=jax.random.key(1))
        >>> exact = -jnp.log(4 * jnp.pi) - 0.5   # log N(1; 0, 2 I) in 2-d
        >>> bool(abs(result.log_evidence - exact) < 4 * result.log_evidence_se)
        True
        >>> result.particles.shape, float(result.temperatures[-1])
        ((256, 2), 1.0)
    """

    kernel: Sampler
    num_mutation_steps: int = eqx.field(static=True, default=10)
    target_ess: float = eqx.field(static=True, default=0.5)
    schedule: tuple[float, ...] | None = eqx.field(
        static=True, default=None, converter=_as_schedule
    )
    resampling: Literal["systematic", "stratified", "multinomial", "residual"] = eqx.field(
        static=True, default="systematic"
    )
    metric: Metric = eqx.field(static=True, default="diagonal")
    target_acceptance: float | None = eqx.field(static=True, default=None)
    max_stages: int = eqx.field(static=True, default=1000)
    decorrelation: float | None = eqx.field(static=True, default=None)
    max_mutation_steps: int = eqx.field(static=True, default=100)
    waste_free: int | None = eqx.field(static=True, default=None)

    def __check_init__(self) -> None:
        check_fields(self)

    @staticmethod
    def saved_stages(checkpoint_dir: str | os.PathLike | None) -> int | None:
        """How many stages the SMC checkpoint in `checkpoint_dir` holds (None if there is
        none, or it cannot be read), e.g. to say where `run(..., resume=True)` will go on.

        Example:
            >>> import tempfile, samplers
            >>> samplers.SMC.saved_stages(tempfile.mkdtemp()) is None
            True
        """
        return saved_stage(checkpoint_dir)

    def acceptance_target(self) -> float:
        """The acceptance the step size is tuned to."""
        if self.target_acceptance is not None:
            return float(self.target_acceptance)
        return float(type(self.kernel).default_target_acceptance)

    def next_temperature(self, log_likelihood: np.ndarray, beta: float, stage: int) -> float:
        """The temperature after `beta` at `stage` (0-based): from the schedule, or by
        bisection on the incremental weights' ESS. Override to change the rule."""
        if self.schedule is not None:
            return float(self.schedule[stage])
        delta = next_delta(log_likelihood, beta, self.target_ess)
        return 1.0 if beta + delta >= 1.0 else beta + delta

    def run(
        self,
        log_prior: Callable[[PyTree], Float[Array, ""]] | Any,
        log_likelihood: Callable[[PyTree], Float[Array, ""]] | None,
        particles: PyTree,
        *,
        key: PRNGKeyArray,
        mesh: Any = None,
        axis: str = "chains",
        block_size: int | Literal["auto"] | None = None,
        progress: bool | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        resume: bool = False,
    ) -> SMCResult:
        """Move `particles` from the prior to the posterior; estimate the evidence.

        Args:
            log_prior: the log prior density of ONE particle's pytree (normalised, for
                log Z to be the log marginal likelihood).
            log_likelihood: the log likelihood of one particle's pytree (`-inf` where it
                is zero; NaN or `+inf` is an error). None: `log_prior` is a target with
                `log_prior` and `log_likelihood` methods, such as
                `samplers.targets.from_numpyro(model, ...)`'s.
            particles: draws from the prior: any pytree of floating arrays with a leading
                particle axis (`N` particles, a multiple of the device count).
            key: the run's PRNG key.
            mesh: the mesh (default: `jax.set_mesh`'s, else all devices).
            axis: the mesh axis the particles are sharded over.
            block_size: `None` runs each device's particles in one batch (fastest; equal
                to rounding across device counts); an int or `"auto"` is the bitwise mode
                of `samplers.run` (`enn.batch_invariant` blocks): the same bits on any
                device count.
            progress: show a progress bar over the temperature, with each stage's ESS,
                acceptance and the running log Z (default: when stderr is a terminal).
            checkpoint_dir: a folder to save the run in after every stage
                (`DIR/smc.npz`, written atomically), so that it can be resumed; None
                saves nothing. One process only.
            resume: continue from the checkpoint in `checkpoint_dir` if there is one
                (else start afresh): the result is bitwise the uninterrupted run's on the
                same device count. A checkpoint of another configuration raises
                `samplers.CheckpointMismatchError`; with resume=False an existing one
                raises `samplers.CheckpointError`.

        Returns:
            A `samplers.SMCResult`.

        Raises:
            samplers.SamplerTypeError: called under `jax.jit` (the stages are a host loop;
                call it outside).
            samplers.SamplerError: bad arguments (before anything compiles); a log prior
                that is not finite or a log likelihood that is NaN/+inf at an initial
                particle, or every weight zero at a stage (before that stage runs).
        """
        check_not_traced(particles, key)
        if progress is not None and not isinstance(progress, bool):
            raise SamplerTypeError(
                f"SMC.run: progress must be None, True or False, got {progress!r}.\n  fix: "
                "progress=False."
            )
        if log_likelihood is None:  # a target that splits its own density
            log_prior, log_likelihood = split_target(log_prior)
        check_callable("log_prior", log_prior)
        check_callable("log_likelihood", log_likelihood)
        check_key(key)
        if not isinstance(resume, bool):
            raise SamplerTypeError(f"SMC.run: resume must be True or False, got {resume!r}.")
        store = None if checkpoint_dir is None else StageStore(checkpoint_dir, resume=resume)
        structure = Particles.of(particles)
        check_particles(structure)
        check_density("log_prior", log_prior, structure)
        check_density("log_likelihood", log_likelihood, structure)
        chains = structure.num_particles
        if self.waste_free is not None:
            chains = check_waste_free_run(self, structure.num_particles, mesh, axis)
        self.kernel.check_dim(structure.dim, chains)
        check_metric(self.kernel, self.metric)
        x = structure.ravel(particles)
        if store is not None:
            functions = (log_prior, log_likelihood)
            store.fingerprint = fingerprint(self, structure, functions, np.asarray(x), key)
        show = sys.stderr.isatty() if progress is None else progress
        bar = StageProgress(enabled=show and jax.process_index() == 0)
        runner = _Runner(self, structure, log_prior, log_likelihood, mesh, axis, block_size)
        try:
            return runner.go(x, key, bar, store)
        finally:
            bar.close()


class _Runner:
    """The host loop over stages (one run's mutable bookkeeping)."""

    def __init__(self, smc: SMC, structure: Particles, log_prior: Any, log_likelihood: Any,
                 mesh: Any, axis: str, block_size: Any):  # fmt: skip
        self.smc, self.structure = smc, structure
        self.log_prior, self.log_likelihood = log_prior, log_likelihood
        mapping = dict(mesh=mesh, axis=axis, block_size=block_size)
        self.evaluate = enn.ensemble_map(Evaluate(), in_roles=(enn.PER_CHAIN, None), **mapping)
        self.mode = metric_mode(smc.kernel, smc.metric)
        metric = smc.metric if self.mode else None
        moves = (enn.PER_CHAIN, None, None, enn.BROADCAST)
        if smc.waste_free is None:
            self.resample = enn.ensemble_map(
                Resample(smc.resampling, metric),
                in_roles=(enn.PER_CHAIN, enn.PER_CHAIN, enn.BROADCAST), **mapping,
            )  # fmt: skip
            self.move = enn.ensemble_map(Move(smc.num_mutation_steps), in_roles=moves,
                                         **mapping)  # fmt: skip
        else:  # ensembles of the M = N / P chains
            self.resample = enn.ensemble_map(
                ResampleChains(smc.resampling, metric), in_roles=(enn.PER_CHAIN, enn.BROADCAST,
                enn.BROADCAST, enn.BROADCAST), **mapping,
            )  # fmt: skip
            self.move = enn.ensemble_map(
                MoveChains(smc.num_mutation_steps, smc.waste_free), in_roles=moves, **mapping
            )
            self.slots = jnp.arange(structure.num_particles // smc.waste_free, dtype=jnp.int32)

    def tempered(self, beta: float) -> Tempered:
        return Tempered(self.log_prior, self.log_likelihood, self.structure,
                        jnp.asarray(beta, self.structure.dtype))  # fmt: skip

    def mutate(
        self, x: Array, kernel: Sampler, beta: float, key: PRNGKeyArray, log: History
    ) -> tuple[Array, Array, Array, np.ndarray]:
        """Rounds of `num_mutation_steps` moves: one, or (with `decorrelation`) until the
        particles have decorrelated from where they started. Returns the particles, their
        log prior and likelihood, and each particle's mean acceptance."""
        smc = self.smc
        start = None if smc.decorrelation is None else np.asarray(x, np.float64)
        accepted, steps, correlation = 0.0, 0, np.nan
        while True:
            k = random.fold_in(key, steps)
            x, lp, ll, acc = self.move(x, kernel, self.tempered(beta), k)
            accepted = accepted + np.asarray(acc, np.float64)
            steps += smc.num_mutation_steps
            if start is None:
                break
            correlation = _correlation(start, np.asarray(x, np.float64))
            if correlation <= smc.decorrelation or steps >= smc.max_mutation_steps:
                break
        log.mutation_steps.append(steps)
        log.correlations.append(correlation)
        return x, lp, ll, accepted / steps

    def resample_move(
        self, x: Array, log_w: np.ndarray, kernel: Sampler, eps: Array, beta: float,
        key: PRNGKeyArray, log: History,
    ) -> tuple[Array, Array, Array, Array, Array | None, Sampler, np.ndarray]:  # fmt: skip
        """One stage's resampling and moves: `(x, log prior, log likelihood, each new
        particle's ancestor, the metric, the tuned kernel, the acceptances)`."""
        smc = self.smc
        k_resample, k_move = random.split(key)
        lw = jnp.asarray(log_w, x.dtype)
        if smc.waste_free is None:
            x, ancestor, metric = self.resample(x, lw, k_resample)
            tuned = with_tuning(kernel, eps, metric, self.mode)
            x, lp, ll, acceptance = self.mutate(x, tuned, beta, k_move, log)
            return x, lp, ll, ancestor, metric, tuned, acceptance
        starts, chain_ancestor, metric = self.resample(self.slots, x, lw, k_resample)
        tuned = with_tuning(kernel, eps, metric, self.mode)
        path, lp, ll, accepted = self.move(starts, tuned, self.tempered(beta), k_move)
        steps = (smc.waste_free - 1) * smc.num_mutation_steps
        log.mutation_steps.append(steps)
        log.correlations.append(np.nan)
        # The M chains' P states, chain after chain, are the next N particles (each
        # chain's on the device that ran it: the layout of an ensemble of N).
        n = self.structure.num_particles
        x, lp, ll = (_flatten_chains(a, n) for a in (path, lp, ll))
        ancestor = jnp.repeat(chain_ancestor, smc.waste_free)
        return x, lp, ll, ancestor, metric, tuned, np.asarray(accepted, np.float64) / steps

    def start(self, x: Array, saved: dict | None) -> tuple:
        """`(x, log prior, log likelihood, log, first stage, temperature, ancestors)`: the
        initial population's, or a checkpoint's."""
        smc = self.smc
        if saved is None:
            lp, ll = self.evaluate(x, self.tempered(0.0))
            check_initial(np.asarray(lp), np.asarray(ll))
            return x, lp, ll, History(len(x), initial_step_size(smc.kernel)), 0, 0.0, None
        arrays = (jnp.asarray(saved[k]) for k in ("x", "lp", "ll", "ancestor"))
        x, lp, ll, ancestor = arrays
        log = History.restore(saved)
        return x, lp, ll, log, int(saved["stage"]) + 1, float(saved["beta"]), ancestor

    def go(
        self, x: Array, key: PRNGKeyArray, bar: StageProgress, store: StageStore | None
    ) -> SMCResult:
        smc, n = self.smc, self.structure.num_particles
        saved = None if store is None else store.load()
        x, lp, ll, log, first, beta, ancestor = self.start(x, saved)
        kernel = _arrays(smc.kernel, self.structure.dtype)
        tuned = smc.kernel
        if saved is not None and "eps" in saved:  # the last stage's tuning
            metric = jnp.asarray(saved["metric"]) if "metric" in saved else None
            tuned = with_tuning(kernel, jnp.asarray(saved["eps"]), metric, self.mode)
        ll_host = np.asarray(ll, np.float64) if saved is None else log.ll_host
        num_stages = len(smc.schedule) if smc.schedule is not None else smc.max_stages
        for t in range(first, num_stages):
            if beta >= 1.0:
                break
            new_beta = smc.next_temperature(ll_host, beta, t)
            log_w = increment(ll_host, new_beta - beta)
            if not np.any(np.isfinite(log_w)):
                raise SamplerError(
                    f"SMC.run: every particle's weight is zero at stage {t + 1} (temperature "
                    f"{beta:.6g} -> {new_beta:.6g}): the log likelihood is -inf at all "
                    f"{n} particles.\n  fix: more particles, or a prior that puts mass where "
                    "the likelihood is positive."
                )
            log.reweighted(new_beta, log_w)
            eps = jnp.asarray(log.step_size, jnp.float32)
            x, lp, ll, ancestor, metric, tuned, acceptance = self.resample_move(
                x, log_w, kernel, eps, new_beta, random.fold_in(key, t), log
            )
            ll_host = log.moved(np.asarray(ancestor), np.asarray(ll, np.float64), acceptance)
            if tunes_step_size(smc.kernel):
                log.step_size = next_step_size(log.step_size, log.acceptance[-1],
                                               smc.acceptance_target())  # fmt: skip
            beta = new_beta
            bar.stage(t + 1, beta, ess=log.ess[-1], acceptance=log.acceptance[-1],
                      log_evidence=float(np.sum(log.increments)))  # fmt: skip
            if store is not None:
                state = dict(stage=t, beta=beta, x=x, lp=lp, ll=ll, ancestor=ancestor, eps=eps)
                if metric is not None:
                    state["metric"] = metric
                store.save(state | log.state(ll_host))
        return SMCResult(
            particles=self.structure.unravel(x),
            log_weights=jnp.full((n,), -np.log(n), x.dtype),
            log_likelihood=ll,
            log_prior=lp,
            log_evidence=float(np.sum(log.increments)),
            log_evidence_se=float(np.sqrt(np.sum(log.lineage**2))),
            temperatures=np.asarray([0.0, *log.temperatures]),
            ess=np.asarray(log.ess),
            acceptance=np.asarray(log.acceptance),
            step_sizes=np.asarray(log.step_sizes),
            log_evidence_increments=np.asarray(log.increments),
            ancestors=ancestor,
            lineages=log.eves,
            kernel=tuned,
            num_nonfinite=log.num_nonfinite,
            num_lineages=log.num_lineages,
            adjusted=tunes_step_size(smc.kernel),
            names=self.structure.names,
            num_mutation_steps=smc.num_mutation_steps,
            mutation_steps=np.asarray(log.mutation_steps),
            correlations=np.asarray(log.correlations),
            decorrelation_target=np.inf if smc.decorrelation is None else smc.decorrelation,
            waste_free=smc.waste_free,
        )


def _flatten_chains(a: Array, n: int) -> Array:
    """`(M, P, ...)` chains' states -> `(N, ...)` particles, chain after chain."""
    return jnp.reshape(a, (n, *a.shape[2:]))


def _correlation(start: np.ndarray, now: np.ndarray) -> float:
    """The largest, over coordinates, Pearson correlation across particles between the
    particles' positions before and after the moves (1 where a coordinate has no spread:
    copies that never moved)."""
    a, b = start - start.mean(axis=0), now - now.mean(axis=0)
    scale = np.sqrt(np.sum(a * a, axis=0) * np.sum(b * b, axis=0))
    corr = np.where(scale > 0, np.sum(a * b, axis=0) / np.where(scale > 0, scale, 1.0), 1.0)
    return float(np.max(corr))


def _arrays(kernel: Sampler, dtype: Any) -> Sampler:
    """The kernel with its tuned fields as arrays, so every stage's kernel has the same
    static structure (one compiled program for all stages)."""
    updates = {}
    for name in ("step_size", "inverse_mass_matrix"):
        if any(f.name == name for f in dataclasses.fields(kernel)):
            value = getattr(kernel, name)
            if value is not None and not callable(value):
                updates[name] = jnp.asarray(value, dtype)
    if not updates:
        return kernel
    names = tuple(updates)
    return eqx.tree_at(lambda k: tuple(getattr(k, n) for n in names), kernel,
                       tuple(updates.values()), is_leaf=lambda v: v is None)  # fmt: skip
