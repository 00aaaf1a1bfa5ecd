"""WindowAdaptation's repair of chains stuck far from the ensemble.

A chain can end a window stuck in the tails or a poor local region (a centred funnel's
neck, a stochastic-volatility chain whose levels never found the data) while the step
size, tuned to the ensemble-mean acceptance, is right for the others. A metric estimated
with it serves nobody, and it would bias every sampling draw it makes. Each chain keeps a
short moving average of its log density and acceptance; at the end of each window (and
of the warmup) a chain is an outlier when its average log density lies far below the
ensemble's, in robust units (median and median absolute deviation over the healthy
chains), or its acceptance far below theirs. Outliers are left out of the window's metric
and restarted at a donor chain's position (`_restart.restart_at_donors`).
"""

import math

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

import ensemblenn as enn

__all__ = ["ChainHealth", "nanmedian", "outliers"]

_MEMORY = 0.1  # moving-average weight of the newest step: about 10 steps of memory
_MAD = 1.4826  # the median absolute deviation of a Gaussian, in standard deviations
_FAR = 6.0  # robust standard deviations below the median that mark an outlier
_FAR_ACCEPTANCE = 0.1  # or accepts less than a tenth of the median chain


class ChainHealth(eqx.Module):
    """One chain's moving averages of its log density and acceptance.

    Attributes:
        logdensity: the moving average of the log density after each step.
        acceptance: the moving average of the step's acceptance.
        steps: steps averaged (the first step's value starts the average).
    """

    logdensity: Float[Array, ""]
    acceptance: Float[Array, ""]
    steps: Float[Array, ""]

    @staticmethod
    def empty() -> "ChainHealth":
        zero = jnp.float32(0.0)
        return ChainHealth(zero, zero, zero)

    def add(self, logdensity: Array, acceptance: Array) -> "ChainHealth":
        """The averages after one more step (non-finite values are not averaged in)."""
        steps = self.steps + 1.0
        w = jnp.maximum(jnp.float32(_MEMORY), 1.0 / steps)

        def average(old: Array, new: Array) -> Array:
            new = new.astype(jnp.float32)
            return jnp.where(jnp.isfinite(new), old + enn.rounded(w * (new - old)), old)

        return ChainHealth(
            average(self.logdensity, logdensity), average(self.acceptance, acceptance), steps
        )


def nanmedian(x: Float[Array, " n"]) -> Float[Array, ""]:
    """The median of the non-NaN entries of a vector (NaN if there are none): the value of
    `jnp.nanmedian`, from one sort and two reads. `jnp.nanmedian` goes through the general
    `nanquantile`, whose extra arithmetic and gathers cost a tenth of a small warmup
    program's compile time, for three medians per window.

    The middle pair is averaged as `0.5 * a + 0.5 * b`, as `nanquantile`'s linear
    interpolation does at the midpoint, so the two agree to the bit (tested).

    Example:
        >>> import jax.numpy as jnp
        >>> float(nanmedian(jnp.array([3.0, jnp.nan, 1.0, 2.0, 10.0])))
        2.5
    """
    n = jnp.sum(~jnp.isnan(x))
    ordered = jnp.sort(x)  # NaNs last
    low, high = ordered[jnp.maximum(n - 1, 0) // 2], ordered[n // 2]
    return jnp.where(n > 0, 0.5 * low + 0.5 * high, jnp.nan).astype(x.dtype)


def outliers(health: ChainHealth, eligible: Bool[Array, ""], dim: int) -> Bool[Array, ""]:
    """Whether this chain is an outlier among the `eligible` chains (one chain's view).

    Its averaged log density is below the eligible chains' median by more than
    `6 * 1.4826 * MAD` and by more than `sqrt(2 dim)` (twice the spread of a
    `dim`-dimensional Gaussian's log density: a floor for ensembles whose averages barely
    differ), or its averaged acceptance is below a tenth of the median's. Median and MAD
    are taken over every chain's values gathered in global order, so the decision is the
    same on any device count. Fewer than half of the chains can be outliers.

    Example:
        >>> import jax.numpy as jnp, ensemblenn as enn
        >>> from samplers.adaptation._window_repair import ChainHealth, outliers
        >>> lp = jnp.array([-10.0, -11.0, -9.5, -10.5, -400.0, -10.2, -9.8, -10.1])
        >>> def flag(lp):
        ...     return outliers(ChainHealth(lp, jnp.float32(0.8), jnp.float32(20)), True, 10)
        >>> enn.ensemble_map(flag, in_roles=enn.PER_CHAIN)(lp).tolist()
        [False, False, False, False, True, False, False, False]
    """
    every_lp = enn.chain_all_gather(health.logdensity)
    every_acc = enn.chain_all_gather(health.acceptance)
    every_ok = enn.chain_all_gather(eligible) & jnp.isfinite(every_lp) & jnp.isfinite(every_acc)

    def median(x: Array) -> Array:
        return nanmedian(jnp.where(every_ok, x, jnp.nan))

    lp_median = median(every_lp)
    spread = _MAD * median(jnp.abs(every_lp - lp_median))
    floor = math.sqrt(2.0 * dim)
    far = lp_median - health.logdensity > jnp.maximum(_FAR * spread, floor)
    stuck = health.acceptance < _FAR_ACCEPTANCE * median(every_acc)
    enough = jnp.sum(every_ok) >= 4  # a median of fewer chains is no ensemble
    return eligible & enough & (far | stuck) & jnp.isfinite(lp_median)
