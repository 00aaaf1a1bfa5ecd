"""The closure guard: captured arrays are lifted to operands, or explained."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compile_counter import counting
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import ensemblenn as enn

N = 8
GLOBAL_DATA = None  # set per test to an array sharded on the test's mesh


def sharded(x, mesh, spec=P()):
    return jax.device_put(x, NamedSharding(mesh, spec))


class Scaled(eqx.Module):
    weights: jax.Array

    def __call__(self, x):
        return x * self.weights.sum()


@jax.jit
def jitted_helper(x):
    return x + GLOBAL_DATA.mean()


def capture_kinds(mesh):
    """(name, per-chain body) pairs, each capturing an explicit-/auto-sharded array."""
    data = sharded(jnp.arange(1.0, 4.0), mesh)
    per_chain_data = sharded(jnp.arange(N * 1.0), mesh, P("chains"))
    key = sharded(jax.random.key(3), mesh)
    module = Scaled(sharded(jnp.array([0.5, 1.5]), mesh))

    def logdensity(x):
        return -0.5 * jnp.sum((x - data.sum()) ** 2)

    def with_default(x, d=data):
        return x * d.max()

    def scan_body(x):
        return jax.lax.scan(lambda c, _: (c + data.mean(), None), x, None, length=3)[0]

    def while_body(x):
        return jax.lax.while_loop(lambda c: c[1] < 2, lambda c: (c[0] * data[0], c[1] + 1), (x, 0))[
            0
        ]

    def cond_body(x):
        return jax.lax.cond(x.sum() > 3, lambda y: y + data[1], lambda y: y - data[2], x)

    def grad_body(x):
        return jax.grad(lambda y: logdensity(y))(x)

    return [
        ("closure cell", lambda x: x + data.sum()),
        ("per-chain array captured whole", lambda x: x + per_chain_data.sum()),
        ("deep (logdensity closing over data)", lambda x: logdensity(x) + x),
        ("default argument", with_default),
        ("functools.partial", functools.partial(lambda d, x: x * d[0], data)),
        ("bound method of a module", module.__call__),
        ("module as the function", module),
        ("typed key", lambda x: x + jax.random.normal(key, x.shape)),
        ("scan body", scan_body),
        ("while body", while_body),
        ("cond branches", cond_body),
        ("grad of closure", grad_body),
    ]


@pytest.mark.parametrize("index", range(12))
def test_lifted_body_equals_closure_semantics(mesh, index):
    name, body = capture_kinds(mesh)[index]
    x = jnp.arange(N * 2.0).reshape(N, 2) / 7
    out = enn.ensemble_map(body, mesh=mesh, in_roles=enn.PER_CHAIN)(x)
    # Closure semantics: every chain sees the whole captured array.
    with jax.set_mesh(mesh):
        expected = jax.jit(jax.vmap(body))(x)
    np.testing.assert_allclose(out, expected, rtol=1e-6, err_msg=name)
    raw = jax.shard_map(jax.vmap(body), mesh=mesh, in_specs=P("chains"), out_specs=P("chains"))
    if mesh.axis_types[0] == AxisType.Explicit:
        # Plain shard_map cannot run any of these on an Explicit mesh.
        with pytest.raises((NotImplementedError, ValueError)):
            raw(sharded(x, mesh, P("chains")))
    else:
        try:
            expected = jax.jit(raw)(x)
        except ValueError:  # JAX fails on some Auto-mesh closures too (indexing them)
            return
        np.testing.assert_array_equal(out, expected, err_msg=name)


def test_global_and_jit_callee_are_lifted(explicit_mesh):
    global GLOBAL_DATA
    GLOBAL_DATA = sharded(jnp.array([2.0, 4.0]), explicit_mesh)
    x = jnp.arange(N * 1.0)
    out = enn.ensemble_map(
        lambda x: jitted_helper(x) + GLOBAL_DATA[0], mesh=explicit_mesh, in_roles=enn.PER_CHAIN
    )(x)
    np.testing.assert_array_equal(out, x + 3.0 + 2.0)


def test_same_closure_new_data_does_not_recompile(explicit_mesh):
    data = {"d": sharded(jnp.ones(3), explicit_mesh)}
    f = enn.ensemble_map(lambda x: x * data["d"].sum(), mesh=explicit_mesh, in_roles=enn.PER_CHAIN)
    with counting() as first:
        f(jnp.ones(N))
    data["d"] = sharded(jnp.full(3, 2.0, jnp.float32), explicit_mesh)
    x = jnp.ones(N)
    with counting() as again:
        out = f(x)
    assert out.tolist() == [6.0] * N  # the new data is used ...
    assert len(first) >= 1 and len(again) == 0, again.names  # ... by the same program


def test_error_mode_names_each_capture_and_the_fix(explicit_mesh):
    data = sharded(jnp.ones((3, 2)), explicit_mesh)
    f = enn.ensemble_map(
        lambda x: x + data.sum(), mesh=explicit_mesh, in_roles=enn.PER_CHAIN, closures="error"
    )
    with pytest.raises(enn.ClosureError) as info:
        f(jnp.zeros(N))
    message = str(info.value)
    assert "float32[3,2]" in message and "Explicit" in message
    assert "fix:" in message and "enn.broadcast()" in message


def test_numpy_captures_and_body_constants_need_no_lifting(explicit_mesh):
    table = np.arange(3.0, dtype=np.float32)
    f = enn.ensemble_map(
        lambda x: x + table.sum() + jnp.ones(()) * 2,
        mesh=explicit_mesh,
        in_roles=enn.PER_CHAIN,
        closures="error",
    )
    np.testing.assert_array_equal(f(jnp.zeros(N)), np.full(N, 5.0))


LOOP = jax.lax.fori_loop  # a JAX function under a global name of the user's module
MIXED_KEYS = {1: 2.0, "scale": 3.0}  # a dict JAX cannot flatten (its keys do not sort)


def test_global_jax_functions_and_unflattenable_globals_are_left_alone(mesh):
    # The walk used to follow fori_loop into JAX's own globals and stop at one of its
    # type-keyed tables with JAX's "Comparator raised exception" ValueError.
    data = sharded(jnp.arange(1.0, 4.0), mesh)

    def per_chain(x):
        return LOOP(0, 3, lambda i, c: c + data[i], x) * MIXED_KEYS["scale"] + MIXED_KEYS[1]

    x = jnp.arange(N * 1.0)
    out = enn.ensemble_map(per_chain, mesh=mesh, in_roles=enn.PER_CHAIN)(x)
    np.testing.assert_array_equal(out, (x + 6.0) * 3.0 + 2.0)  # data still lifted
    # What JAX returns for a captured-then-vmapped function is walked through its closure.
    vmapped = jax.vmap(lambda y: y + data.sum())
    out = enn.ensemble_map(lambda x: vmapped(x[None])[0], mesh=mesh, in_roles=enn.PER_CHAIN)(x)
    np.testing.assert_array_equal(out, x + 6.0)


def test_tracer_captured_from_outer_jit(mesh):
    @jax.jit
    def outer(x, shift):
        return enn.ensemble_map(lambda y: y + shift, mesh=mesh, in_roles=enn.PER_CHAIN)(x)

    np.testing.assert_array_equal(outer(jnp.zeros(N), jnp.float32(2.5)), np.full(N, 2.5))


class Opaque:
    def __init__(self, value):
        self.value = value


def test_unreachable_capture_gives_closure_error_not_jax_error(explicit_mesh):
    holder = Opaque(sharded(jnp.ones(2), explicit_mesh))
    # Evaluated from the discovery trace, the captured constant becomes an operand even
    # though the holder cannot be rebuilt...
    f = enn.ensemble_map(
        lambda x: x + holder.value.sum(), mesh=explicit_mesh, in_roles=enn.PER_CHAIN
    )
    np.testing.assert_array_equal(f(jnp.zeros(N)), np.full(N, 2.0))
    # ...but inside a nested jit callee it is a constant of that callee, and the function
    # is traced again with the array still captured.
    inner = jax.jit(lambda x: x + holder.value.sum())
    g = enn.ensemble_map(lambda x: inner(x), mesh=explicit_mesh, in_roles=enn.PER_CHAIN)
    with pytest.raises(enn.ClosureError, match="pass the array as an argument"):
        g(jnp.zeros(N))


def test_no_array_reaches_a_shard_map_body_except_as_operand(mesh):
    data = sharded(jnp.arange(3.0), mesh)
    f = enn.ensemble_map(
        lambda x: x * data.sum() + enn.chain_mean(x), mesh=mesh, in_roles=enn.PER_CHAIN
    )
    closed = jax.make_jaxpr(f)(jnp.ones(N))
    assert "shard_map" in str(closed)
    assert enn.shard_map_captures(closed) == []
    (inner,) = _shard_map_eqns(closed.jaxpr)
    # x (per-chain) and the lifted capture (broadcast) are the body's operands.
    assert [str(s) for s in inner.params["in_specs"]] == ["P('chains',)", "P()"]


def _shard_map_eqns(jaxpr):
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "shard_map":
            found.append(eqn)
        for param in eqn.params.values():
            if hasattr(param, "jaxpr") and hasattr(param.jaxpr, "eqns"):
                found += _shard_map_eqns(param.jaxpr)
    return found


@pytest.mark.parametrize("placement", ["per-chain sharded", "replicated", "one device"])
def test_captured_per_chain_data_indexed_by_chain(mesh, placement):
    """A captured array holding one row per chain, indexed with enn.chain_index(): on an
    Explicit mesh its sharded type used to break the discovery trace."""
    rows = jnp.arange(N * 3.0).reshape(N, 3)
    if placement == "per-chain sharded":
        rows = sharded(rows, mesh, P("chains"))
    elif placement == "replicated":
        rows = sharded(rows, mesh)

    def body(x):
        return x + rows[enn.chain_index()]

    out = enn.ensemble_map(body, mesh=mesh, in_roles=enn.PER_CHAIN)(jnp.ones((N, 3)))
    np.testing.assert_array_equal(np.asarray(out), 1.0 + np.arange(N * 3.0).reshape(N, 3))
    with pytest.raises(enn.ClosureError, match=r"float32\[8(@chains)?,3\]"):
        enn.ensemble_map(body, mesh=mesh, in_roles=enn.PER_CHAIN, closures="error")(
            jnp.ones((N, 3))
        )


def test_an_unused_sharded_array_in_reach_is_not_captured(explicit_mesh):
    unused = sharded(jnp.ones(N), explicit_mesh, P("chains"))
    holder = {"unused": unused}

    def body(x):
        return x * 2 if holder else x  # `holder` is reachable, its array never read

    f = enn.ensemble_map(body, mesh=explicit_mesh, in_roles=enn.PER_CHAIN, closures="error")
    assert f(jnp.ones(N)).tolist() == [2.0] * N
