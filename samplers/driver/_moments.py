"""Streaming per-chain moments: what a run keeps instead of every draw."""

from typing import Any, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

import ensemblenn as enn

from ..welford import Welford


class ChainMoments(eqx.Module):
    """Running moments of one chain's positions over the sampling steps.

    Means and sums of squared deviations are kept separately for the first and second
    half of the run (Welford updates), which is what split R-hat needs; `second_moment`
    is the running mean of `x**2` over every sampling step. `observed` holds the same
    moments of the target's observable (`target.observable(x)`: the constrained parameters
    of a model, the funnel's Gaussianized coordinates), of its own dimension; None when the
    target has no observable (the observable is then `x` itself). The diagnostics of a run
    describe the observable; b² compares its second moment with the reference.

    Example:
        >>> import jax.numpy as jnp, samplers
        >>> m = samplers.ChainMoments.zeros(dim=2)
        >>> for t, x in enumerate([[1.0, 0.0], [3.0, 2.0], [5.0, 4.0], [7.0, 6.0]]):
        ...     m = m.update(jnp.array(x), half=jnp.int32(t >= 2))
        >>> m.count.tolist(), m.mean.tolist()   # per half
        ([2, 2], [[2.0, 1.0], [6.0, 5.0]])
        >>> m.chain_mean_var()[0].tolist()      # the whole chain
        [4.0, 3.0]
    """

    count: Int[Array, "2"] = enn.per_chain()
    mean: Float[Array, "2 dim"] = enn.per_chain()
    m2: Float[Array, "2 dim"] = enn.per_chain()
    second_moment: Float[Array, " dim"] = enn.per_chain()
    observed: Optional["ChainMoments"] = enn.per_chain(default=None)

    @classmethod
    def zeros(
        cls,
        dim: int,
        dtype: jnp.dtype = jnp.float32,
        observable_dim: int | None = None,
        observable_dtype: jnp.dtype | None = None,
    ) -> "ChainMoments":
        """No steps yet; `observable_dim` (None: no separate observable) sizes `observed`."""
        observed = None
        if observable_dim is not None:
            observed = cls.zeros(observable_dim, observable_dtype or dtype)
        return cls(
            count=jnp.zeros(2, jnp.int32),
            mean=jnp.zeros((2, dim), dtype),
            m2=jnp.zeros((2, dim), dtype),
            second_moment=jnp.zeros(dim, dtype),
            observed=observed,
        )

    def update(
        self,
        x: Float[Array, " dim"],
        half: Int[Array, ""],
        observed: Float[Array, " obs"] | None = None,
    ) -> "ChainMoments":
        """One more sampling step at `x` (and the observable's value `observed`, which is
        required when these moments track one) in half `half` (0 or 1)."""
        # Both halves are updated (the shared arithmetic of `Welford.update`) and the other
        # one selected away: a dynamic-index update of one half costs a slow fusion per
        # field on CPU, while this is a few elementwise kernels.
        this = jnp.arange(2) == half
        both = jax.vmap(Welford.update, in_axes=(0, None))(
            Welford(self.count, self.mean, self.m2), x
        )
        count = jnp.where(this, both.count, self.count)
        mean = jnp.where(this[:, None], both.mean, self.mean)
        m2 = jnp.where(this[:, None], both.m2, self.m2)
        inv_total = 1 / count.sum().astype(x.dtype)  # as in Welford.update
        second = self.second_moment + enn.rounded(
            (enn.rounded(x * x) - self.second_moment) * inv_total
        )
        obs = None if self.observed is None else self.observed.update(observed, half)
        return ChainMoments(count, mean, m2, second, obs)

    @property
    def observable(self) -> "ChainMoments":
        """The observable's moments (these moments themselves without one)."""
        return self if self.observed is None else self.observed

    @property
    def observable_second_moment(self) -> Float[Array, " obs"]:
        """The running mean of `observable(x)**2`, which b² compares with the reference."""
        return self.observable.second_moment

    def chain_mean_var(self) -> tuple[Float[Array, " dim"], Float[Array, " dim"]]:
        """Mean and (unbiased) variance of the whole chain, pooling both halves."""
        n = self.count.astype(self.mean.dtype)
        total = n.sum()
        mean = (n[:, None] * self.mean).sum(0) / jnp.maximum(total, 1.0)
        between = (n[:, None] * (self.mean - mean) ** 2).sum(0)
        var = (self.m2.sum(0) + between) / jnp.maximum(total - 1.0, 1.0)
        return mean, var

    def half_mean_var(self) -> tuple[Float[Array, "2 dim"], Float[Array, "2 dim"]]:
        """Per-half means and unbiased variances."""
        halves = Welford(self.count, self.mean, self.m2)
        return self.mean, jax.vmap(Welford.variance)(halves)


class StreamingSums(eqx.Module):
    """What a run's chunks carry per chain instead of `ChainMoments`: sums per half.

    A step adds `x - shift` and its square to its half's sums (two fused additions),
    where a Welford update of `ChainMoments` costs a division and a select per field (9 of
    a MALA step's 32 XLA kernels on CPU, each a launch on a GPU). `shift` is the chain's
    position at its first sampling step, inside its typical set, so the sums of squares
    lose no precision to cancellation. The sums are added in step order whatever the
    chunking; `moments` turns them into `ChainMoments` once, at the end of the run.
    """

    shift: Float[Array, " dim"] = enn.per_chain()
    sum: Float[Array, "2 dim"] = enn.per_chain()
    sum_sq: Float[Array, "2 dim"] = enn.per_chain()
    observed: Optional["StreamingSums"] = enn.per_chain(default=None)

    @classmethod
    def zeros(
        cls,
        dim: int,
        dtype: jnp.dtype = jnp.float32,
        observable_dim: int | None = None,
        observable_dtype: jnp.dtype | None = None,
    ) -> "StreamingSums":
        observed = None
        if observable_dim is not None:
            observed = cls.zeros(observable_dim, observable_dtype or dtype)
        zeros = jnp.zeros((2, dim), dtype)
        return cls(jnp.zeros(dim, dtype), zeros, zeros, observed)

    def add(
        self,
        x: Float[Array, " dim"],
        half: Int[Array, ""],
        first: Any,
        sampling: Any = True,
        observed: Float[Array, " obs"] | None = None,
    ) -> "StreamingSums":
        """One more step at `x` in half `half` (0 or 1); `first` marks the first sampling
        step (its `x` becomes the shift); steps with `sampling` False add nothing."""
        shift = jnp.where(first, x, self.shift)
        delta = x - shift
        this = ((jnp.arange(2) == half) & sampling)[:, None]
        total = self.sum + jnp.where(this, delta, 0)
        squares = self.sum_sq + jnp.where(this, enn.rounded(delta * delta), 0)
        obs = None
        if self.observed is not None:
            obs = self.observed.add(observed, half, first, sampling)
        return StreamingSums(shift, total, squares, obs)

    def moments(self, count: Int[Array, "2"]) -> ChainMoments:
        """The `ChainMoments` of `count` steps per half (what `add` was given)."""
        dtype = self.sum.dtype
        n = jnp.asarray(count, jnp.int32)
        inv = 1 / jnp.maximum(n, 1).astype(dtype)[:, None]
        mean = self.shift + enn.rounded(self.sum * inv)
        m2 = jnp.maximum(self.sum_sq - enn.rounded(enn.rounded(self.sum * self.sum) * inv), 0)
        # Σx² = Σ(d + shift)² over both halves, from the same sums.
        sum_x2 = (
            self.sum_sq.sum(0)
            + enn.rounded(2 * self.shift * self.sum.sum(0))
            + enn.rounded(n.sum().astype(dtype) * enn.rounded(self.shift * self.shift))
        )
        second = enn.rounded(sum_x2 * (1 / jnp.maximum(n.sum(), 1).astype(dtype)))
        observed = None if self.observed is None else self.observed.moments(count)
        return ChainMoments(n, mean, m2, second, observed)
