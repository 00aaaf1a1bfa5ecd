"""The JAX internals ensemblenn relies on (all in ensemblenn/_jax_private.py).

If a JAX release moves them, these tests fail here, loudly, before anything subtler does.
"""

import jax
import jax.numpy as jnp

from ensemblenn import _jax_private  # private: its uses of JAX internals, each tested


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

    outer = jax.vmap(
        lambda w: jax.vmap(inner, in_axes=(0, None), axis_name="inner")(jnp.ones((3, 2)), w),
        axis_name="outer",
    )
    outer(jnp.ones((4, 2)))
    assert seen == {"w": False}  # mapped by the outer vmap, not by ours


def test_as_weakly_typed_marks_weak_type():
    x = _jax_private.as_weakly_typed(jnp.ones(3, jnp.float32))
    assert jax.typeof(x).weak_type
    assert (x + jnp.ones(3, jnp.bfloat16)).dtype == jnp.bfloat16  # weak: promotes downwards


def test_backend_and_collectives_internals_exist():
    assert _jax_private.backends_started() is True  # conftest ran jax already
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax

    assert hasattr(_jax, "make_gloo_tcp_collectives")
    assert callable(xla_bridge.register_backend_factory) and callable(xla_bridge.make_cpu_client)
    assert hasattr(distributed.global_state, "client")
