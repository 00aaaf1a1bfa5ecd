"""The documented recipe of `enn.chain_keys`: key `i` is exactly `jax.random.fold_in(key, i)`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ensemblenn as enn

KEYS = {"typed": lambda: jax.random.key(11), "raw": lambda: jax.random.PRNGKey(11)}


def data(keys):
    """Raw key bits, for typed and raw keys alike."""
    if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(keys))
    return np.asarray(keys)


def recipe(key, i):
    return data(jax.random.fold_in(key, i))


@pytest.mark.parametrize("kind", KEYS)
@pytest.mark.parametrize("num_chains", [1, 3, 8, 96])
def test_key_i_is_fold_in_of_i(kind, num_chains):
    key = KEYS[kind]()
    keys = enn.chain_keys(key, num_chains)
    assert data(keys).shape == (num_chains, 2)
    for i in sorted({0, min(1, num_chains - 1), num_chains // 2, num_chains - 1}):
        np.testing.assert_array_equal(data(keys[i]), recipe(key, i), err_msg=f"chain {i}")


@pytest.mark.parametrize("kind", KEYS)
def test_every_key_of_a_large_ensemble_follows_the_recipe(kind):
    key = KEYS[kind]()
    expected = np.stack([recipe(key, i) for i in range(96)])
    np.testing.assert_array_equal(data(enn.chain_keys(key, 96)), expected)


@pytest.mark.parametrize("kind", KEYS)
def test_recipe_holds_on_a_four_device_mesh(kind, mesh):
    """Made under the mesh, and checked inside `ensemble_map`: each device's chain `i` (global
    index) holds `fold_in(key, i)`, whatever device it lives on."""
    key = KEYS[kind]()
    with jax.set_mesh(mesh):
        keys = jax.jit(enn.chain_keys, static_argnums=1)(key, 8)
    np.testing.assert_array_equal(data(keys), np.stack([recipe(key, i) for i in range(8)]))

    def mismatch(chain_key, key):  # written for one chain
        own = jax.random.fold_in(key, enn.chain_index())
        return jnp.any(data_of(chain_key) != data_of(own))

    def data_of(k):
        return jax.random.key_data(k) if jnp.issubdtype(k.dtype, jax.dtypes.prng_key) else k

    bad = enn.ensemble_map(mismatch, mesh=mesh, in_roles=(enn.PER_CHAIN, enn.BROADCAST))(
        enn.chain_keys(key, 8), key
    )
    assert bad.shape == (8,) and not bool(bad.any())
