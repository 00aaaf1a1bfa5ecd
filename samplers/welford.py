"""Welford's running moments of one chain: the one home of the update that LAPS's
windows and the driver's `ChainMoments` (per half) both use."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

import ensemblenn as enn

__all__ = ["Welford"]


class Welford(eqx.Module):
    """Count, running mean and sum of squared deviations (`m2`) of one chain's vectors.

    Written for one chain (batching is `enn.ensemble_map`'s or `jax.vmap`'s); the unbiased
    variance is `m2 / (count - 1)`, the form `samplers.diagnostics`' `*_from_moments`
    functions take.

    Example:
        >>> import jax.numpy as jnp
        >>> from samplers.welford import Welford
        >>> w = Welford.zeros_like(jnp.zeros(2))
        >>> for x in ([1.0, 0.0], [3.0, 2.0], [5.0, 4.0]):
        ...     w = w.update(jnp.array(x))
        >>> int(w.count), w.mean.tolist(), w.variance().tolist()
        (3, [3.0, 2.0], [4.0, 4.0])
    """

    count: Int[Array, ""]
    mean: Float[Array, " dim"]
    m2: Float[Array, " dim"]

    @classmethod
    def zeros_like(cls, x: Float[Array, " dim"]) -> "Welford":
        """No vectors yet, shaped and typed like `x`."""
        return cls(jnp.zeros((), jnp.int32), jnp.zeros_like(x), jnp.zeros_like(x))

    def update(self, x: Float[Array, " dim"]) -> "Welford":
        """One more vector `x`."""
        count = self.count + 1
        # The reciprocal written out: XLA's CPU simplifier turns some (not all) divisions by
        # a broadcast scalar into such multiplications, depending on the fusion it picks for
        # the local batch, which would make the moments depend on the device count in the
        # last bit. (enn.rounded: no fused multiply-add, which XLA uses or not likewise.)
        inv_n = 1 / count.astype(x.dtype)
        delta = x - self.mean
        mean = self.mean + enn.rounded(delta * inv_n)
        return Welford(count, mean, self.m2 + enn.rounded(delta * (x - mean)))

    def variance(self) -> Float[Array, " dim"]:
        """The unbiased variance, `m2 / (count - 1)` (`m2` itself below two vectors)."""
        return self.m2 / jnp.maximum(self.count - 1, 1).astype(self.m2.dtype)
