"""samplers._threefry: the unrolled Threefry-2x32 hash and the uniforms drawn from it."""

import jax
import jax.numpy as jnp
import numpy as np

import samplers._threefry as tf

# Known-answer vectors of Threefry-2x32 with 20 rounds (Random123's kat_vectors):
# (key, counter) -> output.
KAT = [
    ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


def test_known_answers():
    for key, (c0, c1), expected in KAT:
        out = tf.threefry2x32(
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
