"""`update_slice`, the driver's per-step write (private: it is the driver's own mechanism,
tested here because no public call shows whether a write became a scatter)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from samplers.driver._slices import update_slice  # private: see the module docstring

BUFFER = jnp.arange(24.0).reshape(3, 8)
ROWS = -jnp.arange(9.0).reshape(3, 3)


@pytest.mark.parametrize("start", [0, 2, 5, 7])  # 7: clamped to 5, as lax clamps
def test_same_place_for_every_chain_is_a_plain_update_slice(start):
    def ours(b, r):
        return update_slice(b, r, (jnp.int32(start),))

    def plain(b, r):
        return jax.lax.dynamic_update_slice(b, r, (jnp.int32(start),))

    np.testing.assert_array_equal(jax.vmap(ours)(BUFFER, ROWS), jax.vmap(plain)(BUFFER, ROWS))
    jaxpr = str(jax.make_jaxpr(jax.vmap(ours))(BUFFER, ROWS))
    assert "scatter" not in jaxpr and "dynamic_update_slice" in jaxpr
    assert "scatter" in str(jax.make_jaxpr(jax.vmap(plain))(BUFFER, ROWS))  # what it avoids


def test_a_place_per_chain_and_unbatched_operands():
    starts = jnp.array([0, 3, 5], jnp.int32)
    out = jax.vmap(lambda b, r, s: update_slice(b, r, (s,)))(BUFFER, ROWS, starts)
    for i, s in enumerate([0, 3, 5]):
        np.testing.assert_array_equal(out[i], BUFFER[i].at[s : s + 3].set(ROWS[i]))
    # One buffer for every chain, rows per chain; and nested vmaps.
    shared = jax.vmap(lambda r: update_slice(BUFFER[0], r, (jnp.int32(1),)))(ROWS)
    np.testing.assert_array_equal(shared, jnp.stack([BUFFER[0].at[1:4].set(r) for r in ROWS]))
    nested = jax.vmap(jax.vmap(lambda b, r: update_slice(b, r, (jnp.int32(2),))))(
        BUFFER[None], ROWS[None]
    )
    np.testing.assert_array_equal(nested[0], jax.vmap(lambda b, r: b.at[2:5].set(r))(BUFFER, ROWS))
