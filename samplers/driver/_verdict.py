"""Whether a run can be trusted: one documented rule, shared by `Result` and the CLI.

The rule (`judge`): a run is **converged** only if all of these hold.

1. **R-hat.** The largest R-hat over dimensions is below `RHAT_MAX` = 1.01. With
   superchains (`samplers.run(superchain_size=...)`) that is the nested R-hat, else the
   split R-hat.
2. **ESS.** The smallest effective sample size over dimensions (all chains' sampling draws
   together) is at least `ESS_MIN` = 400.
3. **Divergences.** No transition of any chain diverged (warmup and sampling).
4. **Acceptance**, for Metropolis-adjusted kernels only (`Sampler.adjusted`): the mean
   acceptance over all chains and steps is neither below `ACCEPTANCE_MIN` = 0.05 (the chains
   barely move: the step is too large) nor above `ACCEPTANCE_MAX` = 0.995 (the step is so
   small that every proposal is accepted and the chains crawl). Unadjusted kernels (MCLMC,
   SGLD, SGHMC) report an acceptance of 1 by construction, so the check is skipped.

How to read R-hat of many short chains. With `m` chains of `n` steps and an integrated
autocorrelation time `tau`, the split R-hat of chains that are already stationary is still
about `1 + (tau - 1) / n`: the half-chain means vary by `tau / n` of the variance, and
R-hat compares exactly that with the within-chain variance. Many short chains (the regime
of this library: hundreds of chains, a few hundred steps) therefore show R-hat above 1.01
even when every chain has forgotten its start, and more chains do not help. Nested R-hat
(Margossian et al., 2024) compares the means of superchains of `k` chains each instead; its
stationary excess shrinks like `tau / (k n)`, so with enough chains per superchain it
measures what matters, whether the chains still remember their initialisation. Use
superchains for many short chains, and read split R-hat only for few long ones.

Otherwise the verdict is NOT CONVERGED, with each failed criterion, its value and the
likely fix: a longer warmup or an adaptation for R-hat, more steps or chains for ESS, a
smaller step (or an adaptation, which tunes it) for divergences and low acceptance, a larger
step for an acceptance near 1.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

RHAT_MAX = 1.01
ESS_MIN = 400.0
ACCEPTANCE_MIN = 0.05
ACCEPTANCE_MAX = 0.995

__all__ = ["ConvergenceWarning", "Reason", "Verdict", "judge", "verdict_of"]


class ConvergenceWarning(UserWarning):
    """Emitted by `samplers.run` when the run is NOT CONVERGED (see `Result.verdict`).

    Filter it like any warning.

    Example:
        >>> import warnings, samplers
        >>> issubclass(samplers.ConvergenceWarning, UserWarning)
        True
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", samplers.ConvergenceWarning)  # silence it
    """


class Reason(NamedTuple):
    """One failed criterion: which, its value, and the likely fix."""

    criterion: str  # "rhat", "ess", "divergences", "acceptance"
    value: float
    problem: str  # e.g. "max nested R-hat 1.234 >= 1.01"
    fix: str

    def __str__(self) -> str:
        return f"{self.problem} (fix: {self.fix})"


class Verdict(NamedTuple):
    """Whether a run can be trusted (`Result.verdict`): `converged`, and the failed
    criteria as `reasons` (each with `criterion`, `value`, `problem` and `fix`).

    The rule, the same in `Result.summary`, `samplers.run`'s `ConvergenceWarning` and the
    CLI: converged only if max R-hat < 1.01 (nested R-hat when the run used superchains:
    split R-hat of many short chains stays about `1 + tau / n` above 1 even at
    stationarity, nested R-hat does not), min ESS >= 400 (all chains' sampling draws), no
    divergent transitions, and for Metropolis-adjusted kernels (`Sampler.adjusted`) a mean
    acceptance in [0.05, 0.995].

    Example:
        >>> from samplers.driver._verdict import judge
        >>> v = judge(rhat=[1.002, 1.3], ess=[900.0, 35.0], acceptance=0.6, num_divergent=0)
        >>> v.converged, [r.criterion for r in v.reasons]
        (False, ['rhat', 'ess'])
        >>> print(v.line)
        NOT CONVERGED: max R-hat 1.3000 >= 1.01; min ESS 35 < 400
    """

    converged: bool
    reasons: tuple[Reason, ...]
    checked: str  # the values that passed, for the CONVERGED line

    @property
    def line(self) -> str:
        """One line: "CONVERGED (...)" or "NOT CONVERGED: what failed; ..."."""
        if self.converged:
            return f"CONVERGED ({self.checked})"
        return "NOT CONVERGED: " + "; ".join(r.problem for r in self.reasons)

    def lines(self) -> list[str]:
        """The verdict line, then one "  fix: ..." line per failed criterion."""
        return [self.line] + [f"  - {r.problem}: {r.fix}" for r in self.reasons]

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _extreme(values: Any, pick: Any) -> np.floating:
    """The max or min over every leaf, in the leaves' own precision (NaN if any is NaN)."""
    leaves = [np.ravel(np.asarray(v)) for v in jax.tree.leaves(values)]
    flat = np.concatenate(leaves) if leaves else np.zeros(0)
    if not flat.size or np.isnan(flat).any():
        return np.float64("nan")  # a NaN R-hat or ESS is a failure, not something to skip
    flat = flat if flat.dtype.kind == "f" else flat.astype(np.float64)
    return pick(flat)


def _below(value: np.floating, threshold: float) -> bool:
    # In the value's precision: a float32 R-hat printed as 1.0100 must not pass `< 1.01`.
    return bool(value < np.asarray(threshold, dtype=np.asarray(value).dtype))


def judge(
    *,
    rhat: Any,
    ess: Any,
    acceptance: float,
    num_divergent: int,
    adjusted: bool = True,
    nested: bool = False,
) -> Verdict:
    """Apply the rule of this module to a run's numbers.

    Args:
        rhat: R-hat per dimension (any array or pytree of arrays); nested R-hat if `nested`.
        ess: effective sample size per dimension (array or pytree).
        acceptance: mean acceptance over chains and steps.
        num_divergent: divergent transitions, all chains together.
        adjusted: the kernel is Metropolis-adjusted (else acceptance is not checked).
        nested: `rhat` is nested R-hat (superchains), only for the wording.

    Returns:
        A `Verdict`.

    Example:
        >>> from samplers.driver._verdict import judge
        >>> judge(rhat=[1.001], ess=[2000.0], acceptance=0.8, num_divergent=0).line
        'CONVERGED (max R-hat 1.0010 < 1.01, min ESS 2000 >= 400, 0 divergent, acceptance 0.800)'
        >>> print(judge(rhat=[1.001], ess=[2000.0], acceptance=0.0, num_divergent=12))
        NOT CONVERGED: 12 divergent transitions; acceptance 0.000 < 0.05
          - 12 divergent transitions: smaller step size (or an adaptation, which tunes it)
          - acceptance 0.000 < 0.05: smaller step size (or an adaptation, which tunes it)
    """
    name = "nested R-hat" if nested else "R-hat"
    max_rhat, min_ess = _extreme(rhat, np.max), _extreme(ess, np.min)
    acceptance, num_divergent = float(acceptance), int(num_divergent)
    tune = "smaller step size (or an adaptation, which tunes it)"
    reasons = []
    if not _below(max_rhat, RHAT_MAX):  # NaN fails too
        reasons.append(
            Reason(
                "rhat",
                max_rhat,
                f"max {name} {max_rhat:.4f} >= {RHAT_MAX}",
                "the chains have not forgotten their start: longer warmup or an adaptation"
                + ("" if nested else " (with many short chains, use superchains)"),
            )
        )
    if _below(min_ess, ESS_MIN) or np.isnan(min_ess):
        reasons.append(
            Reason(
                "ess",
                min_ess,
                f"min ESS {min_ess:.0f} < {ESS_MIN:.0f}",
                "more sampling steps or chains (or a better-tuned kernel)",
            )
        )
    if num_divergent > 0:
        reasons.append(
            Reason("divergences", num_divergent, f"{num_divergent} divergent transitions", tune)
        )
    if adjusted and not acceptance >= ACCEPTANCE_MIN:
        reasons.append(
            Reason(
                "acceptance", acceptance, f"acceptance {acceptance:.3f} < {ACCEPTANCE_MIN}", tune
            )  # fmt: skip
        )
    elif adjusted and acceptance > ACCEPTANCE_MAX:
        reasons.append(
            Reason(
                "acceptance",
                acceptance,
                f"acceptance {acceptance:.3f} > {ACCEPTANCE_MAX}",
                "larger step size or more integration steps (or an adaptation)",
            )
        )
    accepted = f", acceptance {acceptance:.3f}" if adjusted else ""
    checked = (
        f"max {name} {max_rhat:.4f} < {RHAT_MAX}, min ESS {min_ess:.0f} >= {ESS_MIN:.0f}, "
        f"{num_divergent} divergent{accepted}"
    )
    return Verdict(not reasons, tuple(reasons), checked)


def verdict_of(result: Any) -> Verdict:
    """The `Verdict` of a `samplers.Result` (nested R-hat when it used superchains).

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> result = samplers.run(samplers.RandomWalk(0.5), lambda x: -0.5 * (x**2).sum(),
        ...                       jnp.zeros((8, 2)), key=jax.random.key(0), num_steps=20,
        ...                       progress=False)
        >>> result.converged, result.verdict.reasons[0].criterion
        (False, 'rhat')
    """
    d = result.diagnostics
    nested = d.nested_rhat is not None
    return judge(
        rhat=d.nested_rhat if nested else d.rhat,
        ess=d.ess,
        acceptance=float(jnp.mean(result.acceptance_rate)),
        num_divergent=int(jnp.sum(result.num_divergent)),
        adjusted=getattr(type(result.sampler), "adjusted", True),
        nested=nested,
    )
