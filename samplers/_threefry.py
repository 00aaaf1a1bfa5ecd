"""Threefry-2x32, unrolled: the implementation behind `samplers.random`, the one module
the rest of the package imports (nothing else imports this one).

`jax.random` lowers Threefry on CPU as a rolled loop of five iterations, whose fixed cost
per iteration dominates when a step needs a few numbers for each of a few hundred chains
(measured: one `fold_in` per step was ~60 µs of a 140 µs Stretch step, 256 walkers; the
hash was ~60 % of a 100-d normal draw for 512 chains). Written out as straight-line integer
arithmetic the same hash fuses into one kernel.

`fold_in`, `split`, `uniform`, `bernoulli` and `randint` give the very bits of their
`jax.random` namesakes, and `normal` applies JAX's own transform to those uniforms (tests
compare them), so the driver and the kernels use them without changing any stream.
`uniforms` is this module's own stream (counters `0, 1, ...` under the walker's key), not
`jax.random.uniform`'s: what matters is that each walker's numbers depend only on its key,
never on the batch it is computed in (integer arithmetic is exact).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, UInt32

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _rotate_left(x: UInt32[Array, "..."], r: int) -> UInt32[Array, "..."]:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(
    key: UInt32[Array, " 2"], x0: UInt32[Array, " n"], x1: UInt32[Array, " n"]
) -> tuple[UInt32[Array, " n"], UInt32[Array, " n"]]:
    """The Threefry-2x32 block cipher (20 rounds; Salmon et al. 2011) of `(x0, x1)`."""
    k0, k1 = key[0], key[1]
    schedule = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0, x1 = x0 + k0, x1 + k1
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = _rotate_left(x1, r) ^ x0
        x0 = x0 + schedule[(i + 1) % 3]
        x1 = x1 + schedule[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def fold_in(key: PRNGKeyArray, data: int | Array) -> PRNGKeyArray:
    """`jax.random.fold_in(key, data)`, bit for bit, as one fused kernel for a Threefry key
    (a key of another implementation goes to `jax.random.fold_in`).

    Example:
        >>> import jax, numpy as np, samplers
        >>> key = jax.random.key(0)
        >>> mine, theirs = samplers.random.fold_in(key, 7), jax.random.fold_in(key, 7)
        >>> bool(np.array_equal(jax.random.key_data(mine), jax.random.key_data(theirs)))
        True
    """
    data = jnp.asarray(data)
    if not _is_threefry(key) or key.shape != () or data.dtype.itemsize > 4:
        return jax.random.fold_in(key, data)
    return _counter_keys(key, data.astype(jnp.uint32).reshape(1))[0]


def split(key: PRNGKeyArray, num: int = 2) -> PRNGKeyArray:
    """`jax.random.split(key, num)`, bit for bit, as one fused kernel for a Threefry key
    under JAX's default `jax_threefry_partitionable=True` (where the `i`-th key is
    `fold_in(key, i)`); anything else goes to `jax.random.split`.

    Example:
        >>> import jax, numpy as np, samplers
        >>> key = jax.random.key(0)
        >>> mine, theirs = samplers.random.split(key, 3), jax.random.split(key, 3)
        >>> bool(np.array_equal(jax.random.key_data(mine), jax.random.key_data(theirs)))
        True
    """
    if not (_is_threefry(key) and key.shape == () and _partitionable()):
        return jax.random.split(key, num)
    return _counter_keys(key, jnp.arange(num, dtype=jnp.uint32))


def uniform(
    key: PRNGKeyArray, shape: tuple[int, ...] = (), dtype: jnp.dtype = jnp.float32
) -> Float[Array, "..."]:
    """`jax.random.uniform(key, shape, dtype)` in `[0, 1)`, bit for bit, as one fused kernel
    for a float32 draw from a Threefry key (anything else goes to `jax.random`).

    Example:
        >>> import jax, numpy as np, samplers
        >>> key = jax.random.key(3)
        >>> mine = samplers.random.uniform(key, (5,))
        >>> bool(np.array_equal(mine, jax.random.uniform(key, (5,))))
        True
    """
    if not _draws_here(key, shape, dtype):
        return jax.random.uniform(key, shape, dtype)
    return _unit_floats(key, shape)


def normal(
    key: PRNGKeyArray, shape: tuple[int, ...] = (), dtype: jnp.dtype = jnp.float32
) -> Float[Array, "..."]:
    """`jax.random.normal(key, shape, dtype)`, with the bits as one fused kernel for a
    float32 draw from a Threefry key (anything else goes to `jax.random`).

    The transform is JAX's own (the same uniform in `(-1, 1)`, bit for bit, then
    `sqrt(2) erf_inv`); only the Threefry hash is written out (on CPU, JAX's rolled loop
    cost ~60 % of a 100-d draw). `erf_inv`'s last bits can depend on how XLA fuses it
    (up to 3 ulp seen with the newest JAX on CPU); within one program they depend only on
    the chain's key, as before.

    Example:
        >>> import jax, numpy as np, samplers
        >>> key = jax.random.key(3)
        >>> mine = samplers.random.normal(key, (5,))
        >>> bool(np.array_equal(mine, jax.random.normal(key, (5,))))
        True
    """
    if not _draws_here(key, shape, dtype):
        return jax.random.normal(key, shape, dtype)
    lo = jnp.float32(np.nextafter(np.float32(-1.0), np.float32(0.0)))
    # JAX scales by `1 - lo`, which rounds to exactly 2 in float32: `2 u + lo` has a single
    # rounding, the same with or without a fused multiply-add.
    u = jax.lax.max(lo, _unit_floats(key, shape) * jnp.float32(2.0) + lo)
    return jnp.float32(np.sqrt(2)) * jax.lax.erf_inv(u)


def bernoulli(
    key: PRNGKeyArray, p: float | Array = 0.5, shape: tuple[int, ...] | None = None
) -> Bool[Array, "..."]:
    """`jax.random.bernoulli(key, p, shape)`, bit for bit: `uniform(key, shape) < p` in
    `p`'s dtype, as JAX draws it (its default `mode="low"`), the uniform as one fused kernel
    for a float32 `p` and a Threefry key (anything else goes to `jax.random`).

    Example:
        >>> import jax, numpy as np, samplers
        >>> key = jax.random.key(3)
        >>> mine = samplers.random.bernoulli(key, 0.3, (6,))
        >>> bool(np.array_equal(mine, jax.random.bernoulli(key, 0.3, (6,))))
        True
    """
    dtype = jnp.result_type(p)
    if dtype != jnp.float32:
        return jax.random.bernoulli(key, p, shape)
    p = jnp.asarray(p, dtype)
    return uniform(key, p.shape if shape is None else tuple(shape), dtype) < p


def randint(
    key: PRNGKeyArray,
    shape: tuple[int, ...],
    minval: int | Array,
    maxval: int | Array,
    dtype: jnp.dtype | None = None,
) -> Int[Array, "..."]:
    """`jax.random.randint(key, shape, minval, maxval, dtype)` in `[minval, maxval)`, bit
    for bit, with the bits as one fused kernel for an int32 draw with int32 bounds from a
    Threefry key (anything else, such as the int64 default under `jax_enable_x64`, goes to
    `jax.random`).

    JAX's method, exactly: two 32-bit words per number (from the two keys of
    `split(key)`), reduced modulo the span in unsigned integer arithmetic.

    Example:
        >>> import jax, numpy as np, samplers
        >>> key = jax.random.key(3)
        >>> mine = samplers.random.randint(key, (6,), 1, 10)
        >>> bool(np.array_equal(mine, jax.random.randint(key, (6,), 1, 10)))
        True
    """
    shape = tuple(shape)
    lo, hi = jnp.asarray(minval), jnp.asarray(maxval)
    int32 = jax.dtypes.canonicalize_dtype(int if dtype is None else dtype) == jnp.int32
    bounds32 = lo.dtype == jnp.int32 and hi.dtype == jnp.int32
    if not (int32 and bounds32 and _draws_here(key, shape, jnp.float32)):
        return jax.random.randint(key, shape, minval, maxval, dtype)
    # The int32 case of JAX's `_randint`: the clipping to the dtype's range is the
    # identity for int32 bounds, and `maxval` cannot lie past it.
    lo, hi = jnp.broadcast_to(lo, shape), jnp.broadcast_to(hi, shape)
    key_high, key_low = split(key)
    higher_bits, lower_bits = _bits32(key_high, shape), _bits32(key_low, shape)
    span = jax.lax.convert_element_type(hi - lo, jnp.uint32)
    span = jnp.where(hi <= lo, jnp.ones_like(span), span)  # an empty range gives minval
    # 2**32 % span as (2**16 % span)**2 % span, in uint32 (wrapping) as JAX does.
    multiplier = jax.lax.rem(jnp.full_like(span, 2**16), span)
    multiplier = jax.lax.rem(multiplier * multiplier, span)
    offset = jax.lax.rem(higher_bits, span) * multiplier + jax.lax.rem(lower_bits, span)
    return lo + jax.lax.convert_element_type(jax.lax.rem(offset, span), jnp.int32)


def _unit_floats(key: PRNGKeyArray, shape: tuple[int, ...]) -> Float[Array, "..."]:
    # As `jax.random.uniform` does it: the top 23 bits as the mantissa of a float in [1, 2).
    mantissa = (_bits32(key, shape) >> np.uint32(9)) | np.uint32(0x3F800000)
    return jax.lax.bitcast_convert_type(mantissa, jnp.float32) - jnp.float32(1.0)


def _draws_here(key: PRNGKeyArray, shape: tuple[int, ...], dtype: jnp.dtype) -> bool:
    # Past 2^32 numbers JAX's counters need their high word: left to jax.random.
    small = int(np.prod(shape, dtype=np.int64)) < 2**32
    threefry = _is_threefry(key) and key.shape == () and _partitionable()
    return threefry and small and dtype == jnp.float32


def _partitionable() -> bool:
    # A JAX without the flag has only the partitionable mode.
    return getattr(jax.config, "jax_threefry_partitionable", True)


def _bits32(key: PRNGKeyArray, shape: tuple[int, ...]) -> UInt32[Array, "..."]:
    """`jax.random.bits(key, shape)`: the hash of the flat index, the two words xor-ed."""
    a, b = _hash_counters(key, jnp.arange(int(np.prod(shape)), dtype=jnp.uint32))
    return (a ^ b).reshape(shape)


def _counter_keys(key: PRNGKeyArray, low: UInt32[Array, " n"]) -> PRNGKeyArray:
    """The keys `jax.random` derives from `key` for the 32-bit counters `low`: the hash of
    each counter pair (high word 0, low word), one key per counter."""
    a, b = _hash_counters(key, low)
    return jax.random.wrap_key_data(jnp.stack([a, b], axis=-1), impl=jax.random.key_impl(key))


def _hash_counters(
    key: PRNGKeyArray, low: UInt32[Array, " n"]
) -> tuple[UInt32[Array, " n"], UInt32[Array, " n"]]:
    """The hash of the 64-bit counters with high word 0 and low word `low`, as JAX does."""
    return threefry2x32(jax.random.key_data(key), jnp.zeros_like(low), low)


def _is_threefry(key: PRNGKeyArray) -> bool:
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    return typed and str(jax.random.key_impl(key)) == "threefry2x32"


def uniforms(key: PRNGKeyArray, n: int, dtype: jnp.dtype = jnp.float32) -> Float[Array, " n"]:
    """`n` uniforms in `[0, 1)` from one key (float32 resolution, 2^-23): this module's own
    stream (the hash of the counters `0, 1, ...` under the key), not `jax.random.uniform`'s.
    A key's numbers depend only on that key, never on the batch they are computed in.

    Example:
        >>> import jax, samplers
        >>> u = samplers.random.uniforms(jax.random.key(0), 3)
        >>> u.shape, bool(((u >= 0) & (u < 1)).all())
        ((3,), True)
    """
    data = jax.random.key_data(key).astype(jnp.uint32).reshape(-1)[-2:]
    pairs = -(-n // 2)
    counter = jnp.arange(pairs, dtype=jnp.uint32)
    a, b = threefry2x32(data, counter, jnp.zeros_like(counter))
    bits = jnp.concatenate([a, b])[:n]
    # The top 23 bits as the mantissa of a float in [1, 2).
    mantissa = (bits >> np.uint32(9)) | np.uint32(0x3F800000)
    return (jax.lax.bitcast_convert_type(mantissa, jnp.float32) - 1.0).astype(dtype)


def normals(u: Float[Array, " n"]) -> Float[Array, " n"]:
    """Standard normals from uniforms of `uniforms` (the inverse CDF, at the midpoint of
    each 2^-23 cell, so never at 0 or 1).

    Example:
        >>> import jax, numpy as np, samplers
        >>> z = samplers.random.normals(samplers.random.uniforms(jax.random.key(0), 1000))
        >>> bool(np.isfinite(z).all()), bool(abs(float(z.mean())) < 0.2)
        (True, True)
    """
    middle = u + jnp.asarray(2.0**-24, u.dtype)
    return jnp.asarray(np.sqrt(2.0), u.dtype) * jax.lax.erf_inv(2 * middle - 1)
