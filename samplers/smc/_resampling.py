"""Resampling of sharded SMC particles: ancestor indices, and the particles they name.

`ancestors` turns the full vector of unnormalised log weights into `N` ancestor indices;
`resample`, called inside an `enn.ensemble_map` body written for one particle, gathers
the log weights, computes the same ancestors on every device and returns this particle's
new value (its ancestor's) with the ancestor's global index.

Every scheme returns a non-decreasing ancestor vector (multinomial draws are sorted
uniforms), built from integer offspring boundaries: particle `i` gets the slots
`[C[i-1], C[i])`, and `ancestor[k] = #{i : C[i] <= k}` is an integer histogram and
cumulative sum, exact in any order. The one floating-point cumulative sum (of the
weights, and for "residual" of the residual weights) is a fixed-order scan over the whole
vector, so the ancestors are the same bits on every device count.

Schemes (`u` uniform on [0, 1), `w` the normalised weights):
  - "systematic" (default): one `u`, slots at `(k + u) / N`; each particle gets
    `floor(N w)` or `ceil(N w)` offspring.
  - "stratified": one `u_k` per slot, at `(k + u_k) / N`; between `floor(N w) - 1` and
    `ceil(N w) + 1` offspring.
  - "multinomial": `N` iid uniforms, sorted (drawn in order, as the normalised partial
    sums of `N + 1` exponential variables `-log1p(-u)`).
  - "residual": `floor(N w)` copies deterministically, then the remaining
    `R = N - sum floor(N w)` slots drawn by SYSTEMATIC resampling of the residual weights
    `N w - floor(N w)` (one `u`); so each particle also gets `floor(N w)` or `ceil(N w)`.

Weights: normalised as `exp(lw - max lw)`; a `-inf` (or NaN) log weight is weight zero
and is never an ancestor; `+inf` log weights share all the weight; if every log weight is
`-inf` the weights are taken as uniform.

Precision: the arithmetic is in the log weights' dtype. In float32 a slot boundary
`N W_i` carries a rounding error of about `N log2(N) 2^-24` slots, so for large `N` a few
particles get one copy more or fewer than exact arithmetic would give them (measured
against a float64 reference, systematic: 1 slot of 4096 differs; at 2^20 particles, 137
particles end outside `floor(N w)`/`ceil(N w)`). float64 log weights (with
`jax_enable_x64`) keep systematic and residual within floor/ceil at 2^20.

Communication per resampling (one SMC stage), per device, for `N` particles of `B` bytes
each on `D` devices (`N / D` a device), the same for every scheme (they differ only in the
`O(N)` arithmetic every device repeats on the gathered weights):
  - the log weights: `enn.chain_all_gather`, receives `4 N (D - 1) / D` bytes;
  - the particles: `enn.chain_take(particle, ancestor, reach=N / D)`. Because the ancestor
    vector is sorted, a device's ancestors usually lie in its own block or the two beside
    it; then each device receives its neighbours' blocks, `2 B N / D` bytes (`B N / D` on
    the first and last device), and when one ancestor anywhere lies further away (weight
    concentrated far from a block), every device gathers every particle instead,
    `B N (D - 1) / D` bytes. The particles taken are the same either way.

So `4 N (D - 1) / D` bytes for the weights plus at most `2 B N / D` for the particles when
the weights are spread (on 8 devices a quarter of what the all-gather moves), and at most
`(B + 4) N (D - 1) / D` in all: 1.24 MB for 4096 particles of 100 float32 on 4 devices.
On simulated CPU devices both are memory copies (~0.5 ms per resampling at that size,
`docs/benchmarks.md`, §13); the exchange pays where links are slower than memory.
"""

from typing import Any, Literal

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray, PyTree

import ensemblenn as enn

from .. import random as srandom
from .._errors import SamplerError

__all__ = ["SCHEMES", "ancestors", "resample"]

Scheme = Literal["systematic", "stratified", "multinomial", "residual"]
SCHEMES: tuple[str, ...] = ("systematic", "stratified", "multinomial", "residual")
"""The resampling schemes `ancestors` and `resample` accept."""


def _check_scheme(scheme: Any) -> str:
    if not isinstance(scheme, str) or scheme not in SCHEMES:
        valid = ", ".join(repr(s) for s in SCHEMES)
        raise SamplerError(
            f"scheme={scheme!r} is not a resampling scheme; the valid values are {valid}.\n"
            '  fix: scheme="systematic" (the default, lowest variance).'
        )
    return scheme


def _cumsum(x: Array) -> Array:
    """Inclusive cumulative sum in one fixed association order (a Blelloch-style scan of
    slices and adds, which XLA does not reorder), after rounding each term so no
    multiply is contracted into the additions."""
    return jax.lax.associative_scan(jnp.add, enn.rounded(x))


def _weights(log_weights: Array) -> Array:
    """Unnormalised weights in [0, 1], the largest exactly 1 (see the module docstring)."""
    lw = jnp.where(jnp.isnan(log_weights), -jnp.inf, log_weights)
    top = jnp.max(lw)  # exact, whatever the order
    w = jnp.where(
        jnp.isposinf(top),
        jnp.isposinf(lw).astype(lw.dtype),
        jnp.exp(lw - jnp.where(jnp.isfinite(top), top, 0.0)),
    )
    return jnp.where(jnp.isneginf(top), jnp.ones_like(w), w)


def _slots(boundaries: Array, n: int) -> Array:
    """Ancestor of each of `n` slots from the non-decreasing integer boundaries
    `C` in [0, n] (particle i owns slots `[C[i-1], C[i])`): `#{i : C[i] <= k}`."""
    hist = jnp.zeros(n + 1, jnp.int32).at[boundaries].add(1)
    return jnp.cumsum(hist[:n]).astype(jnp.int32)  # integers: exact in any order


def _boundaries_at(points: Array, fraction: Array) -> Array:
    """`#{k : points[k] < fraction[i]}` for sorted `points`; a particle whose cumulative
    fraction is the whole (1) takes every slot, whatever the rounding of the points."""
    n = points.shape[0]
    c = jnp.searchsorted(points, fraction, side="left").astype(jnp.int32)
    return jnp.where(fraction >= 1.0, n, c)


def _stratified_boundaries(fraction: Array, u: Array) -> Array:
    """`#{k : (k + u[k]) / n < fraction[i]}` without a search: with `x = n fraction`,
    every stratum below `floor(x)` lies wholly under it, and stratum `floor(x)` counts
    when `u[floor(x)] < x - floor(x)`."""
    n = u.shape[0]
    x = enn.rounded(fraction * n)
    k = jnp.clip(jnp.floor(x).astype(jnp.int32), 0, n - 1)
    c = k + (u[k] < x - k.astype(x.dtype)).astype(jnp.int32)
    return jnp.where(fraction >= 1.0, n, c)


def _systematic_boundaries(cumulative: Array, total: Array, n: Array | int, u: Array) -> Array:
    """`#{k < n : (k + u) / n < cumulative / total}` as `ceil(n c / t - u)`, clipped."""
    fraction = cumulative / jnp.where(total > 0, total, 1.0)
    c = jnp.ceil(enn.rounded(fraction * n) - u).astype(jnp.int32)
    c = jnp.clip(c, 0, n)
    return jnp.where(fraction >= 1.0, n, c)


def _draws(key: PRNGKeyArray, n: int, scheme: str) -> Array:
    """The uniforms each scheme uses: one for systematic/residual, `n` otherwise."""
    if scheme in ("systematic", "residual"):
        return srandom.uniform(key, ())
    if scheme == "multinomial":  # n + 1 uniforms, for n + 1 exponential spacings
        return srandom.uniform(key, (n + 1,))
    return srandom.uniform(key, (n,))


def _ancestors(key: PRNGKeyArray, log_weights: Array, scheme: str, num: int | None = None) -> Array:
    """`num` ancestors (default: one per weight) of the weights' particles; with `num`
    below the weights' count, waste-free SMC's `N / P` chain starts."""
    m = log_weights.shape[0] if num is None else num
    log_weights = jnp.asarray(log_weights)
    if not jnp.issubdtype(log_weights.dtype, jnp.floating):
        log_weights = log_weights.astype(jnp.float32)
    u = _draws(key, m, scheme).astype(log_weights.dtype)
    w = _weights(log_weights)
    cum = _cumsum(w)
    total = cum[-1]
    if scheme == "systematic":
        c = _systematic_boundaries(cum, total, m, u)
    elif scheme == "stratified":
        c = _stratified_boundaries(cum / total, u)
    elif scheme == "multinomial":
        # n sorted uniforms as the normalised partial sums of n + 1 exponentials: O(n),
        # where sorting 4096 uniforms took ~10x longer than all the rest on a CPU.
        spacings = _cumsum(-jnp.log1p(-u))
        c = _boundaries_at(spacings[:m] / spacings[m], cum / total)
    else:  # residual
        expected = enn.rounded(w / total * m)
        floors = jnp.floor(expected)
        fixed = jnp.cumsum(floors.astype(jnp.int32))  # integers: exact in any order
        rest = jnp.maximum(m - fixed[-1], 0)
        residual = jnp.maximum(expected - floors, 0.0)
        rcum = _cumsum(residual)
        drawn = _systematic_boundaries(rcum, rcum[-1], rest, u)
        drawn = jnp.where(rcum[-1] > 0, drawn, rest)  # nothing left to draw
        c = jnp.minimum(fixed + drawn, m)
        c = c.at[-1].set(m)  # every slot filled (rounding can leave the sum a slot short)
    return _slots(c, m)


def ancestors(
    key: PRNGKeyArray, log_weights: Float[ArrayLike, " N"], scheme: Scheme = "systematic"
) -> Int[Array, " N"]:
    """Ancestor indices for `N` particles from their unnormalised log weights.

    A pure function of `key` and the whole vector: the same bits on every device and
    device count (the one floating-point cumulative sum has a fixed order; the rest is
    integer arithmetic). The result is non-decreasing for every scheme.

    Args:
        key: a JAX PRNG key (the same one on every device).
        log_weights: the `N` unnormalised log weights; `-inf` (or NaN) is weight zero
            and never chosen. If every weight is `-inf` they are taken as uniform.
        scheme: "systematic" (default), "stratified", "multinomial", or "residual"
            (`floor(N w)` copies, then the remainder by systematic resampling of the
            residual weights).

    Returns:
        int32 ancestor indices, shape `(N,)`; particle `i` appears `N w_i` times in
        expectation.

    Raises:
        SamplerError: for an unknown `scheme`, before anything is traced.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from samplers.smc import ancestors
        >>> lw = jnp.log(jnp.array([0.5, 0.0, 0.25, 0.25]))
        >>> ancestors(jax.random.key(0), lw).tolist()
        [0, 0, 2, 3]
    """
    scheme = _check_scheme(scheme)
    return _jitted_ancestors(key, jnp.asarray(log_weights), scheme)


_jitted_ancestors = jax.jit(_ancestors, static_argnums=(2, 3))


def resample(
    key: PRNGKeyArray,
    log_weight: Float[ArrayLike, ""],
    particle: PyTree,
    *,
    scheme: Scheme = "systematic",
) -> tuple[PyTree, Int[Array, ""]]:
    """Resample the particles of an ensemble, from inside the per-particle function.

    Call it in an `enn.ensemble_map` body written for one particle. Every device gathers
    all log weights, computes the same `ancestors(key, log_weights, scheme)` once (not once
    per particle) and takes its particles' ancestors with `enn.chain_take`, from its
    neighbours' blocks when they hold them all (see the module's note on communication).
    Bitwise the same on any device count, Auto or Explicit mesh.

    Args:
        key: a key identical for every particle (a broadcast operand).
        log_weight: this particle's unnormalised log weight (a scalar).
        particle: this particle's pytree.
        scheme: see `ancestors`.

    Returns:
        `(new_particle, ancestor)`: the ancestor's pytree (same structure, shapes and
        dtypes as `particle`) and the ancestor's global index (int32).

    Raises:
        SamplerError: for an unknown `scheme`, before anything is traced.

    Example:
        >>> import jax, jax.numpy as jnp, ensemblenn as enn
        >>> from samplers.smc import resample
        >>> lw = jnp.log(jnp.array([0.0, 1.0, 0.0, 1.0]))
        >>> step = enn.ensemble_map(lambda k, w, x: resample(k, w, x),
        ...                         in_roles=(enn.BROADCAST, enn.PER_CHAIN, enn.PER_CHAIN))
        >>> x, a = step(jax.random.key(0), lw, 10.0 * jnp.arange(4.0))
        >>> a.tolist(), x.tolist()
        ([1, 1, 3, 3], [10.0, 10.0, 30.0, 30.0])
    """
    scheme = _check_scheme(scheme)
    every_lw = enn.chain_all_gather(jnp.asarray(log_weight))
    ancestor = _ancestors(key, every_lw, scheme)[enn.chain_index()]
    # Not packed with the weights: packing copies every particle once more (4096 x 100
    # floats on 4 CPU devices: 0.66 ms joint, 0.48 ms apart). The ancestors are sorted, so
    # a device's usually lie in its own block or its two neighbours'.
    reach = enn.num_chains() // enn.num_devices()
    return enn.chain_take(particle, ancestor, reach=reach), ancestor
