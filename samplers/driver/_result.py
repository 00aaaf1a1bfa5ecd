"""What `samplers.run` returns."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

import ensemblenn as enn

from . import _setup
from ._bias import grads_to_threshold
from ._flat import Structure
from ._moments import ChainMoments
from ._summary import SUMMARY_MAX_ROWS, check_max_rows
from ._summary import table as summary_table
from ._verdict import (
    Verdict,
    divergence_rate,
    num_transitions,
    superchain_description,
    verdict_of,
)


class Diagnostics(eqx.Module):
    """Ensemble diagnostics, computed on device from every chain's moments.

    Each per-coordinate field is a pytree with ONE chain's structure of what it describes:
    `Result.diagnostics` the target's observable (the constrained parameters; the position
    when the target has no `observable`), `Result.unconstrained.diagnostics` the position.
    A plain `(num_chains, dim)` run gives `(dim,)` arrays, as before.

    Attributes:
        mean, sd, second_moment: ensemble estimates per coordinate.
        rhat: split R-hat per coordinate (from per-half moments).
        nested_rhat: nested R-hat per coordinate when the run had superchains (given, or
            chosen automatically for many short chains: see `Result.superchain_size`).
        ess: many-chain effective sample size per coordinate.
        bias_squared_max, bias_squared_mean: b² of the observable's second moments against
            the reference (None without one).

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> result = samplers.run(samplers.RandomWalk(0.5), lambda x: -0.5 * (x**2).sum(),
        ...                       jnp.zeros((8, 2)), key=jax.random.key(0), num_steps=20,
        ...                       progress=False)
        >>> d = result.diagnostics
        >>> d.mean.shape, d.rhat.shape, d.ess.shape, d.bias_squared_max is None  # no reference
        ((2,), (2,), (2,), True)
    """

    mean: Any = enn.broadcast()
    sd: Any = enn.broadcast()
    second_moment: Any = enn.broadcast()
    rhat: Any = enn.broadcast()
    nested_rhat: Any = enn.broadcast()
    ess: Any = enn.broadcast()
    bias_squared_max: Float[Array, ""] | None = enn.broadcast()
    bias_squared_mean: Float[Array, ""] | None = enn.broadcast()

    def unravel(self, structure: Structure) -> "Diagnostics":
        """These (flat) diagnostics with each per-coordinate field in `structure`."""

        def tree(x: Any) -> Any:
            return None if x is None else structure.unravel(x)

        return Diagnostics(
            tree(self.mean), tree(self.sd), tree(self.second_moment), tree(self.rhat),
            tree(self.nested_rhat), tree(self.ess), self.bias_squared_max,
            self.bias_squared_mean,
        )  # fmt: skip


class Unconstrained(eqx.Module):
    """The run on the scale the chains move on: diagnostics and thinned draws of the
    position itself (in the positions' structure), beside `Result.diagnostics`/`trace`,
    which describe the target's observable. They are the same when it has none.

    Attributes:
        diagnostics: `Diagnostics` of the position.
        trace: the thinned positions (leaves `(num_chains, num_draws, ...)`), or None.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> class Lognormal(samplers.targets.IllConditionedGaussian):   # observe exp(x)
        ...     def observable(self, x):
        ...         return {"y": jnp.exp(x)}
        >>> result = samplers.run(samplers.MALA(0.8), Lognormal(1, 1.0), jnp.zeros((8, 1)),
        ...                       key=jax.random.key(0), num_steps=20, thin=10, progress=False)
        >>> result.trace["y"].shape, result.unconstrained.trace.shape
        ((8, 2, 1), (8, 2, 1))
        >>> result.unconstrained.diagnostics.mean.shape, list(result.diagnostics.mean)
        ((1,), ['y'])
    """

    diagnostics: Diagnostics
    trace: Any = enn.per_chain(default=None)


class Result(eqx.Module):
    """The outcome of `samplers.run`.

    Attributes:
        state: the final state of every chain (leaves stacked `(num_chains, ...)`).
        sampler: the sampler after adaptation (the one the sampling steps used).
        moments: every chain's streaming moments over the sampling steps.
        diagnostics: `Diagnostics` of the ensemble.
        acceptance_rate: mean acceptance per chain over warmup and sampling.
        num_divergent: divergent sampling transitions per chain (warmup's are not
            counted, as NumPyro and Stan report them).
        num_grads: gradient evaluations per chain (excluding adaptation).
        trace: the kept draws (every draw by default, thinned to fit
            `samplers.driver._setup.TRACE_MEMORY_BUDGET`; see `samplers.run`'s `thin`), of the
            target's observable when it has one (else of the position), in its structure:
            leaves `(num_chains, num_draws, ...)`; `(num_chains, num_draws, dim)` for a
            plain run. None when no draw was kept (`thin=0`).
        sample_stats: per kept draw, `(num_chains, num_draws)` arrays of the transition
            that produced it, in ArviZ's names: `diverging`, `acceptance_rate`, `n_steps`
            (gradient evaluations), `step_size` (its mean if per coordinate),
            `energy_error`, `tree_depth` (NUTS) and `energy` (kernels whose info reports
            one); -inf where the kernel's info has no such field. None without a trace.
        bias_history: `(num_steps, 2)` ensemble b² (max, mean) per step if tracked.
        adaptation_info: whatever the adaptation reported.
        superchain_size: the run's superchain size (nested R-hat), or None: the one given to
            `samplers.run`, else the one its rule chose for many short chains (at least 64
            chains and fewer than 1000 steps, see `samplers.driver._verdict`), else None.
        superchain_auto: whether `superchain_size` was chosen automatically.
        unconstrained: `Unconstrained`: diagnostics and draws of the position itself.
        draw_logdensity: `(num_chains, num_draws)` log density of each kept draw, as the
            chain computed it while sampling (its state's `logdensity`, in the position's
            dtype); None without a trace, for a minibatch log density, or when the
            sampler's state has no `logdensity`.
        grads_history: `(num_steps,)` the ensemble's gradients per chain (mean over chains,
            warmup included, adaptation not) after each sampling step, when b² is tracked.
        adaptation_bias: with `track_bias=True`, the ensemble's b² after every adaptation
            step, `(steps taken, 3)` rows of (b² max, b² mean, gradients per chain since
            the adaptation began, as the adaptation counts them: the last row's is its
            `num_grads`): LAPS phases 1 and 2, ChEES, MEADS, `WindowAdaptation` and any
            `EnsembleAdaptation`. `bias_trajectory`/`grads_to_bias` put it before the
            sampling rows (which then count on from its last). None without tracking, or
            when the adaptation does not record it (see `Adaptation.with_bias_monitor`).
        reference: the reference moments the run compared with, or None.
        structure: the `Structure` of the diagnostics (one chain's observable): the
            coordinate names of the summary.
        thin: the run's resolved thinning: every `thin`-th sampling draw was kept (0:
            none); None for a result not made by `samplers.run`.
        thin_auto: whether `thin` was chosen to fit the memory budget (`thin=None`).
        target: the `samplers.targets.from_numpyro` target the run sampled (its plates,
            data and likelihood are exported by `to_arviz`), else None.
        adapted: whether an adaptation tuned the kernel before the sampling steps (the
            verdict's fixes then suggest changing it, not adding one); None: inferred from
            `adaptation_info` (an adaptation's info, or None without one).

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> result = samplers.run(samplers.RandomWalk(0.5), lambda x: -0.5 * (x**2).sum(),
        ...                       jnp.zeros((8, 2)), key=jax.random.key(0), num_steps=20,
        ...                       thin=5, progress=False)
        >>> result.num_chains, result.state.position.shape, result.trace.shape
        (8, (8, 2), (8, 4, 2))
        >>> result.num_grads.tolist()   # a random walk uses no gradients
        [0, 0, 0, 0, 0, 0, 0, 0]
    """

    state: Any = enn.per_chain()
    sampler: Any
    moments: ChainMoments = enn.per_chain()
    diagnostics: Diagnostics
    acceptance_rate: Float[Array, " chains"] = enn.per_chain()
    num_divergent: Int[Array, " chains"] = enn.per_chain()
    num_grads: Int[Array, " chains"] = enn.per_chain()
    trace: Any = enn.per_chain()
    sample_stats: dict[str, Float[Array, "chains draws"]] | None = enn.per_chain(default=None)
    bias_history: Float[Array, "steps 2"] | None = enn.broadcast(default=None)
    adaptation_info: Any = None
    num_steps: int = eqx.field(static=True, default=0)
    num_warmup: int = eqx.field(static=True, default=0)
    superchain_size: int | None = eqx.field(static=True, default=None)
    superchain_auto: bool = eqx.field(static=True, default=False)
    unconstrained: Unconstrained | None = None
    draw_logdensity: Float[Array, "chains draws"] | None = enn.per_chain(default=None)
    grads_history: Float[Array, " steps"] | None = enn.broadcast(default=None)
    adaptation_bias: Float[Array, "adapt_steps 3"] | None = enn.broadcast(default=None)
    reference: Any = enn.broadcast(default=None)
    structure: Structure | None = None
    adapted: bool | None = eqx.field(static=True, default=None)
    thin: int | None = eqx.field(static=True, default=None)
    thin_auto: bool = eqx.field(static=True, default=False)
    target: Any = None

    @property
    def num_chains(self) -> int:
        return int(self.acceptance_rate.shape[0])

    @property
    def verdict(self) -> "Verdict":
        """Whether the run can be trusted, with the failed criteria (`.converged`,
        `.reasons`, each with a fix naming `samplers.run`'s arguments); the rule is
        documented in `samplers.driver._verdict`."""
        return verdict_of(self)

    @property
    def converged(self) -> bool:
        """`self.verdict.converged`: max R-hat < 1.01, min ESS >= 400, no divergences and a
        sane acceptance (see `verdict`)."""
        return self.verdict.converged

    @property
    def names(self) -> tuple[str, ...]:
        """One name per coordinate of the diagnostics, in order (`mu`, `theta[3]`)."""
        if self.structure is None:
            return tuple(f"x[{i}]" for i in range(np.size(self.diagnostics.mean)))
        return self.structure.names

    def bias_trajectory(self, reduction: str = "max") -> tuple[np.ndarray, np.ndarray]:
        """`(b², gradients per chain)` after each recorded step: the adaptation's history
        (`adaptation_bias`) when there is one, then the sampling steps'.

        Example:
            >>> import jax, jax.numpy as jnp, samplers
            >>> target = samplers.targets.IllConditionedGaussian(2, 1.0)
            >>> fixed = samplers.HMC(0.5, 4, jitter=False)  # 4 gradients every step
            >>> result = samplers.run(fixed, target, jnp.ones((8, 2)), key=jax.random.key(0),
            ...                       num_steps=6, track_bias=True, progress=False)
            >>> b2, grads = result.bias_trajectory()
            >>> b2.shape, grads.tolist()
            ((6,), [4.0, 8.0, 12.0, 16.0, 20.0, 24.0])
        """
        column = {"max": 0, "mean": 1}.get(reduction)
        if column is None:
            raise enn.EnsembleError(f'reduction must be "max" or "mean", got {reduction!r}.')
        if self.bias_history is None or self.grads_history is None:
            raise enn.EnsembleError(
                "This result has no b² history.\n  fix: run with track_bias=True and a "
                "reference (a target with `reference` moments, or reference=...)."
            )
        b2 = np.asarray(self.bias_history)[:, column].astype(np.float64)
        grads = np.asarray(self.grads_history).astype(np.float64)
        if self.adaptation_bias is not None:
            adapt = np.asarray(self.adaptation_bias, np.float64)
            adapt = adapt[np.isfinite(adapt[:, 2])]  # unused rows (a run under jit keeps them)
            offset = adapt[-1, 2] if len(adapt) else 0.0
            b2 = np.concatenate([adapt[:, column], b2])
            grads = np.concatenate([adapt[:, 2], grads + offset])
        return b2, grads

    def grads_to_bias(self, threshold: float = 0.01, reduction: str = "max") -> float:
        """Gradients per chain after which the ensemble's per-step b² stays below
        `threshold` (`inf` if it never does), as the LAPS paper reports its runs.

        Needs `track_bias=True` (and a reference). The count is the mean over chains of the
        gradients each chain has spent (warmup included; adaptation included once its
        history is recorded in `adaptation_bias`).

        Args:
            threshold: the b² level.
            reduction: `"max"` (over coordinates, the LAPS paper's choice) or `"mean"`.

        Example:
            >>> import jax, jax.numpy as jnp, samplers
            >>> target = samplers.targets.IllConditionedGaussian(2, 1.0)
            >>> result = samplers.run(samplers.HMC(0.5, 4), target, jnp.ones((64, 2)),
            ...                       key=jax.random.key(0), num_steps=200, track_bias=True,
            ...                       progress=False)
            >>> 0 < result.grads_to_bias(0.1) < 800
            True
        """
        b2, grads = self.bias_trajectory(reduction)
        return grads_to_threshold(b2, grads, threshold)

    def summary(
        self, max_rows: int | None = SUMMARY_MAX_ROWS, *, print_it: bool = True,
        hints: str = "library",
    ) -> str:  # fmt: skip
        """The verdict line (see `verdict`) with its fixes, the run in three lines
        (acceptance, divergences with their rate, max R-hat of each kind, min ESS), which
        R-hat the verdict read (nested R-hat over how many superchains, and whether they
        were chosen automatically, or split R-hat), b², then a table with one row per
        coordinate of the observable, named by path (`mu`, `theta_z[3]`; `x[0]`.. for a
        plain array).

        The table's columns (`samplers.driver._summary` documents each): mean, sd, median,
        5%, 95%, ESS (mean), ESS (bulk), ESS (tail), R-hat (split), R-hat (nested) and ref
        mean. The median, quantiles and bulk/tail ESS need the kept draws (`thin=` in
        `samplers.run`); without them a note says so instead. ESS (mean) is the one the
        verdict reads, from every sampling draw's moments; none is capped at the number of
        draws (ArviZ reports more on anti-correlated draws too). R-hat (nested) is shown when
        the run had superchains. Every column has one number format.

        Args:
            max_rows: the most rows shown (default `SUMMARY_MAX_ROWS` = 100); a larger run
                shows its first `max_rows` rows and a note saying how many were left out.
                None shows every row.
            print_it: print the text (on process 0 only) as well as returning it.
            hints: the verdict's fixes name `samplers.run`'s arguments ("library") or the
                command line's flags ("cli", what `python -m samplers run` prints).

        Returns:
            The text.

        Example:
            >>> import jax, jax.numpy as jnp, samplers
            >>> result = samplers.run(samplers.MALA(1.0), lambda x: -0.5 * (x**2).sum(),
            ...                       jnp.zeros((64, 2)), key=jax.random.key(0), num_steps=50,
            ...                       thin=1, progress=False)   # many short chains: superchains
            >>> lines = result.summary(print_it=False).splitlines()
            >>> [line for line in lines if line.startswith("verdict read")]
            ['verdict read: nested R-hat, 16 superchains of 4 chains (automatic)']
            >>> header = next(line for line in lines if "ESS (bulk)" in line)
            >>> header.split("ESS")[0].split(), "R-hat (split)" in header, "(nested)" in header
            (['mean', 'sd', 'median', '5%', '95%'], True, True)
        """
        check_max_rows(max_rows)
        d = self.diagnostics
        devices = _device_count(self.acceptance_rate)
        adapted = getattr(self.adaptation_info, "num_grads", None)
        adapting = "" if adapted is None else f" + {float(np.mean(adapted)):.0f} adapting"
        # An adaptation replaces the warmup (the CLI's --warmup becomes its steps): say so
        # rather than print "0 warmup" after a tuned run.
        phases = [] if self.adaptation_info is None else ["adaptation"]
        if self.num_warmup or not phases:
            phases.append(f"{self.num_warmup} warmup")
        divergent = f"{int(jnp.sum(self.num_divergent))}"
        transitions = num_transitions(self)
        if transitions is not None:  # with the rate, as NumPyro and Stan report it
            divergent += f" ({divergence_rate(int(divergent), transitions)})"
        rhats = f"max R-hat (split) {float(np.nanmax(self._flat(d.rhat))):.4f}"
        if d.nested_rhat is not None:
            rhats += f", max R-hat (nested) {float(np.nanmax(self._flat(d.nested_rhat))):.4f}"
        lines = [
            *verdict_of(self, hints).lines(),
            f"{self.num_chains} chains on {devices} device(s), "
            f"{' + '.join([*phases, f'{self.num_steps} steps'])}, "
            f"{float(jnp.mean(self.num_grads)):.0f} grads/chain{adapting}",
            f"acceptance {float(jnp.mean(self.acceptance_rate)):.3f}, divergent transitions "
            f"{divergent}",
            f"{rhats}, min ESS (mean) {float(np.nanmin(self._flat(d.ess))):.0f}",
            "verdict read: "
            + superchain_description(self.num_chains, self.superchain_size, self.superchain_auto),
        ]
        trace = self._trace_line()
        if trace is not None:
            lines.append(trace)
        if d.bias_squared_max is not None:
            lines.append(
                f"bias^2 of E[x^2]: max {float(d.bias_squared_max):.2e}, "
                f"mean {float(d.bias_squared_mean):.2e}"
            )
        notes, rows = summary_table(self, self._flat, max_rows, hints)
        text = "\n".join([*lines, *notes, *rows])
        if print_it and jax.process_index() == 0:  # several processes: print once
            print(text)
        return text

    def _trace_line(self) -> str | None:
        """What the trace kept, and why (the automatic thinning names the budget)."""
        if self.thin is None:
            return None
        if self.thin == 0:
            why = "automatic: not one draw per chain fits" if self.thin_auto else "thin=0"
            return f"trace: no draws kept ({why})"
        every = "every draw" if self.thin == 1 else f"every {_ordinal(self.thin)} draw"
        budget = f"memory budget {_setup.TRACE_MEMORY_BUDGET / 2**20:g} MiB"
        why = f" ({budget})" if self.thin_auto else f" (thin={self.thin})"
        return f"trace: {every} kept{why}"

    def _flat(self, tree: Any) -> np.ndarray:
        """A diagnostics field as one flat host vector, in the order of `names`."""
        return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(tree)])

    def to_arviz(self, *, var_name: str = "x", superchain_size: int | None = None) -> Any:
        """The kept draws as an `arviz.InferenceData` (ArviZ 0.x) or `xarray.DataTree`
        (1.x), with per-draw sample statistics; see `samplers.arviz.to_arviz` for the
        groups and coordinates. Needs ArviZ, and a trace (any `thin` but 0)."""
        from ..arviz import to_arviz

        return to_arviz(self, var_name=var_name, superchain_size=superchain_size)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _device_count(x: Any) -> int:
    sharding = getattr(x, "sharding", None)
    return len(sharding.device_set) if isinstance(x, jax.Array) and sharding else 1
