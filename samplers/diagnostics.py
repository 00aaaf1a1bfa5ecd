"""Convergence diagnostics computed on device: R-hat, nested R-hat, ESS and the b² bias.

Every function is plain `jax.numpy` code wrapped in `jax.jit` (compiled once per shape), so
it runs eagerly or inside an outer `jax.jit`, on arrays sharded over the chains axis of an
Auto or Explicit mesh, with nothing gathered to the host. The rank-based statistics (`rhat`,
`ess`) sort over all chains, so they replicate the draws across devices; the moment-based
ones only reduce over chains.

Two families:

* From draws, shape `(num_chains, num_draws, *event)`: `rhat`, `split_rhat`, `nested_rhat`
  and `ess`. `rhat` and `ess` follow the rank-normalized definitions of Vehtari, Gelman,
  Simpson, Carpenter and Bürkner (2021), and agree with ArviZ's `az.rhat(method="rank")` and
  `az.ess(method="bulk" / "tail")` to float precision.
* From streaming per-chain moments, which is what `samplers.run` keeps instead of draws:
  `split_rhat_from_moments`, `nested_rhat_from_moments` and `ess_from_moments`. Their
  `var` arguments are the unbiased per-chain variances, `M2 / (n - 1)` of a Welford
  accumulator over the chain's `n` draws (0 when `n == 1`).

Every result has shape `event`: one number per coordinate.

Example:
    >>> import jax, samplers
    >>> draws = jax.random.normal(jax.random.key(0), (4, 500, 3))
    >>> bool((samplers.diagnostics.rhat(draws) < 1.01).all())
    True
    >>> samplers.diagnostics.ess(draws).shape
    (3,)
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, ArrayLike, Float

from ensemblenn import EnsembleError

__all__ = [
    "bias_squared",
    "ess",
    "ess_from_moments",
    "nested_rhat",
    "nested_rhat_from_moments",
    "rhat",
    "split_rhat",
    "split_rhat_from_moments",
]

Draws = Float[ArrayLike, "num_chains num_draws *event"]


# --- helpers -------------------------------------------------------------------------------


def _replicated(x: Array) -> Array:
    """`x` with no sharding in its type, so that it may be sorted or regrouped along chains.

    Only Explicit meshes need this: there sorting along, or reshaping, a sharded dimension is
    a type error. On Auto meshes and unsharded arrays the compiler inserts what it needs.
    """
    sharding = jax.typeof(x).sharding
    if (
        isinstance(sharding, NamedSharding)
        and any(spec is not None for spec in sharding.spec)
        and AxisType.Explicit in sharding.mesh.axis_types
    ):
        return jax.sharding.reshard(x, NamedSharding(sharding.mesh, P()))
    return x


def _float(x: ArrayLike) -> Array:
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(float)


def _columns(
    draws: Draws, name: str, min_draws: int, gather: bool = True
) -> tuple[Array, tuple[int, ...]]:
    """Draws as `(num_chains, num_draws, K)` with the event flattened, and the event shape.

    `gather=True` replicates the draws first, which rank normalization needs (it sorts
    over all chains); the moment-based statistics work on the sharded draws directly.
    """
    draws = _float(draws)
    if draws.ndim < 2:
        raise EnsembleError(
            f"{name} expects draws of shape (num_chains, num_draws, *event); got shape "
            f"{draws.shape}. Add a chains axis with draws[None] for a single chain."
        )
    num_chains, num_draws, *event = draws.shape
    if num_draws < min_draws:
        raise EnsembleError(
            f"{name} needs at least {min_draws} draws per chain; got shape {draws.shape} "
            f"({num_draws} draws)."
        )
    columns = (_replicated(draws) if gather else draws).reshape(
        num_chains, num_draws, math.prod(event)
    )
    return columns, tuple(event)


def _split(x: Array) -> Array:
    """Each chain's first and last halves as separate chains (the middle draw of an odd
    chain is dropped), so that a trend within chains shows up as disagreement between them."""
    half = x.shape[1] // 2
    return jnp.concatenate([x[:, :half], x[:, x.shape[1] - half :]], axis=0)


def _z_scale(x: Array) -> Array:
    """Rank-normalize each column of `x` (shape `(chains, draws, K)`) jointly over all chains.

    Average ranks for ties, Blom's offset 3/8, then the standard normal quantile.
    """
    chains, draws, k = x.shape
    flat = x.reshape(chains * draws, k)
    ordered = jnp.sort(flat, axis=0)
    search = jax.vmap(jnp.searchsorted, in_axes=(1, 1, None), out_axes=1)
    below = search(ordered, flat, "left")
    not_above = search(ordered, flat, "right")
    rank = (below + not_above + 1) / 2  # 1-based average rank
    size = chains * draws
    z = jax.scipy.special.ndtri((rank - 0.375) / (size + 0.25))
    return z.reshape(chains, draws, k).astype(x.dtype)


def _classic_rhat(x: Array) -> Array:
    """Gelman-Rubin R-hat of `(chains, draws, K)` columns, no splitting."""
    n = x.shape[1]
    within = jnp.var(x, axis=1, ddof=1).mean(axis=0)
    between_over_n = jnp.var(x.mean(axis=1), axis=0, ddof=1)
    return jnp.sqrt((n - 1) / n + between_over_n / within)


def _fold(x: Array) -> Array:
    """Distance from the median: its R-hat detects chains that differ in scale, not location."""
    return jnp.abs(x - jnp.median(x, axis=(0, 1)))


def _autocovariance(x: Array) -> Array:
    """Biased autocovariance of every chain at lags `0..draws-1`, by FFT; shape as `x`."""
    n = x.shape[1]
    centred = x - x.mean(axis=1, keepdims=True)
    size = 1 << (2 * n - 1).bit_length()  # zero padding >= 2n-1 makes the product acyclic
    spectrum = jnp.fft.rfft(centred, n=size, axis=1)
    power = (spectrum * jnp.conj(spectrum)).real
    return jnp.fft.irfft(power, n=size, axis=1)[:, :n] / n


def _geyer_ess(x: Array) -> Array:
    """Multi-chain ESS of `(chains, draws, K)` columns: Geyer's initial monotone sequence.

    The autocorrelation combines within-chain autocovariances with the between-chain variance
    (Vehtari et al. 2021, eq. 10). Pairs of lags are summed while the pair sum is positive,
    then made non-increasing. Written with masks rather than a loop so it vectorizes.
    """
    chains, n, _ = x.shape
    size = chains * n
    acov = _autocovariance(x).mean(axis=0)  # (n, K)
    within = acov[0] * n / (n - 1)
    var_plus = acov[0]
    if chains > 1:
        var_plus = var_plus + jnp.var(x.mean(axis=1), axis=0, ddof=1)
    rho = 1 - (within - acov) / var_plus
    rho = rho.at[0].set(1.0)

    num_pairs = n // 2
    pairs = rho[: 2 * num_pairs].reshape(num_pairs, 2, -1)
    pair_sums, even = pairs.sum(axis=1), pairs[:, 0]
    j = jnp.arange(num_pairs)[:, None]
    keep_going = (pair_sums > 0) & (2 * j + 1 < n - 3)
    stop = jnp.argmax(~keep_going, axis=0)  # first pair not summed; always exists
    used = j < stop
    monotone = jax.lax.cummin(jnp.where(used, pair_sums, jnp.inf), axis=0)
    total = jnp.where(used, monotone, 0.0).sum(axis=0)
    # The even lag of the stopping pair still counts once, if it is informative.
    stop_sum = jnp.take_along_axis(pair_sums, stop[None], axis=0)[0]
    stop_even = jnp.take_along_axis(even, stop[None], axis=0)[0]
    last = jnp.where(stop_sum >= 0, stop_even, jnp.maximum(stop_even, 0.0))

    tau = jnp.maximum(-1 + 2 * total + last, 1 / math.log10(size))
    result = size / tau
    result = jnp.where(jnp.isnan(rho).any(axis=0), jnp.nan, result)
    # A constant column has no autocorrelation to estimate: every draw counts.
    spread = x.max(axis=(0, 1)) - x.min(axis=(0, 1))
    return jnp.where(spread < jnp.finfo(x.dtype).resolution, size, result)


def _nested_rhat_from_stats(
    mean: Array, within_chain: Array, superchain_size: int, name: str
) -> Array:
    """Nested R-hat from per-chain means and (ddof=1, or 0 for single draws) variances."""
    num_chains = mean.shape[0]
    if superchain_size < 1 or num_chains % superchain_size:
        raise EnsembleError(
            f"{name}: num_chains={num_chains} is not divisible by "
            f"superchain_size={superchain_size}; superchains are consecutive groups of "
            "equal size."
        )
    num_superchains = num_chains // superchain_size
    if num_superchains < 2:
        raise EnsembleError(
            f"{name}: num_chains={num_chains} with superchain_size={superchain_size} gives "
            f"{num_superchains} superchain; nested R-hat compares at least 2."
        )
    grouped = _replicated(mean).reshape(num_superchains, superchain_size, *mean.shape[1:])
    within_chain = _replicated(within_chain).reshape(grouped.shape)
    superchain_mean = grouped.mean(axis=1)
    between_chain = (
        jnp.var(grouped, axis=1, ddof=1) if superchain_size > 1 else jnp.zeros_like(superchain_mean)
    )
    within_superchain = (between_chain + within_chain.mean(axis=1)).mean(axis=0)
    between_superchain = jnp.var(superchain_mean, axis=0, ddof=1)
    return jnp.sqrt(1 + between_superchain / within_superchain)


def _defined(var: Array, n: ArrayLike) -> Array:
    """An unbiased variance, or 0 where a chain holds a single draw (it is undefined)."""
    return jnp.where(jnp.asarray(n) > 1, var, 0.0)


# --- from draws ----------------------------------------------------------------------------


@jax.jit
def split_rhat(draws: Draws) -> Float[Array, " *event"]:
    """Classic split R-hat (Gelman et al., BDA3), without rank normalisation.

    Each chain is split in half and the potential scale reduction of the `2 * num_chains`
    halves is returned: `sqrt((n - 1) / n + B / (n W))` with `n` draws per half, `W` the
    mean within-half variance and `B / n` the variance of the half means (both ddof=1).
    Matches `az.rhat(method="split")`.

    Example:
        >>> import jax, samplers
        >>> draws = jax.random.normal(jax.random.key(0), (4, 200))
        >>> round(float(samplers.diagnostics.split_rhat(draws)), 2)
        1.0
    """
    x, event = _columns(draws, "split_rhat", min_draws=4, gather=False)
    return _classic_rhat(_split(x)).reshape(event)


@jax.jit
def rhat(draws: Draws) -> Float[Array, " *event"]:
    """Rank-normalized split R-hat: the larger of the bulk and the folded (tail) R-hat.

    Definition of Vehtari et al. (2021), as in `az.rhat(method="rank")`: split chains, replace
    draws by the normal scores of their ranks over all chains (bulk), and likewise for their
    absolute distance from the median (folded, sensitive to differing scales). Values above
    about 1.01 indicate that the chains have not mixed.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> draws = jax.random.normal(jax.random.key(0), (4, 200))
        >>> stuck = draws.at[0].add(3.0)  # one chain in the wrong place
        >>> float(samplers.diagnostics.rhat(stuck)) > 1.1
        True
    """
    x, event = _columns(draws, "rhat", min_draws=4)
    halves = _split(x)
    bulk = _classic_rhat(_z_scale(halves))
    tail = _classic_rhat(_z_scale(_fold(halves)))
    return jnp.maximum(bulk, tail).reshape(event)


@functools.partial(jax.jit, static_argnames="superchain_size")
def nested_rhat(draws: Draws, superchain_size: int) -> Float[Array, " *event"]:
    """Nested R-hat for many short chains (Margossian et al., Bayesian Analysis 2024).

    Chains are grouped into consecutive superchains of `superchain_size` chains (chains of
    one superchain would typically share their initial point). The statistic is
    `sqrt(1 + B_super / W_super)` where `B_super` is the variance of the superchain means and
    `W_super` the mean over superchains of the between-chain variance inside the superchain
    plus the mean within-chain variance (all ddof=1; a term is 0 when its group holds a
    single element, so `num_draws == 1` works). No chain splitting.

    Raises:
        EnsembleError: `num_chains` is not divisible by `superchain_size`, or there are
            fewer than two superchains.

    Example:
        >>> import jax, samplers
        >>> draws = jax.random.normal(jax.random.key(0), (512, 1, 2))  # one draw per chain
        >>> samplers.diagnostics.nested_rhat(draws, superchain_size=16).shape
        (2,)
    """
    x = _float(draws)
    if x.ndim < 2:
        raise EnsembleError(
            f"nested_rhat expects draws of shape (num_chains, num_draws, *event); got shape "
            f"{x.shape}."
        )
    mean = x.mean(axis=1)
    within = jnp.var(x, axis=1, ddof=1) if x.shape[1] > 1 else jnp.zeros_like(mean)
    return _nested_rhat_from_stats(mean, within, superchain_size, "nested_rhat")


@functools.partial(jax.jit, static_argnames="kind")
def ess(draws: Draws, kind: str = "bulk") -> Float[Array, " *event"]:
    """Effective sample size of the bulk or the tails, as `az.ess(method=kind)`.

    `"bulk"`: the ESS of the rank-normalized split chains, a robust measure of how well the
    centre of the distribution is estimated. `"tail"`: the smaller of the ESS of the
    indicators `x <= q05` and `x <= q95` (split chains), which measures the 5% and 95%
    quantiles. Both use the multi-chain autocorrelation (within-chain autocovariances by FFT
    combined with the between-chain variance) truncated by Geyer's initial monotone sequence.

    Example:
        >>> import jax, samplers
        >>> draws = jax.random.normal(jax.random.key(0), (4, 1000))
        >>> 3000 < float(samplers.diagnostics.ess(draws)) < 5000
        True
    """
    x, event = _columns(draws, "ess", min_draws=4)
    if kind == "bulk":
        result = _geyer_ess(_z_scale(_split(x)))
    elif kind == "tail":
        # Quantiles over every draw of a column (linear interpolation, R's type 7).
        low, high = jnp.quantile(x, jnp.array([0.05, 0.95], x.dtype), axis=(0, 1))
        result = jnp.minimum(
            _geyer_ess(_split((x <= low).astype(x.dtype))),
            _geyer_ess(_split((x <= high).astype(x.dtype))),
        )
    else:
        raise EnsembleError(f"ess kind must be 'bulk' or 'tail'; got {kind!r}.")
    return result.reshape(event)


# --- from streaming moments ----------------------------------------------------------------


@jax.jit
def split_rhat_from_moments(
    mean: Float[ArrayLike, " num_halves *event"],
    var: Float[ArrayLike, " num_halves *event"],
    n: int | ArrayLike,
) -> Float[Array, " *event"]:
    """Split R-hat from the running moments of the two halves of every chain.

    Args:
        mean: per-half means, shape `(2 * num_chains, *event)`, halves in any order.
        var: per-half unbiased variances (divisor `n - 1`), same shape.
        n: draws in each half (a number or a scalar array, e.g. a traced step count).

    Returns the same value as `split_rhat` on the draws the moments summarize.

    Example:
        >>> import jax, samplers
        >>> halves = jax.random.normal(jax.random.key(0), (8, 100))  # 4 chains x 2 halves
        >>> r = samplers.diagnostics.split_rhat_from_moments(
        ...     halves.mean(1), halves.var(1, ddof=1), 100)
        >>> round(float(r), 2)
        1.0
    """
    mean, var = _float(mean), _float(var)
    n = jnp.asarray(n, mean.dtype)
    within = _defined(var, n).mean(axis=0)
    return jnp.sqrt((n - 1) / n + jnp.var(mean, axis=0, ddof=1) / within)


@functools.partial(jax.jit, static_argnames="superchain_size")
def nested_rhat_from_moments(
    mean: Float[ArrayLike, " num_chains *event"],
    var: Float[ArrayLike, " num_chains *event"],
    n: int | ArrayLike,
    superchain_size: int,
) -> Float[Array, " *event"]:
    """Nested R-hat from per-chain running moments; see `nested_rhat`.

    Args:
        mean: per-chain means over the last `n` draws, shape `(num_chains, *event)`.
        var: per-chain unbiased variances (divisor `n - 1`), same shape; ignored when
            `n == 1`.
        n: draws per chain (a number or a scalar array).
        superchain_size: chains per superchain; superchains are consecutive chains.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> positions = jax.random.normal(jax.random.key(0), (64, 3))  # one draw per chain
        >>> r = samplers.diagnostics.nested_rhat_from_moments(
        ...     positions, jnp.zeros_like(positions), 1, superchain_size=8)
        >>> r.shape
        (3,)
    """
    mean, var = _float(mean), _float(var)
    return _nested_rhat_from_stats(
        mean, _defined(var, n), superchain_size, "nested_rhat_from_moments"
    )


@jax.jit
def ess_from_moments(
    chain_means: Float[ArrayLike, " num_chains *event"],
    chain_vars: Float[ArrayLike, " num_chains *event"],
    n: int | ArrayLike,
) -> Float[Array, " *event"]:
    """Many-chain ESS of the mean from per-chain moments: `num_chains * var_total / var_means`.

    With independent chains, `var_means` (the ddof=1 variance of the chain means) estimates
    the Monte Carlo variance of one chain's mean, so the ratio to the target variance
    `var_total` (mean within-chain variance plus `var_means`, ArviZ's `var_plus`) counts
    effective draws per chain. No autocorrelation is computed, so it needs no draws.

    Assumptions: the chains are independent and have converged (a remaining difference
    between chains reads as a low ESS, which errs on the safe side); there are enough
    chains for `var_means` to be stable (relative error about `sqrt(2 / num_chains)`).

    Not capped at the number of draws `S = num_chains * n`: anti-correlated draws (an
    HMC path that ends near the mirror image of its start) estimate the mean better than
    independent ones, and ArviZ then reports an ESS above `S` too. The one bound is
    ArviZ's: its autocorrelation time is floored at `1 / log10(S)`, so the result is
    clipped to `[0, S * max(1, log10(S))]` (for 256 chains x 1000 draws, 5.4 S). Chains
    whose means are all equal (constant chains) count every draw, `S`, as ArviZ does for a
    constant column.

    Args:
        chain_means: per-chain means, shape `(num_chains, *event)`.
        chain_vars: per-chain unbiased variances (divisor `n - 1`), same shape.
        n: draws per chain (a number or a scalar array).

    Example:
        >>> import jax, samplers
        >>> draws = jax.random.normal(jax.random.key(0), (256, 10))
        >>> e = samplers.diagnostics.ess_from_moments(draws.mean(1), draws.var(1, ddof=1), 10)
        >>> 2000 < float(e) < 3200   # about the 2560 draws: independent draws
        True
    """
    chain_means, chain_vars = _float(chain_means), _float(chain_vars)
    num_chains = chain_means.shape[0]
    n = jnp.asarray(n, chain_means.dtype)
    var_means = jnp.var(chain_means, axis=0, ddof=1)
    within = _defined(chain_vars, n).mean(axis=0) * (n - 1) / n  # divisor n, as ArviZ
    var_total = within + var_means
    size = num_chains * n
    # Identical chain means (e.g. constant chains): no evidence of error, every draw counts.
    result = jnp.where(var_means > 0, num_chains * var_total / var_means, size)
    return jnp.clip(result, 0.0, size * jnp.maximum(1.0, jnp.log10(size)))


@jax.jit
def bias_squared(
    second_moment_estimate: Float[ArrayLike, "*batch dim"],
    reference_second_moment: Float[ArrayLike, " dim"],
    reference_second_moment_var: Float[ArrayLike, " dim"],
) -> tuple[Float[Array, " *batch"], Float[Array, " *batch"]]:
    """Squared bias of second moments in units of their variance: `(b²_max, b²_mean)`.

    `b²_i = (Ê[x_i²] - E[x_i²])² / Var[x_i²]`, the metric of the MCLMC, MAMS and LAPS
    papers; `b² ≈ 1 / ESS`, so `b²_max < 0.01` corresponds to about 100 effective samples of
    every coordinate. Leading batch axes (e.g. one estimate per step) are kept.

    Example:
        >>> import jax.numpy as jnp, samplers
        >>> b2max, b2mean = samplers.diagnostics.bias_squared(
        ...     jnp.array([1.1, 2.0]), jnp.array([1.0, 2.0]), jnp.array([2.0, 8.0]))
        >>> round(float(b2max), 3), round(float(b2mean), 4)
        (0.005, 0.0025)
    """
    estimate = _float(second_moment_estimate)
    b2 = (estimate - reference_second_moment) ** 2 / reference_second_moment_var
    return b2.max(axis=-1), b2.mean(axis=-1)
