"""What `SMC.run` returns: the particles, the evidence, the schedule, and a verdict."""

from typing import Any, NamedTuple

import equinox as eqx
import jax
import numpy as np
from jaxtyping import Array, Float, Int

import ensemblenn as enn

from ..driver import Verdict

# The verdict's thresholds (see `SMCResult.verdict`).
COLLAPSE_FRACTION = 0.1  # a stage whose ESS is below this fraction of N collapsed
ESS_MIN = 100.0  # the final reweighting's ESS: fewer particles carry the posterior
DISTINCT_MIN = 0.5  # distinct final particles, as a fraction of N
ACCEPTANCE_MIN = 0.05  # mean acceptance over the stages (Metropolis-adjusted kernels)
LINEAGES_MIN = 10  # initial particles with descendants: fewer, and log Z's se is unreliable


class _Reason(NamedTuple):
    criterion: str
    value: float
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.problem} (fix: {self.fix})"


def lineage_mcse(values: np.ndarray, lineages: np.ndarray) -> np.ndarray:
    """`sqrt(sum_k (sum_{i in k} (v_i - mean v))^2) / N` over the lineages `k`, for each
    trailing coordinate of `values` (leading axis: the particles)."""
    n = values.shape[0]
    flat = values.reshape(n, -1)
    centred = flat - flat.mean(axis=0)
    _, group = np.unique(lineages, return_inverse=True)
    sums = np.zeros((group.max() + 1, flat.shape[1]))
    np.add.at(sums, group, centred)
    return (np.sqrt(np.sum(sums**2, axis=0)) / n).reshape(values.shape[1:])


class SMCResult(eqx.Module):
    """The outcome of `samplers.SMC.run`.

    Attributes:
        particles: the final particles, in the structure of the initial ones (leaves
            `(num_particles, ...)`): equally weighted draws of the posterior (every stage
            ends with a resampling and the moves).
        log_weights: their normalised log weights (all `-log N`).
        log_likelihood, log_prior: each final particle's values.
        log_evidence: the estimate of `log Z`, relative to the prior's normalisation.
        log_evidence_se: its estimated standard error (see `samplers.SMC`).
        temperatures: the schedule, `0` (the prior) first: `num_stages + 1` values.
        ess: each stage's ESS of its incremental weights (a number of particles).
        acceptance: each stage's mean acceptance of the mutation steps.
        step_sizes: each stage's step size (before the metric's per-coordinate scale).
        log_evidence_increments: each stage's `log(mean w)`, which sum to `log_evidence`.
        ancestors: the last resampling's ancestor of each particle (with `waste_free`,
            that of the chain's start: `P` consecutive particles share it).
        mutation_steps: each stage's kernel steps per particle (with `waste_free`, per
            chain: `(P - 1) * num_mutation_steps`).
        correlations: with `SMC(decorrelation=...)`, each stage's correlation of the
            particles with where its moves started (the largest over coordinates) when
            its moves ended; NaN otherwise.
        lineages: each final particle's ancestor in the initial population (its Eve):
            particles of one lineage are correlated, those of different lineages are not
            (`mcse` groups by it).
        kernel: the kernel as tuned at the last stage.
        num_nonfinite: particles whose log likelihood was NaN or +inf after a stage (their
            weight was then zero; the verdict reports them).
        num_lineages: the particles of the initial population that still had descendants
            at the last reweighting: the lineages `log_evidence_se` is estimated from.
        adjusted: whether the step size was tuned to an acceptance.
        names: one name per coordinate (`mu`, `theta[3]`).
        num_mutation_steps: the kernel steps per particle and stage (per round, with
            `decorrelation`).
        decorrelation_target: `SMC.decorrelation` (inf without one).
        waste_free: `SMC.waste_free`, the states per chain (None: resample-move).

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> smc = samplers.SMC(samplers.RandomWalk(0.5), num_mutation_steps=4)
        >>> result = smc.run(lambda x: -0.5 * jnp.sum(x**2) - 0.5 * jnp.log(2 * jnp.pi),
        ...                  lambda x: -0.5 * jnp.sum((x - 2.0) ** 2), jnp.zeros((128, 1)) +
        ...                  jax.random.normal(jax.random.key(0), (128, 1)),
        ...                  key=jax.random.key(1))
        >>> result.num_stages == len(result.temperatures) - 1, result.num_particles
        (True, 128)
        >>> print(result.summary(print_it=False).splitlines()[0])  # doctest: +ELLIPSIS
        SMC: 128 particles, ... stages to temperature 1, RandomWalk x 4 steps per stage
    """

    particles: Any = enn.per_chain()
    log_weights: Float[Array, " N"] = enn.per_chain()
    log_likelihood: Float[Array, " N"] = enn.per_chain()
    log_prior: Float[Array, " N"] = enn.per_chain()
    log_evidence: float = eqx.field(static=True)
    log_evidence_se: float = eqx.field(static=True)
    temperatures: np.ndarray
    ess: np.ndarray
    acceptance: np.ndarray
    step_sizes: np.ndarray
    log_evidence_increments: np.ndarray
    ancestors: Int[Array, " N"] = enn.per_chain()
    lineages: np.ndarray
    mutation_steps: np.ndarray
    correlations: np.ndarray
    kernel: Any = None
    num_nonfinite: int = eqx.field(static=True, default=0)
    num_lineages: int = eqx.field(static=True, default=0)
    adjusted: bool = eqx.field(static=True, default=True)
    names: tuple[str, ...] = eqx.field(static=True, default=())
    num_mutation_steps: int = eqx.field(static=True, default=0)
    decorrelation_target: float = eqx.field(static=True, default=np.inf)
    waste_free: int | None = eqx.field(static=True, default=None)

    @property
    def num_particles(self) -> int:
        return int(self.log_weights.shape[0])

    @property
    def num_stages(self) -> int:
        return len(self.temperatures) - 1

    def flat_particles(self) -> np.ndarray:
        """The final particles as one `(num_particles, dim)` numpy array (in `names`
        order)."""
        leaves = jax.tree.leaves(self.particles)
        n = self.num_particles
        return np.concatenate([np.asarray(x).reshape(n, -1) for x in leaves], axis=1)

    def mcse(self, values: Any) -> np.ndarray:
        """The Monte Carlo standard error of the particles' mean of `values`.

        `values` holds one value (or array) per final particle, leading axis `N`; the
        estimate groups the particles by lineage (copies and descendants of one initial
        particle are correlated): `sqrt(sum_k (sum_{i in k} (v_i - mean v))^2) / N`. Like
        `log_evidence_se`, it needs many lineages (`num_lineages`).

        Example:
            >>> import numpy as np
            >>> from samplers.smc._result import lineage_mcse
            >>> v, lineage = np.array([1.0, 1.0, 3.0, 3.0]), np.array([0, 0, 1, 1])
            >>> round(float(lineage_mcse(v, lineage)), 4)  # two independent pairs: sqrt(8) / 4
            0.7071
        """
        return lineage_mcse(np.asarray(values, np.float64), self.lineages)

    def to_arviz(self) -> Any:
        """The final particles as ArviZ data: one chain of `num_particles` equally weighted
        draws (`posterior`, one variable per leaf, named by its path), each particle's
        `log_likelihood` and `log_prior` (`sample_stats`), and the log evidence, its
        standard error and the schedule in the attributes. An `az.InferenceData` with
        ArviZ 0.x, an `xarray.DataTree` with 1.x.

        Draws of one lineage are correlated (`mcse`); ArviZ's ESS, which reads draw order
        as time, does not apply to them.

        Example:
            >>> import jax, jax.numpy as jnp, samplers
            >>> result = samplers.SMC(samplers.RandomWalk(0.5), num_mutation_steps=2).run(
            ...     lambda p: -0.5 * jnp.sum(p["mu"] ** 2), lambda p: -jnp.sum(p["mu"] ** 2),
            ...     {"mu": jax.random.normal(jax.random.key(0), (64, 2))},
            ...     key=jax.random.key(1))
            >>> data = result.to_arviz()
            >>> data["posterior"]["mu"].shape
            (1, 64, 2)
        """
        try:
            import arviz as az
            import xarray as xr
        except ImportError:
            raise ImportError(
                "SMCResult.to_arviz needs ArviZ, which is not installed.\n  fix: pip install "
                "arviz (or install this package with its 'dev' extra)."
            ) from None
        n = self.num_particles
        paths, _ = jax.tree_util.tree_flatten_with_path(self.particles)
        posterior = {}
        for path, leaf in paths:
            name = jax.tree_util.keystr(path, simple=True, separator=".") or "x"
            value = np.asarray(leaf)[None]  # (chain, draw, ...)
            dims = ("chain", "draw", *(f"{name}_dim_{i}" for i in range(value.ndim - 2)))
            posterior[name] = (dims, value)
        coords = {"chain": [0], "draw": np.arange(n)}
        attrs = {
            "log_evidence": self.log_evidence,
            "log_evidence_se": self.log_evidence_se,
            "temperatures": np.asarray(self.temperatures).tolist(),
            "inference_library": "samplers.SMC",
        }
        stats_ = {
            "log_likelihood": (("chain", "draw"), np.asarray(self.log_likelihood)[None]),
            "log_prior": (("chain", "draw"), np.asarray(self.log_prior)[None]),
        }
        groups = {
            "posterior": xr.Dataset(posterior, coords=coords, attrs=attrs),
            "sample_stats": xr.Dataset(stats_, coords=coords, attrs=attrs),
        }
        if int(az.__version__.split(".")[0]) < 1:
            return az.InferenceData(**groups)
        return xr.DataTree.from_dict(groups)

    def distinct_fraction(self) -> float:
        """The fraction of final particles that are distinct (duplicates are left by
        resampling where the moves were rejected)."""
        flat = self.flat_particles()
        return len(np.unique(flat, axis=0)) / flat.shape[0]

    @property
    def verdict(self) -> Verdict:
        """Whether the run can be trusted (`samplers.Verdict`: `.converged`, `.reasons`).

        Reliable only if all hold: the schedule reached temperature 1 (else it stalled:
        `max_stages` ran out); no stage's ESS fell below 10% of `N` (a collapsed stage:
        the weights of a fixed schedule's step were carried by a few particles); the last
        stage's ESS is at least 100; at least half the final particles are distinct (the
        moves renew the resampled copies); for Metropolis-adjusted kernels a mean
        acceptance of at least 0.05; with `SMC(decorrelation=...)`, every stage's moves
        decorrelated the particles that far; at least 10 lineages (initial particles with
        descendants at the last reweighting, from which `log_evidence_se` is estimated);
        and no log likelihood was NaN or +inf.
        """
        n, reasons = self.num_particles, []
        final = float(self.temperatures[-1])
        if final < 1.0:
            reasons.append(_Reason(
                "schedule", final,
                f"the schedule stalled at temperature {final:.4g} after {self.num_stages} "
                "stages",
                "SMC(max_stages=...) larger, a smaller target_ess (longer steps), or more "
                "mutation steps (better-mixed particles give less extreme weights)",
            ))  # fmt: skip
        if self.ess.size:
            worst = int(np.argmin(self.ess))
            if self.ess[worst] < COLLAPSE_FRACTION * n:
                reasons.append(_Reason(
                    "collapse", float(self.ess[worst]),
                    f"stage {worst + 1} collapsed: ESS {self.ess[worst]:.1f} of {n} particles"
                    f" (temperature {self.temperatures[worst]:.4g} -> "
                    f"{self.temperatures[worst + 1]:.4g})",
                    "a finer schedule, or schedule=None (adaptive)",
                ))  # fmt: skip
            if self.ess[-1] < ESS_MIN:
                reasons.append(_Reason(
                    "ess", float(self.ess[-1]),
                    f"the last stage's ESS {self.ess[-1]:.1f} < {ESS_MIN:.0f}",
                    "more particles",
                ))  # fmt: skip
        distinct = self.distinct_fraction()
        if distinct < DISTINCT_MIN:
            reasons.append(_Reason(
                "distinct", distinct,
                f"only {100 * distinct:.0f}% of the final particles are distinct",
                "more num_mutation_steps, or a kernel that moves further",
            ))  # fmt: skip
        if self.adjusted and self.acceptance.size:
            mean = float(np.mean(self.acceptance))
            if mean < ACCEPTANCE_MIN:
                reasons.append(_Reason(
                    "acceptance", mean,
                    f"mean acceptance {mean:.3f} < {ACCEPTANCE_MIN}",
                    "a smaller initial step size for the kernel",
                ))  # fmt: skip
        stuck = np.flatnonzero(self.correlations > self.decorrelation_target)
        if stuck.size:
            reasons.append(_Reason(
                "decorrelation", float(np.max(self.correlations)),
                f"{stuck.size} stage(s) ended their moves with a correlation above "
                f"{self.decorrelation_target} (the largest {np.max(self.correlations):.3f})",
                "a larger max_mutation_steps, or a kernel that moves further per step",
            ))  # fmt: skip
        if self.num_lineages < LINEAGES_MIN:
            reasons.append(_Reason(
                "lineages", float(self.num_lineages),
                f"only {self.num_lineages} initial particle(s) have descendants: "
                "log_evidence_se is unreliable",
                "more particles (or fewer stages: a smaller target_ess)",
            ))  # fmt: skip
        if self.num_nonfinite:
            reasons.append(_Reason(
                "nonfinite", float(self.num_nonfinite),
                f"{self.num_nonfinite} particle(s) had a NaN or +inf log likelihood after "
                "a stage (given weight zero)",
                "make log_likelihood finite (or -inf) on the prior's support",
            ))  # fmt: skip
        checked = (
            f"{self.num_stages} stages, min ESS {np.min(self.ess):.0f}, "
            f"{100 * distinct:.0f}% distinct"
            if self.ess.size else "no stage"
        )  # fmt: skip
        return Verdict(not reasons, tuple(reasons), checked)

    def summary(self, *, print_it: bool = True, max_rows: int = 20) -> str:
        """A text summary: the run, log Z with its standard error, per-coordinate posterior
        mean, sd and 5%/95% quantiles of the particles, and the verdict.

        Args:
            print_it: also print it.
            max_rows: the most coordinates shown.
        """
        flat = self.flat_particles()
        n = self.num_particles
        kernel = type(self.kernel).__name__
        steps = str(self.num_mutation_steps)
        if self.mutation_steps.size and np.ptp(self.mutation_steps):
            steps = f"{np.min(self.mutation_steps)}-{np.max(self.mutation_steps)}"
        moves = f"{kernel} x {steps} steps per stage"
        if self.waste_free is not None:
            chains = n // self.waste_free
            moves = (
                f"{kernel} x {self.num_mutation_steps} steps between the {self.waste_free} "
                f"states of {chains} waste-free chains"
            )
        lines = [
            f"SMC: {n} particles, {self.num_stages} stages to temperature "
            f"{float(self.temperatures[-1]):.4g}, {moves}",
            f"log Z = {self.log_evidence:.4f} +/- {self.log_evidence_se:.4f} (se)",
        ]
        if self.ess.size:
            acc = f", mean acceptance {np.mean(self.acceptance):.3f}" if self.adjusted else ""
            lines.append(f"stage ESS min {np.min(self.ess):.1f} of {n}{acc}")
        lines.append(f"{'':<16}{'mean':>11}{'sd':>11}{'5%':>11}{'95%':>11}")
        names = self.names or tuple(f"x[{i}]" for i in range(flat.shape[1]))
        q5, q95 = np.quantile(flat, [0.05, 0.95], axis=0)
        mean, sd = flat.mean(0), flat.std(0, ddof=1)
        for i, name in enumerate(names[:max_rows]):
            lines.append(f"{name:<16}{mean[i]:>11.4g}{sd[i]:>11.4g}{q5[i]:>11.4g}{q95[i]:>11.4g}")
        if len(names) > max_rows:
            lines.append(f"({len(names) - max_rows} more rows: summary(max_rows=...))")
        lines += self.verdict.lines()
        text = "\n".join(lines)
        if print_it:
            print(text)
        return text
