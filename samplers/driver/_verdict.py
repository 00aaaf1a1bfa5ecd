"""Whether a run can be trusted: one documented rule, shared by `Result` and the CLI.

The rule (`judge`): a run is **converged** only if all of these hold.

1. **R-hat.** The largest R-hat over dimensions is below `RHAT_MAX` = 1.01. With
   superchains (`samplers.run(superchain_size=...)`, or chosen automatically for many short
   chains: `automatic_superchain_size`) that is the nested R-hat, else the split R-hat.
2. **ESS.** The smallest effective sample size over dimensions (all chains' sampling draws
   together) is at least `ESS_MIN` = 400.
3. **Divergences.** No transition of any chain diverged (warmup and sampling); the count is
   reported with its rate, the percentage of those transitions, as NumPyro and Stan do.
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

Superchains chosen automatically (`automatic_superchain_size`, applied by `samplers.run`
when `superchain_size` is None). A run of at least `AUTO_MIN_CHAINS` = 64 chains and fewer
than `AUTO_MAX_STEPS` = 1000 sampling steps is read with nested R-hat over consecutive
superchains of `k` chains, `k` the largest of 8, 7, 6, 5, 4 that divides the chains into
at least `AUTO_MIN_SUPERCHAINS` = 16 superchains (128 chains: 16 of 8; 64: 16 of 4; a count
with no such divisor keeps split R-hat). Why these numbers:

* **Fewer than 1000 steps.** Split R-hat's stationary excess `tau / n` stays above the 0.01
  margin for every coordinate with `tau > n / 100`: under 1000 steps that is any `tau`
  above 10 (at 300 steps, above 3), so healthy short runs would fail. Long runs keep split
  R-hat, the standard reading of few long chains (Vehtari et al., 2021): it also sees a
  drift inside each chain, which superchain means do not.
* **At most 8 chains per superchain.** Nested R-hat's excess is about `tau / (2 k n)`,
  below 0.01 once `n > 50 tau / k`: `n > 6 tau` at `k = 8`. With chains started at their
  own points (as `samplers.run`'s positions usually are), the spread of the chain means
  that the initialisation leaves is averaged over `k` chains too, so a larger `k` would
  make the 1.01 threshold laxer: `k` stays fixed, and more chains make more superchains.
* **At least 16 superchains of at least 4 chains (so 64 chains).** The variance of the
  superchain means is estimated from the superchains: with 16, its relative error is about
  `sqrt(2 / 15)` = 0.37; with fewer, the verdict near 1.01 is mostly noise. 4 chains per
  superchain keep the stationary excess below 0.01 from `n > 12 tau` (2 would need
  `n > 25 tau`, the regime that needs superchains is `n` of a few hundred).

An explicit `superchain_size` always wins; `superchain_size=0` turns the automatic choice
off (split R-hat, no nested R-hat). `Result.summary` says which R-hat the verdict read and
whether its superchains were chosen automatically.

Otherwise the verdict is NOT CONVERGED, with each failed criterion, its value and the
likely fix (`fixes`), naming what to change: `samplers.run`'s arguments (`num_warmup=`,
`adaptation=samplers.WindowAdaptation()`, ...) for the library, the flags (`--warmup`,
`--steps`, ...) for the command line (`hints="cli"`). The fixes fit what ran: without an
adaptation, a longer warmup or an adaptation for R-hat, more steps or chains for ESS, a
smaller step (or an adaptation, which tunes it) for divergences and low acceptance, a larger
step for an acceptance near 1; after an adaptation (`Result.adapted`), never "an
adaptation" again but what to change in it: a longer one, or its target acceptance.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import SamplerError

RHAT_MAX = 1.01
ESS_MIN = 400.0
ACCEPTANCE_MIN = 0.05
ACCEPTANCE_MAX = 0.995
# Automatic superchains (see the module docstring for why these numbers).
AUTO_MIN_CHAINS = 64
AUTO_MAX_STEPS = 1000
AUTO_MIN_SUPERCHAINS = 16
AUTO_CHAINS_PER_SUPERCHAIN = (8, 7, 6, 5, 4)  # the first that divides the chains

__all__ = [
    "ConvergenceWarning",
    "Reason",
    "Verdict",
    "automatic_superchain_size",
    "divergence_rate",
    "fixes",
    "judge",
    "num_transitions",
    "superchain_description",
    "verdict_of",
]


def automatic_superchain_size(num_chains: int, num_steps: int) -> int | None:
    """The superchain size `samplers.run` picks when `superchain_size` is None: `k` chains
    per superchain for many short chains (nested R-hat in the verdict), else None (split
    R-hat). The rule and why: this module's docstring.

    Args:
        num_chains: the run's chains.
        num_steps: its sampling steps (the draws the diagnostics read).

    Returns:
        The chains per superchain, or None.

    Example:
        >>> from samplers.driver._verdict import automatic_superchain_size
        >>> automatic_superchain_size(128, 300), automatic_superchain_size(64, 300)
        (8, 4)
        >>> automatic_superchain_size(128, 5000), automatic_superchain_size(8, 300)  # split
        (None, None)
        >>> automatic_superchain_size(100, 300), automatic_superchain_size(67, 300)
        (5, None)
    """
    if num_chains < AUTO_MIN_CHAINS or num_steps >= AUTO_MAX_STEPS:
        return None
    for k in AUTO_CHAINS_PER_SUPERCHAIN:
        if num_chains % k == 0 and num_chains // k >= AUTO_MIN_SUPERCHAINS:
            return k
    return None


def superchain_description(num_chains: int, superchain_size: int | None, automatic: bool) -> str:
    """Which R-hat the verdict reads, in words (`Result.summary`).

    Example:
        >>> from samplers.driver._verdict import superchain_description
        >>> superchain_description(128, 8, True)
        'nested R-hat, 16 superchains of 8 chains (automatic)'
        >>> superchain_description(64, 16, False), superchain_description(8, None, False)
        ('nested R-hat, 4 superchains of 16 chains (superchain_size=16)', 'split R-hat')
    """
    if superchain_size is None:
        return "split R-hat"
    how = "automatic" if automatic else f"superchain_size={superchain_size}"
    return (
        f"nested R-hat, {num_chains // superchain_size} superchains of {superchain_size} "
        f"chains ({how})"
    )


def divergence_rate(num_divergent: int, num_transitions: int) -> str:
    """The rate of `num_divergent` divergences in `num_transitions`, as NumPyro and Stan
    report it beside the count.

    Example:
        >>> from samplers.driver._verdict import divergence_rate
        >>> divergence_rate(12, 12800), divergence_rate(0, 38400), divergence_rate(50, 100)
        ('0.094% of 12,800', '0% of 38,400', '50.0% of 100')
    """
    percent = 100.0 * num_divergent / max(num_transitions, 1)
    shown = f"{percent:.1f}" if percent >= 1 else f"{percent:.2g}"
    return f"{shown}% of {num_transitions:,}"


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


ConvergenceWarning.__module__ = "samplers"  # its public name in tracebacks and docs


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
    CLI: converged only if max R-hat < 1.01 (nested R-hat when the run used superchains,
    given or chosen automatically for many short chains: split R-hat of many short chains
    stays about `1 + tau / n` above 1 even at stationarity, nested R-hat does not), min
    ESS >= 400 (all chains' sampling draws), no divergent transitions, and for
    Metropolis-adjusted kernels (`Sampler.adjusted`) a mean acceptance in [0.05, 0.995].

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


HINTS = ("library", "cli")
_TUNE = "adaptation=samplers.WindowAdaptation()"


def fixes(*, adapted: bool, hints: str = "library", nested: bool = False) -> dict[str, str]:
    """The fix of each criterion (`Reason.fix`) for a run that did or did not run an
    adaptation, naming `samplers.run`'s arguments (`hints="library"`) or the command
    line's flags (`hints="cli"`). Keys: "rhat", "ess", "divergences", "acceptance_low",
    "acceptance_high".

    Example:
        >>> from samplers.driver._verdict import fixes
        >>> fix = fixes(adapted=False)["divergences"]   # no adaptation ran: suggest one
        >>> fix.startswith("smaller step size"), "adaptation=samplers.WindowAdaptation()" in fix
        (True, True)
        >>> "adaptation" in fixes(adapted=True)["rhat"].replace("a longer adaptation", "")
        False
        >>> print(fixes(adapted=True, hints="cli")["ess"])
        more sampling steps (--steps) or chains (--chains)
    """
    if hints not in HINTS:
        raise SamplerError(f'hints must be "library" or "cli", got {hints!r}.')
    start = "the chains have not forgotten their start: "
    if hints == "cli":
        superchains = "" if nested else " (with many short chains: --superchain-size K)"
        if adapted:
            return {
                "rhat": start + "more tuning steps (--warmup) or sampling steps (--steps)"
                + superchains,
                "ess": "more sampling steps (--steps) or chains (--chains)",
                "divergences": "smaller step size: more tuning steps (--warmup), another "
                "metric (--metric) or sampler (--sampler)",
                "acceptance_low": "smaller step size: more tuning steps (--warmup), another "
                "metric (--metric) or sampler (--sampler)",
                "acceptance_high": "larger step size: more tuning steps (--warmup)",
            }  # fmt: skip
        return {
            "rhat": start + "longer warmup (--warmup) or tuning (--adaptation default)"
            + superchains,
            "ess": "more sampling steps (--steps) or chains (--chains), or a tuned kernel "
            "(--adaptation default)",
            "divergences": "smaller step size: tune it (--adaptation default)",
            "acceptance_low": "smaller step size: tune it (--adaptation default)",
            "acceptance_high": "larger step size: tune it (--adaptation default)",
        }  # fmt: skip
    superchains = "" if nested else " (with many short chains, use superchains: superchain_size=)"
    if adapted:
        smaller = (
            "smaller step size: a higher target acceptance for the adaptation (its "
            "target_acceptance=, e.g. 0.9) or a longer adaptation"
        )
        return {
            "rhat": start + "a longer adaptation (its num_steps=; num_steps1= for LAPS), "
            "warmup steps after it (num_warmup=) or more sampling steps (num_steps=)"
            + superchains,
            "ess": "more sampling steps (num_steps=) or chains (rows of positions)",
            "divergences": smaller,
            "acceptance_low": smaller,
            "acceptance_high": "larger step size: a lower target acceptance for the "
            "adaptation (its target_acceptance=) or a longer adaptation",
        }  # fmt: skip
    smaller = (
        f"smaller step size (the sampler's step_size=), or an adaptation, which tunes it ({_TUNE})"
    )
    return {
        "rhat": start + f"longer warmup (num_warmup=) or an adaptation ({_TUNE})" + superchains,
        "ess": "more sampling steps (num_steps=) or chains (rows of positions), or a tuned "
        f"kernel ({_TUNE})",
        "divergences": smaller,
        "acceptance_low": smaller,
        "acceptance_high": "larger step size (step_size=) or more integration steps, or an "
        f"adaptation, which tunes them ({_TUNE})",
    }  # fmt: skip


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
    num_transitions: int | None = None,
    adapted: bool = False,
    hints: str = "library",
) -> Verdict:
    """Apply the rule of this module to a run's numbers.

    Args:
        rhat: R-hat per dimension (any array or pytree of arrays); nested R-hat if `nested`.
        ess: effective sample size per dimension (array or pytree).
        acceptance: mean acceptance over chains and steps.
        num_divergent: divergent transitions, all chains together.
        adjusted: the kernel is Metropolis-adjusted (else acceptance is not checked).
        nested: `rhat` is nested R-hat (superchains), only for the wording.
        num_transitions: the transitions `num_divergent` counts (chains x steps), for the
            divergence rate; None reports the count alone.
        adapted: an adaptation tuned the kernel: the fixes then do not suggest one.
        hints: the fixes name `samplers.run`'s arguments ("library") or the command line's
            flags ("cli"); see `fixes`.

    Returns:
        A `Verdict`.

    Example:
        >>> from samplers.driver._verdict import judge
        >>> judge(rhat=[1.001], ess=[2000.0], acceptance=0.8, num_divergent=0).line
        'CONVERGED (max R-hat 1.0010 < 1.01, min ESS 2000 >= 400, 0 divergent, acceptance 0.800)'
        >>> v = judge(rhat=[1.001], ess=[2000.0], acceptance=0.0, num_divergent=12)
        >>> print(v.line)
        NOT CONVERGED: 12 divergent transitions; acceptance 0.000 < 0.05
        >>> print(v.lines()[1])  # doctest: +ELLIPSIS
          - 12 divergent transitions: smaller step size (the sampler's step_size=), or an ...
        >>> v = judge(rhat=[1.2], ess=[2000.0], acceptance=0.8, num_divergent=0, adapted=True,
        ...           nested=True, hints="cli")   # after an adaptation, for the CLI
        >>> print(v.reasons[0].fix)  # doctest: +ELLIPSIS
        the chains have not forgotten their start: more tuning steps (--warmup) or ...
        >>> judge(rhat=[1.001], ess=[2000.0], acceptance=0.8, num_divergent=12,
        ...       num_transitions=12800).line
        'NOT CONVERGED: 12 divergent transitions (0.094% of 12,800)'
    """
    name = "nested R-hat" if nested else "R-hat"
    max_rhat, min_ess = _extreme(rhat, np.max), _extreme(ess, np.min)
    acceptance, num_divergent = float(acceptance), int(num_divergent)
    fix = fixes(adapted=adapted, hints=hints, nested=nested)
    reasons = []
    if not _below(max_rhat, RHAT_MAX):  # NaN fails too
        reasons.append(
            Reason("rhat", max_rhat, f"max {name} {max_rhat:.4f} >= {RHAT_MAX}", fix["rhat"])
        )
    if _below(min_ess, ESS_MIN) or np.isnan(min_ess):
        reasons.append(Reason("ess", min_ess, f"min ESS {min_ess:.0f} < {ESS_MIN:.0f}", fix["ess"]))
    if num_divergent > 0:
        problem = f"{num_divergent} divergent transitions"
        if num_transitions is not None:
            problem += f" ({divergence_rate(num_divergent, num_transitions)})"
        reasons.append(Reason("divergences", num_divergent, problem, fix["divergences"]))
    if adjusted and not acceptance >= ACCEPTANCE_MIN:
        problem = f"acceptance {acceptance:.3f} < {ACCEPTANCE_MIN}"
        reasons.append(Reason("acceptance", acceptance, problem, fix["acceptance_low"]))
    elif adjusted and acceptance > ACCEPTANCE_MAX:
        problem = f"acceptance {acceptance:.3f} > {ACCEPTANCE_MAX}"
        reasons.append(Reason("acceptance", acceptance, problem, fix["acceptance_high"]))
    accepted = f", acceptance {acceptance:.3f}" if adjusted else ""
    checked = (
        f"max {name} {max_rhat:.4f} < {RHAT_MAX}, min ESS {min_ess:.0f} >= {ESS_MIN:.0f}, "
        f"{num_divergent} divergent{accepted}"
    )
    return Verdict(not reasons, tuple(reasons), checked)


def adapted(result: Any) -> bool:
    """Whether an adaptation tuned `result`'s kernel: `result.adapted` when it says,
    else whether it carries an adaptation's info."""
    ran = getattr(result, "adapted", None)
    if ran is None:
        return getattr(result, "adaptation_info", None) is not None
    return bool(ran)


def verdict_of(result: Any, hints: str = "library") -> Verdict:
    """The `Verdict` of a `samplers.Result` (nested R-hat when it used superchains), its
    fixes fitting whether an adaptation ran and naming the library's arguments or the
    command line's flags (`hints`, see `fixes`).

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
        # jnp: with several processes the per-chain arrays are global, beyond np's reach.
        acceptance=float(jnp.mean(result.acceptance_rate)),
        num_divergent=int(jnp.sum(result.num_divergent)),
        adjusted=getattr(type(result.sampler), "adjusted", True),
        nested=nested,
        num_transitions=num_transitions(result),
        adapted=adapted(result),
        hints=hints,
    )


def num_transitions(result: Any) -> int | None:
    """The transitions `result.num_divergent` counts: every chain's sampling steps (not
    its warmup's nor an adaptation's); None when the result does not say."""
    steps = getattr(result, "num_steps", 0)
    return int(np.size(result.num_divergent)) * steps if steps else None
