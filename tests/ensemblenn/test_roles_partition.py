"""Roles, field specifiers, partition and combine."""

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import ensemblenn as enn


class Params(eqx.Module):
    weights: jax.Array
    bias: jax.Array


class Member(eqx.Module):
    params: Params = enn.per_chain()
    opt_state: optax.OptState = enn.per_chain()
    data: jax.Array = enn.broadcast()
    lr: float = 0.1
    name: str = eqx.field(static=True, default="m")


class Pair(NamedTuple):
    a: jax.Array
    b: jax.Array


def make_member(n=8):
    params = Params(jnp.ones((n, 3, 2)), jnp.zeros((n, 2)))
    opt_state = jax.vmap(optax.adam(1e-3).init)(params)
    return Member(params, opt_state, jnp.arange(5.0))


def test_field_specifiers_record_roles():
    assert enn.role_of(Member, "params") is enn.PER_CHAIN
    assert enn.role_of(make_member(), "data") is enn.BROADCAST
    assert enn.role_of(Member, "lr") is None


def test_role_with_static_is_an_error():
    with pytest.raises(enn.RoleError, match="static=True"):
        enn.per_chain(static=True)
    with pytest.raises(enn.RoleError, match="static=True"):
        enn.broadcast(static=True)


def test_role_of_unknown_field_names_the_fields():
    with pytest.raises(enn.RoleError, match="params, opt_state, data, lr"):
        enn.role_of(Member, "nope")


def test_field_role_applies_to_every_leaf_including_optax_state():
    member = make_member()
    operands, specs, static = enn.partition(member)
    spec_leaves = jax.tree.leaves(specs)
    array_leaves = jax.tree.leaves(operands)
    assert len(spec_leaves) == len(array_leaves) == 8  # weights, bias, adam count/mu/nu x2
    # Every params and adam-state leaf is per-chain (count included), data is broadcast.
    per_chain_specs = jax.tree.leaves((specs.params, specs.opt_state))
    assert per_chain_specs and all(s == P("chains") for s in per_chain_specs)
    assert specs.data == P()
    assert static.lr == 0.1 and static.name == "m"


def test_combine_inverts_partition():
    member = make_member()
    operands, _, static = enn.partition(member)
    back = enn.combine(operands, static)
    assert jax.tree.structure(back) == jax.tree.structure(member)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(member), strict=True):
        assert a is b


def test_containers_and_keys_with_in_roles():
    typed = jax.random.split(jax.random.key(0), 8)
    raw = jax.random.split(jax.random.PRNGKey(0), 8)
    tree = ({"x": jnp.zeros((8, 3)), "w": jnp.ones(3)}, Pair(jnp.zeros(8), jnp.ones(2)), typed, raw)
    in_roles = (
        {"x": enn.PER_CHAIN, "w": None},
        Pair(enn.PER_CHAIN, enn.BROADCAST),
        enn.PER_CHAIN,
        enn.PER_CHAIN,
    )
    _, specs, _ = enn.partition(tree, in_roles=in_roles)
    assert specs[0] == {"x": P("chains"), "w": P()}
    assert specs[1] == Pair(P("chains"), P())
    assert specs[2] == P("chains") and specs[3] == P("chains")  # never the trailing 2


def test_in_roles_overrides_field_metadata():
    member = make_member()
    _, specs, _ = enn.partition((member,), in_roles=(enn.BROADCAST,))
    assert all(s == P() for s in jax.tree.leaves(specs))


def test_innermost_declared_role_wins():
    class Sampler(eqx.Module):
        step_size: eqx.Module = enn.broadcast()

    s = Sampler(enn.PerChainValue(jnp.ones(8)))
    _, specs, _ = enn.partition(s)
    assert specs.step_size.value == P("chains")


def test_untagged_arrays_are_broadcast_and_strict_mode_rejects_them():
    _, specs, _ = enn.partition({"a": jnp.ones(3)})
    assert specs["a"] == P()
    with pytest.raises(enn.RoleError, match=r"\['a'\].*no role"):
        enn.partition({"a": jnp.ones(3)}, strict=True)


def test_invalid_role_spec_on_container_leaf_names_the_path():
    tree = {"x": jnp.zeros((8, 2)), "y": jnp.zeros(8)}
    with pytest.raises(enn.RoleError, match=r"\['y'\].*'chains'"):
        enn.partition(tree, in_roles={"x": enn.PER_CHAIN, "y": "chains"})
    with pytest.raises(enn.RoleError, match="does not match"):
        enn.partition(tree, in_roles={"x": enn.PER_CHAIN})
    with pytest.raises(enn.RoleError, match="PartitionSpec"):
        enn.partition(tree, in_roles={"x": P("chains"), "y": None})


def test_per_chain_role_on_a_python_number_is_an_error():
    class Bad(eqx.Module):
        rate: float = enn.per_chain()

    with pytest.raises(enn.RoleError, match=r"\.rate.*0\.5.*not an array"):
        enn.partition(Bad(0.5))


def test_inconsistent_leading_sizes_name_every_path():
    tree = {"a": jnp.zeros((8, 2)), "b": jnp.zeros((6,))}
    with pytest.raises(
        enn.ChainCountError,
        match=r"(?s)leading size 8.*\['a'\].*leading size 6.*"
        r"\['b'\]",
    ):
        enn.partition(tree, in_roles=enn.PER_CHAIN)


def test_scalar_per_chain_leaf_is_an_error():
    with pytest.raises(enn.ChainCountError, match="scalar"):
        enn.partition({"a": jnp.float32(1.0)}, in_roles=enn.PER_CHAIN)


def test_partition_does_not_mutate_inputs():
    tree = {"a": np.arange(8.0), "b": [1, 2]}
    before = (tree["a"].copy(), list(tree["b"]))
    enn.partition(tree, in_roles={"a": enn.PER_CHAIN, "b": None})
    np.testing.assert_array_equal(tree["a"], before[0])
    assert tree["b"] == before[1]


def test_role_resolution_is_reused_per_structure_and_stays_correct():
    """Roles are resolved once per structure; the same structure with other values (or a
    scalar where an array was) must still get the right leaves and roles."""

    class Pair(eqx.Module):
        a: jax.Array = enn.per_chain()
        b: jax.Array = enn.broadcast()

    # The walk over a structure reads its key paths; a structure resolved before is not
    # walked again (only flattened), so counting key-path flattens shows the reuse.
    walks = []
    flatten_with_path = jax.tree_util.tree_flatten_with_path

    def counting(*args, **kwargs):
        walks.append(1)
        return flatten_with_path(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jax.tree_util, "tree_flatten_with_path", counting)
        first = enn.partition(Pair(jnp.zeros((4, 2)), jnp.ones(3)))[1]
        assert (first.a, first.b) == (P("chains"), P())
        assert walks  # the first time, the structure is walked
        size = len(walks)
        second_module = Pair(jnp.ones((8, 2)), jnp.zeros(5))
        operands, specs, _ = enn.partition(second_module)
        assert len(walks) == size  # reused
    assert (specs.a, specs.b) == (P("chains"), P())
    assert [x.shape for x in jax.tree.leaves(operands)] == [(8, 2), (5,)]
    with pytest.raises(enn.RoleError, match="per_chain|PER_CHAIN|per-chain"):
        enn.partition(Pair(1.5, jnp.zeros(5)))  # same treedef, a scalar where an array was
