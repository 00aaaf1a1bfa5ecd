"""samplers.random's Threefry path: the unrolled Threefry-2x32 hash behind it, `jax.random`'s
numbers bit for bit, and the walkers' own uniforms."""

import jax
import jax.numpy as jnp
import numpy as np

import samplers.random as tf
from samplers._threefry import threefry2x32  # the private hash, for its known answers

# Known-answer vectors of Threefry-2x32 with 20 rounds (Random123's kat_vectors):
# (key, counter) -> output.
KAT = [
    ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


def test_known_answers():
    for key, (c0, c1), expected in KAT:
        out = threefry2x32(
            jnp.asarray(key, jnp.uint32),
            jnp.asarray([c0], jnp.uint32),
            jnp.asarray([c1], jnp.uint32),
        )
        assert [int(o[0]) for o in out] == list(expected)


def test_uniforms_per_key_and_batch_independent():
    """A key's numbers are the same alone and inside a vmap of any width, lie in [0, 1),
    and look uniform: over 4096 keys x 5 numbers the mean is within 4 standard errors
    (sd 1/sqrt(12 * 20480) ~ 0.002) of 1/2 and the normals' variance within 0.05 of 1."""
    keys = jax.random.split(jax.random.key(0), 4096)
    wide = jax.vmap(lambda k: tf.uniforms(k, 5))(keys)
    narrow = jax.vmap(lambda k: tf.uniforms(k, 5))(keys[:7])
    np.testing.assert_array_equal(wide[:7], narrow)
    np.testing.assert_array_equal(wide[3], tf.uniforms(keys[3], 5))
    u = np.asarray(wide)
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 4 * (1 / np.sqrt(12 * u.size))
    z = np.asarray(tf.normals(wide))
    assert np.isfinite(z).all() and abs(z.var() - 1) < 0.05 and abs(z.mean()) < 0.03


def _data(keys):
    return np.asarray(jax.random.key_data(keys))


def test_fold_in_and_split_are_jax_random_bit_for_bit():
    """The driver and the kernels use these in place of `jax.random.fold_in` / `split`, so
    they must give JAX's very keys: alone, under vmap with per-chain data, under jit, for
    data up to 2**31 - 1 and negative data. A JAX release that changes its Threefry keys
    (or the partitionable split) fails here, not as changed sampler results elsewhere."""
    keys = jax.random.split(jax.random.key(20261201), 16)
    for data in (0, 1, 7, 12345, 2**31 - 1, np.int32(-5)):
        np.testing.assert_array_equal(
            _data(tf.fold_in(keys[3], data)), _data(jax.random.fold_in(keys[3], data))
        )
    steps = jnp.arange(16, dtype=jnp.int32) * 977
    ours = jax.jit(jax.vmap(tf.fold_in))(keys, steps)
    np.testing.assert_array_equal(_data(ours), _data(jax.vmap(jax.random.fold_in)(keys, steps)))
    for num in (1, 2, 3, 5):
        ours = jax.jit(jax.vmap(lambda k, n=num: tf.split(k, n)))(keys)
        theirs = jax.vmap(lambda k, n=num: jax.random.split(k, n))(keys)
        np.testing.assert_array_equal(_data(ours), _data(theirs))
    np.testing.assert_array_equal(_data(tf.split(keys[0])), _data(jax.random.split(keys[0])))


def test_fold_in_and_split_fall_back_for_other_keys():
    """Keys that are not Threefry keys, and the non-partitionable split, go to jax.random
    (the same results as there)."""
    raw = jax.random.PRNGKey(3)  # a legacy uint32 key
    np.testing.assert_array_equal(tf.fold_in(raw, 4), jax.random.fold_in(raw, 4))
    np.testing.assert_array_equal(tf.split(raw, 3), jax.random.split(raw, 3))
    rbg = jax.random.key(3, impl="rbg")
    np.testing.assert_array_equal(_data(tf.split(rbg, 3)), _data(jax.random.split(rbg, 3)))
    np.testing.assert_array_equal(_data(tf.fold_in(rbg, 4)), _data(jax.random.fold_in(rbg, 4)))
    before = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", False)
    try:
        key = jax.random.key(9)
        np.testing.assert_array_equal(_data(tf.split(key, 3)), _data(jax.random.split(key, 3)))
    finally:
        jax.config.update("jax_threefry_partitionable", before)


def test_unrolled_keys_lower_to_no_loop():
    """The point of the module: no `while` in the compiled fold_in/split on CPU (JAX's own
    lowering there is a rolled five-iteration loop)."""
    key = jax.random.key(0)
    ours = jax.jit(lambda k: (tf.fold_in(k, 3), tf.split(k, 3))).lower(key).as_text()
    theirs = jax.jit(lambda k: jax.random.fold_in(k, 3)).lower(key).as_text()
    assert "while" not in ours
    assert jax.default_backend() != "cpu" or "while" in theirs


def _bits(x):
    return np.asarray(x).view(np.uint32)


def test_normal_and_uniform_are_jax_randoms_numbers():
    """The kernels draw their momenta, noise and accept uniforms with these, so they must be
    JAX's numbers: for a scalar and 1-, 2-, 3-d shapes, alone and under jit(vmap). The
    uniforms are bit for bit; the normals apply JAX's own `erf_inv` to those same uniforms,
    whose last bits can depend on how XLA fuses it (seen: up to 3 ulp on one batched shape
    with the newest JAX on CPU), so they are allowed 4 ulp. A JAX release that changes
    `jax.random`'s bits or transform fails here. (Every shape in one compiled program per
    side, as the kernels call them: shape by shape, op by op, this took a minute.)"""
    keys = jax.random.split(jax.random.key(20261203), 64)
    shapes = [(), (1,), (5,), (100,), (3, 7), (2, 3, 4)]
    for ours, theirs, ulp in [
        (tf.normal, jax.random.normal, 4),
        (tf.uniform, jax.random.uniform, 0),
    ]:

        def every_shape(key, f):
            return [f(key, shape) for shape in shapes]

        single = jax.jit(every_shape, static_argnums=1)
        batched = jax.jit(jax.vmap(every_shape, in_axes=(0, None)), static_argnums=1)
        pairs = [(single(keys[5], ours), single(keys[5], theirs))]
        pairs.append((batched(keys, ours), batched(keys, theirs)))
        for got, want in pairs:
            for shape, a, b in zip(shapes, got, want, strict=True):
                a, b = _bits(a).astype(np.int64), _bits(b).astype(np.int64)
                assert np.abs(a - b).max(initial=0) <= ulp, (shape, ours.__name__)


def test_normal_and_uniform_fall_back_for_other_keys_and_dtypes():
    """Other dtypes, key implementations and the non-partitionable mode go to jax.random."""
    key = jax.random.key(2)
    for dtype in (jnp.bfloat16, jnp.float16):
        np.testing.assert_array_equal(
            tf.normal(key, (4,), dtype), jax.random.normal(key, (4,), dtype)
        )
        np.testing.assert_array_equal(
            tf.uniform(key, (4,), dtype), jax.random.uniform(key, (4,), dtype)
        )
    rbg = jax.random.key(2, impl="rbg")
    np.testing.assert_array_equal(tf.normal(rbg, (4,)), jax.random.normal(rbg, (4,)))
    raw = jax.random.PRNGKey(2)
    np.testing.assert_array_equal(tf.uniform(raw, (4,)), jax.random.uniform(raw, (4,)))
    before = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", False)
    try:
        np.testing.assert_array_equal(tf.normal(key, (4,)), jax.random.normal(key, (4,)))
    finally:
        jax.config.update("jax_threefry_partitionable", before)


def test_unrolled_draws_lower_to_no_loop():
    key = jax.random.key(0)
    ours = jax.jit(lambda k: (tf.normal(k, (100,)), tf.uniform(k))).lower(key).as_text()
    assert "while" not in ours


def test_bernoulli_and_randint_are_jax_randoms_numbers():
    """NUTS's direction coin and the jittered path lengths (HMC, AdjustedMCLMC) and SG-MCMC
    minibatches draw with these, so they must be JAX's very numbers: alone and under
    jit(vmap), for spans that are and are not powers of 2, an empty range, negative and
    array bounds and the full int32 range."""
    keys = jax.random.split(jax.random.key(20261205), 64)
    cases = [
        ((), 1, 10),
        ((7,), 0, 37),
        ((3, 4), -5, 3),
        ((5,), 0, 2**16),
        ((5,), 4, 4),  # empty: minval
        ((5,), 9, 2),  # maxval < minval: minval
        ((6,), jnp.int32(-(2**31)), jnp.int32(2**31 - 1)),
        ((4,), jnp.arange(4, dtype=jnp.int32), 3 * jnp.arange(1, 5, dtype=jnp.int32)),
    ]
    for shape, lo, hi in cases:
        ours = jax.jit(jax.vmap(lambda k, s=shape, a=lo, b=hi: tf.randint(k, s, a, b)))(keys)
        theirs = jax.vmap(lambda k, s=shape, a=lo, b=hi: jax.random.randint(k, s, a, b))(keys)
        assert ours.dtype == theirs.dtype == jnp.int32
        np.testing.assert_array_equal(ours, theirs, err_msg=str(shape))
        np.testing.assert_array_equal(tf.randint(keys[3], shape, lo, hi), theirs[3])
    traced = jax.jit(jax.vmap(lambda k, n: tf.randint(k, (), 1, 2 * n)))
    n = jnp.arange(1, 65, dtype=jnp.int32)
    want = jax.vmap(lambda k, n: jax.random.randint(k, (), 1, 2 * n))(keys, n)
    np.testing.assert_array_equal(traced(keys, n), want)
    for p, shape in [(0.5, None), (0.3, (9,)), (np.float32(0.9), (2, 3)), (jnp.full(5, 0.2), None)]:
        ours = jax.jit(jax.vmap(lambda k, p=p, s=shape: tf.bernoulli(k, p, s)))(keys)
        theirs = jax.vmap(lambda k, p=p, s=shape: jax.random.bernoulli(k, p, s))(keys)
        np.testing.assert_array_equal(ours, theirs)
        np.testing.assert_array_equal(tf.bernoulli(keys[0], p, shape), theirs[0])
    assert 0.4 < float(jax.vmap(tf.bernoulli)(keys).mean()) < 0.6  # real draws


def test_bernoulli_and_randint_fall_back_for_other_keys_and_dtypes():
    """int64 and 8-bit draws, float64 and bfloat16 probabilities, other key implementations
    and the non-partitionable mode go to jax.random (the same numbers as there)."""
    key = jax.random.key(2)
    with jax.enable_x64(True):  # the default int is int64 and a Python float float64 here
        np.testing.assert_array_equal(
            tf.randint(key, (4,), 0, 10), jax.random.randint(key, (4,), 0, 10)
        )
        np.testing.assert_array_equal(
            tf.bernoulli(key, 0.3, (4,)), jax.random.bernoulli(key, 0.3, (4,))
        )
        ours = tf.randint(key, (4,), 0, 10, jnp.int32)
        np.testing.assert_array_equal(ours, jax.random.randint(key, (4,), 0, 10, jnp.int32))
    np.testing.assert_array_equal(
        tf.randint(key, (4,), 0, 100, jnp.int8), jax.random.randint(key, (4,), 0, 100, jnp.int8)
    )
    p = jnp.asarray(0.3, jnp.bfloat16)
    np.testing.assert_array_equal(tf.bernoulli(key, p, (4,)), jax.random.bernoulli(key, p, (4,)))
    for other in (jax.random.key(2, impl="rbg"), jax.random.PRNGKey(2)):
        np.testing.assert_array_equal(
            tf.randint(other, (4,), 0, 10), jax.random.randint(other, (4,), 0, 10)
        )
        np.testing.assert_array_equal(
            tf.bernoulli(other, 0.3, (4,)), jax.random.bernoulli(other, 0.3, (4,))
        )
    before = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", False)
    try:
        np.testing.assert_array_equal(
            tf.randint(key, (4,), 0, 10), jax.random.randint(key, (4,), 0, 10)
        )
    finally:
        jax.config.update("jax_threefry_partitionable", before)


def test_unrolled_integers_lower_to_no_loop():
    key = jax.random.key(0)
    ours = jax.jit(lambda k: (tf.randint(k, (8,), 0, 37), tf.bernoulli(k))).lower(key).as_text()
    assert "while" not in ours
