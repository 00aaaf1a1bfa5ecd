"""The JAX internals ensemblenn relies on (all in ensemblenn/_jax_private.py).

If a JAX release moves them, these tests fail here, loudly, before anything subtler does.
"""

import jax
import jax.numpy as jnp

from ensemblenn import _jax_private


def test_is_batched_over_tells_mapped_from_unmapped_values():
    seen = {}

    def f(x, w):
        seen["x"] = _jax_private.is_batched_over(x * 2, "chains_axis")
        seen["w"] = _jax_private.is_batched_over(w + 1, "chains_axis")
        seen["other"] = _jax_private.is_batched_over(x, "another_axis")
        return x

    jax.vmap(f, in_axes=(0, None), axis_name="chains_axis")(jnp.ones((3, 2)), jnp.ones(2))
    assert seen == {"x": True, "w": False, "other": False}


def test_is_batched_over_under_an_outer_vmap():
    seen = {}

    def inner(x, w):
        seen["w"] = _jax_private.is_batched_over(w, "inner")
        return x + w

    outer = jax.vmap(lambda w: jax.vmap(inner, in_axes=(0, None), axis_name="inner")(
        jnp.ones((3, 2)), w), axis_name="outer")
    outer(jnp.ones((4, 2)))
    assert seen == {"w": False}  # mapped by the outer vmap, not by ours
