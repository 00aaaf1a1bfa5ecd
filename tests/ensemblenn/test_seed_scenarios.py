"""The three source reports, rebuilt with the public API (4 simulated devices)."""

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import ensemblenn as enn

N = 16


# (a) BlackJAX LAPS burn-in: a first ensemble_map returns per-chain states and a broadcast
# statistic; signs derived from it (replicated on the mesh) enter a second ensemble_map both
# as an argument and by closure. BlackJAX's version crashed here on 4 devices.
class InitState(eqx.Module):
    position: jax.Array = enn.per_chain()
    velocity: jax.Array = enn.per_chain()


def logdensity(x):
    return -0.5 * jnp.sum(x**2 / jnp.arange(1.0, 4.0) ** 2)


def sequential_init(key):
    x = jax.random.normal(key, (3,)) * jnp.array([0.3, 1.0, 8.0])
    g = jax.grad(logdensity)(x)
    state = InitState(x, g / jnp.linalg.norm(g))
    return state, enn.chain_mean(-x * g)  # the equipartition estimate, one per dimension


def test_laps_burn_in_signs_as_argument_and_by_closure(mesh):
    keys = enn.chain_keys(jax.random.key(0), N)
    first = enn.ensemble_map(sequential_init, mesh=mesh, in_roles=enn.PER_CHAIN)
    state, equipartition = first(keys)
    assert equipartition.shape == (3,) and equipartition.sharding.is_fully_replicated
    signs = -2.0 * (equipartition < 1.0) + 1.0  # a replicated array on the mesh

    def flip(state, signs):
        return InitState(state.position, state.velocity * signs)

    as_argument = enn.ensemble_map(flip, mesh=mesh)(state, signs)
    by_closure = enn.ensemble_map(lambda s: flip(s, signs), mesh=mesh)(state)
    expected = np.asarray(state.velocity) * np.asarray(signs)
    np.testing.assert_array_equal(as_argument.velocity, expected)
    np.testing.assert_array_equal(by_closure.velocity, expected)
    assert as_argument.velocity.shape == (N, 3)


# (b) The JAX report: simple_func(w, x), w replicated, x per-chain, Explicit mesh under
# jax.set_mesh; plain shard_map closing over w hard-crashed XLA (now NotImplementedError).
def simple_func(w, x):
    return jnp.sum(w * x, axis=-1)


def test_jax_report_simple_func(explicit_mesh):
    with jax.set_mesh(explicit_mesh):
        w = jax.sharding.reshard(jnp.array([1.0, 2.0, 3.0]), P())
        x = jax.sharding.reshard(jnp.ones((4, 3)), P("chains", None))
        with pytest.raises(NotImplementedError, match="Closing over"):
            jax.shard_map(
                lambda xi: simple_func(w, xi), in_specs=(P("chains", None),), out_specs=P("chains")
            )(x)
        by_argument = enn.ensemble_map(simple_func, in_roles=(enn.BROADCAST, enn.PER_CHAIN))(w, x)
        by_closure = enn.ensemble_map(lambda xi: simple_func(w, xi), in_roles=enn.PER_CHAIN)(x)
    np.testing.assert_array_equal(by_argument, [6.0] * 4)
    np.testing.assert_array_equal(by_closure, [6.0] * 4)


# (c) Nx shard_jit: container arguments need one spec per leaf, an invalid spec on a
# container leaf must be a clear error (not a KeyError), and inputs already resident on a
# device must work.
class Batch(NamedTuple):
    inputs: jax.Array
    targets: jax.Array


class Model(eqx.Module):
    params: dict = enn.per_chain()
    opt_state: optax.OptState = enn.per_chain()


def loss(params, batch):
    pred = batch.inputs @ params["w"] + params["b"]
    return jnp.mean((pred - batch.targets) ** 2)


def train_step(model, batch, lr):
    grads = jax.grad(loss)(model.params, batch)
    updates, opt_state = optax.sgd(lr).update(grads, model.opt_state, model.params)
    return Model(optax.apply_updates(model.params, updates), opt_state), loss(model.params, batch)


def make_model(device=None):
    params = {
        "w": jnp.tile(jnp.arange(3.0)[:, None], (N, 1, 1)) * jnp.arange(N)[:, None, None],
        "b": jnp.zeros((N, 1)),
    }
    opt_state = jax.vmap(optax.sgd(0.1).init)(params)
    model = Model(params, opt_state)
    return jax.device_put(model, device) if device is not None else model


def test_container_arguments_committed_to_one_device(mesh):
    device = jax.devices()[3]
    model = make_model(device)
    batch = jax.device_put(Batch(jnp.ones((5, 3)), jnp.zeros((5, 1))), device)
    before = jax.tree.map(np.asarray, (model, batch))
    step = enn.ensemble_map(train_step, mesh=mesh, in_roles=(None, enn.BROADCAST, None))
    new_model, losses = step(model, batch, 0.1)
    assert losses.shape == (N,)
    expected = jax.vmap(lambda p: loss(p, batch))(model.params)
    np.testing.assert_allclose(losses, expected, rtol=1e-6)
    assert new_model.params["w"].shape == (N, 3, 1)
    assert new_model.params["w"].sharding.is_equivalent_to(NamedSharding(mesh, P("chains")), 3)
    # The user's inputs are unchanged (values and placement).
    for a, b in zip(jax.tree.leaves((model, batch)), jax.tree.leaves(before), strict=True):
        np.testing.assert_array_equal(a, b)
    assert model.params["w"].devices() == {device}


def test_invalid_spec_on_container_leaf_is_a_clear_error(mesh):
    model, batch = make_model(), Batch(jnp.ones((5, 3)), jnp.zeros((5, 1)))
    step = enn.ensemble_map(
        train_step, mesh=mesh, in_roles=(None, Batch(enn.BROADCAST, "replicated"), None)
    )
    with pytest.raises(enn.RoleError, match=r"args\[1\]\.targets.*'replicated'"):
        step(model, batch, 0.1)
    wrong = eqx.tree_at(lambda m: m.params["b"], model, jnp.zeros((N - 1, 1)))
    with pytest.raises(enn.ChainCountError, match=r"args\[0\]\.params\['b'\]"):
        enn.ensemble_map(train_step, mesh=mesh, in_roles=(None, enn.BROADCAST, None))(
            wrong, batch, 0.1
        )
