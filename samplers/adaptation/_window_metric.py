"""WindowAdaptation's metric: per-chain window sums and the pooled ensemble estimate.

Every healthy chain adds each draw of a slow window to its own sums (around the ensemble
mean at the window's start); at the window's end the sums of the chains are reduced with
the device-count invariant collectives into a variance (`"diagonal"`), a covariance
(`"dense"`) or nutpie's `sqrt(Var[x] / Var[grad])` (`"gradient"`), shrunk like Stan's.
"""

import dataclasses

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

import ensemblenn as enn

from ..kernels import State
from ._base import finite_chain_mean
from ._restart import is_healthy

__all__ = ["WindowSums"]

_REGULARIZE = 5.0  # Stan's shrinkage: n / (n + 5) of the estimate, 5 / (n + 5) of 1e-3


class WindowSums(eqx.Module):
    """One chain's sums over the current window.

    Attributes:
        shift: `(dim,)`: the ensemble mean at the window start (sums of small deviations
            keep the variance's cancellation error small).
        sum1, sum2: sums of `x - shift` and of its square (or outer product).
        gsum1, gsum2: sums of the gradient and its square (`metric="gradient"` only, else
            None: nothing carried).
        count: this chain's healthy draws in the window.
    """

    shift: Array
    sum1: Array
    sum2: Array
    gsum1: Array | None
    gsum2: Array | None
    count: Float[Array, ""]

    @staticmethod
    def empty(metric0: Array, gradient: bool) -> "WindowSums":
        """Zero sums for a metric shaped like `metric0` (`(dim,)` or `(dim, dim)`)."""
        zeros = jnp.zeros(metric0.shape[-1:], metric0.dtype)
        return WindowSums(
            shift=zeros,
            sum1=zeros,
            sum2=jnp.zeros_like(metric0),
            gsum1=zeros if gradient else None,
            gsum2=zeros if gradient else None,
            count=jnp.zeros((), metric0.dtype),
        )

    def restart(self, state: State) -> "WindowSums":
        """Empty sums around the healthy chains' mean position."""
        x = jnp.where(is_healthy(state), state.position, jnp.nan)
        shift, _ = finite_chain_mean(x)
        shift = jnp.where(jnp.isfinite(shift), shift, 0.0).astype(self.shift.dtype)

        def zero(x: Array | None) -> Array | None:
            return None if x is None else jnp.zeros_like(x)

        return dataclasses.replace(
            self,
            shift=shift,
            sum1=zero(self.sum1),
            sum2=zero(self.sum2),
            gsum1=zero(self.gsum1),
            gsum2=zero(self.gsum2),
            count=zero(self.count),
        )

    def add(self, state: State, ok: Bool[Array, ""]) -> "WindowSums":
        """These sums plus `state`'s position (and gradient) where `ok`."""
        dtype = self.shift.dtype
        d = (state.position - self.shift).astype(dtype)
        sq = (d[:, None] * d[None, :]) if self.sum2.ndim == 2 else d * d
        sum1 = jnp.where(ok, self.sum1 + d, self.sum1)
        sum2 = jnp.where(ok, self.sum2 + sq, self.sum2)
        gsum1, gsum2 = self.gsum1, self.gsum2
        if gsum1 is not None:
            g = state.grad.astype(dtype)
            gsum1 = jnp.where(ok, gsum1 + g, gsum1)
            gsum2 = jnp.where(ok, gsum2 + enn.rounded(g * g), gsum2)  # no FMA: same bits
        count = self.count + ok.astype(dtype)
        return WindowSums(self.shift, sum1, sum2, gsum1, gsum2, count)

    def estimate(self, current: Array, metric: str, include: Bool[Array, ""] = True) -> Array:
        """The pooled window estimate (the sums of every chain where `include`: outliers
        left out), shrunk like Stan's; `current` where the estimate is not a valid
        metric."""

        def total(x: Array) -> Array:
            return enn.chain_sum(jnp.where(include, x, jnp.zeros_like(x)))

        n = total(self.count)
        s1, s2 = total(self.sum1), total(self.sum2)
        # Divides by n as a multiply by one reciprocal, and rounds each product that an
        # addition follows: XLA:CPU may turn divisions into reciprocal multiplies, or a
        # multiply and an add into one FMA, in one program and not another (the number of
        # chains per device changes it).
        inv_n = 1.0 / jnp.maximum(n, 1.0)
        mean = enn.rounded(s1 * inv_n)
        shrink = n / (n + _REGULARIZE)
        floor = 1e-3 * (_REGULARIZE / (n + _REGULARIZE))
        if metric == "dense":
            cov = enn.rounded(s2 * inv_n) - enn.rounded(mean[:, None] * mean[None, :])
            cov = 0.5 * (cov + cov.T)
            eye = jnp.eye(cov.shape[0], dtype=cov.dtype)
            new = enn.rounded(shrink * cov) + enn.rounded(floor * eye)
            ok = jnp.all(jnp.isfinite(new)) & jnp.all(jnp.diagonal(new) > 0) & (n > 1)
        else:
            var = enn.rounded(s2 * inv_n) - enn.rounded(mean * mean)
            if metric == "gradient":  # sqrt(Var[x] / Var[grad]): exact for any Gaussian's
                g_mean = enn.rounded(total(self.gsum1) * inv_n)
                g_square = enn.rounded(total(self.gsum2) * inv_n)
                g_var = g_square - enn.rounded(g_mean * g_mean)
                var = jnp.sqrt(var / g_var)
            new = enn.rounded(shrink * var) + floor
            ok = jnp.all(jnp.isfinite(new)) & jnp.all(new > 0) & (n > 1)
        return jnp.where(ok, new.astype(current.dtype), current)
