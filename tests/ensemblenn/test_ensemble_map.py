"""ensemble_map: per-chain code over a sharded ensemble, on Auto and Explicit meshes."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compile_counter import counting
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import ensemblenn as enn

N = 8


class Walkers(eqx.Module):
    x: jax.Array = enn.per_chain()
    scale: jax.Array = enn.broadcast()
    label: str = eqx.field(static=True, default="w")


def centre(w: Walkers) -> Walkers:
    return Walkers(w.scale * (w.x - enn.chain_mean(w.x)), w.scale, w.label)


def expected_centre(x, scale):
    return scale * (x - x.mean(0))


def test_per_chain_function_sees_one_chain(mesh):
    seen = {}

    def f(x, w):
        seen["x"], seen["w"] = x.shape, w.shape
        return x @ w

    x, w = jnp.ones((N, 3)), jnp.arange(6.0).reshape(3, 2)
    out = enn.ensemble_map(f, mesh=mesh, in_roles=(enn.PER_CHAIN, enn.BROADCAST))(x, w)
    assert seen == {"x": (3,), "w": (3, 2)}
    np.testing.assert_allclose(out, x @ w)
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, P("chains")), 2)


@pytest.mark.parametrize("jit", [False, True])
def test_module_roundtrip_eager_and_jit(mesh, jit):
    w = Walkers(jnp.arange(N * 2.0).reshape(N, 2), jnp.array([1.0, -2.0]))
    f = enn.ensemble_map(centre, mesh=mesh)
    out = (jax.jit(f) if jit else f)(w)
    np.testing.assert_allclose(out.x, expected_centre(w.x, w.scale), rtol=1e-6)
    # A declared broadcast field comes back once; the module can be fed straight back in.
    assert out.scale.shape == (2,) and out.label == "w"
    again = f(out)
    np.testing.assert_allclose(again.x, expected_centre(out.x, out.scale), rtol=1e-5, atol=1e-6)


def test_output_roles_are_inferred(mesh):
    def f(x, w):
        return {"varies": x * 2, "shared": w.sum(), "mean": enn.chain_mean(x), "n": 3}

    out = enn.ensemble_map(f, mesh=mesh, in_roles=(enn.PER_CHAIN, enn.BROADCAST))(
        jnp.arange(N * 1.0), jnp.ones(4)
    )
    assert out["varies"].shape == (N,)
    assert out["shared"].shape == () and float(out["shared"]) == 4.0
    assert float(out["mean"]) == pytest.approx(3.5)
    assert out["n"] == 3
    assert out["mean"].sharding.is_fully_replicated


def test_declared_per_chain_output_that_does_not_vary_is_stacked(mesh):
    f = enn.ensemble_map(
        lambda x, w: (x, w * 2),
        mesh=mesh,
        in_roles=(enn.PER_CHAIN, enn.BROADCAST),
        out_roles=(None, enn.PER_CHAIN),
    )
    _, doubled = f(jnp.zeros(N), jnp.array([1.0, 2.0]))
    assert doubled.shape == (N, 2)
    np.testing.assert_array_equal(doubled, np.tile([2.0, 4.0], (N, 1)))


def test_declared_broadcast_output_that_varies_is_an_error(mesh):
    f = enn.ensemble_map(
        lambda x: {"y": x + 1}, mesh=mesh, in_roles=enn.PER_CHAIN, out_roles={"y": enn.BROADCAST}
    )
    with pytest.raises(enn.OutputRoleError, match=r"output\['y'\].*differs from chain"):
        f(jnp.zeros(N))


def test_module_field_metadata_declares_output_roles(mesh):
    def f(x):
        return Walkers(x * 0 + 1.0, x.sum() * 0 + jnp.ones(2))  # broadcast field varies

    with pytest.raises(enn.OutputRoleError, match=r"output\.scale"):
        enn.ensemble_map(f, mesh=mesh, in_roles=enn.PER_CHAIN)(jnp.zeros(N))


def test_context_mesh_is_used_when_mesh_is_none(mesh):
    with jax.set_mesh(mesh):
        out = enn.ensemble_map(lambda x: x * 2, in_roles=enn.PER_CHAIN)(jnp.arange(N * 1.0))
        jitted = jax.jit(enn.ensemble_map(lambda x: x * 2, in_roles=enn.PER_CHAIN))(
            jnp.arange(N * 1.0)
        )
    assert out.sharding.mesh.axis_types == mesh.axis_types
    np.testing.assert_array_equal(jitted, np.arange(N) * 2.0)


def test_default_mesh_spans_all_devices():
    out = enn.ensemble_map(lambda x: x + enn.chain_index(), in_roles=enn.PER_CHAIN)(
        jnp.zeros(N, jnp.int32)
    )
    assert len(out.sharding.device_set) == jax.device_count()
    assert out.tolist() == list(range(N))


@pytest.mark.parametrize(
    "kind", ["numpy", "uncommitted", "one_device", "other_sharding", "replicated"]
)
def test_inputs_are_placed_first(mesh, kind):
    base = np.arange(N * 2.0, dtype=np.float32).reshape(N, 2)
    if kind == "numpy":
        x = base
    elif kind == "uncommitted":
        x = jnp.asarray(base)
    elif kind == "one_device":
        x = jax.device_put(base, jax.devices()[2])
    elif kind == "other_sharding":
        other = jax.make_mesh((2, 2), ("a", "b"))
        x = jax.device_put(base, NamedSharding(other, P(None, "a")))
    else:
        x = jax.device_put(base, NamedSharding(mesh, P()))
    w = jax.device_put(np.ones(2, np.float32), jax.devices()[1])
    f = enn.ensemble_map(
        lambda x, w: x * w + enn.chain_mean(x), mesh=mesh, in_roles=(enn.PER_CHAIN, enn.BROADCAST)
    )
    out = f(x, w)
    np.testing.assert_allclose(out, base + base.mean(0), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(x), base)  # the input is untouched


def test_under_outer_jit_with_traced_inputs(mesh):
    f = enn.ensemble_map(centre, mesh=mesh)

    @jax.jit
    def outer(x, scale):
        return f(Walkers(x, scale)).x.sum(1)

    x = jnp.arange(N * 2.0).reshape(N, 2)
    np.testing.assert_allclose(outer(x, jnp.ones(2)), expected_centre(x, 1.0).sum(1), atol=1e-5)


def test_nested_helpers_and_inner_ensemble_map(mesh):
    def normalise(x):  # a helper using collectives
        return (x - enn.chain_mean(x)) / jnp.sqrt(enn.chain_mean((x - enn.chain_mean(x)) ** 2))

    inner = enn.ensemble_map(lambda x: normalise(x) * 2, mesh=mesh, in_roles=enn.PER_CHAIN)

    def body(x):
        return inner(x) + normalise(x)  # an ensemble_map'd function called per chain

    x = jnp.arange(N * 1.0) ** 2
    out = enn.ensemble_map(body, mesh=mesh, in_roles=enn.PER_CHAIN)(x)
    z = (x - x.mean()) / x.std()
    np.testing.assert_allclose(out, 3 * z, rtol=1e-5)


def test_compiles_once_for_same_shapes(mesh):
    traces = []

    def f(x, w):
        traces.append(1)
        return x * w

    g = enn.ensemble_map(f, mesh=mesh, in_roles=(enn.PER_CHAIN, enn.BROADCAST))
    with counting() as first:
        g(jnp.ones(N), jnp.float32(1.0))
    before = len(traces)
    x, w = jnp.full(N, 2.0, jnp.float32), jnp.float32(3.0)  # made outside the count
    with counting() as again:
        out = g(x, w)
    # Nothing is traced again: the discovery is cached and the compiled program reused.
    assert len(traces) == before
    assert len(first) >= 1 and len(again) == 0, (first.names, again.names)
    assert out.tolist() == [6.0] * N
    x = jnp.ones(2 * N)
    with counting() as other_shape:  # the counter does see a new program
        g(x, w)
    assert len(other_shape) >= 1


def test_chain_count_not_divisible_by_devices(mesh):
    f = enn.ensemble_map(lambda x: x, mesh=mesh, in_roles=enn.PER_CHAIN)
    with pytest.raises(
        enn.ChainCountError,
        match=r"10 chains.*4 devices.*args\[0\].*"
        r"float32\[10\]",
    ):
        f(jnp.zeros(10))


def test_no_per_chain_input_is_an_error(mesh):
    with pytest.raises(enn.ChainCountError, match="no per-chain input"):
        enn.ensemble_map(lambda w: w, mesh=mesh)(jnp.ones(3))


def test_missing_mesh_axis(mesh):
    f = enn.ensemble_map(lambda x: x, mesh=mesh, axis="walkers", in_roles=enn.PER_CHAIN)
    with pytest.raises(enn.MeshError, match=r"no axis named 'walkers'.*\('chains',\)"):
        f(jnp.zeros(N))


def test_bad_closures_option():
    with pytest.raises(enn.EnsembleError, match="closures"):
        enn.ensemble_map(lambda x: x, closures="ignore")


def test_two_dimensional_mesh_shards_only_the_chain_axis():
    mesh = jax.make_mesh((2, 2), ("chains", "data"))
    f = enn.ensemble_map(lambda x: x - enn.chain_mean(x), mesh=mesh, in_roles=enn.PER_CHAIN)
    x = jnp.arange(N * 1.0)
    np.testing.assert_allclose(f(x), x - x.mean())


def test_broadcast_inputs_are_placed_once_while_alive(explicit_mesh):
    """A broadcast array (argument or capture) is replicated on the mesh once; the copy
    goes when the array does, and a new array with new values is used, not a stale copy."""
    import gc

    gc.collect()
    replicated = NamedSharding(explicit_mesh, P())

    def copies():  # replicated (3,) arrays alive now: the placed copies among them
        return sum(1 for a in jax.live_arrays() if a.shape == (3,) and a.sharding == replicated)

    shift = jnp.arange(3.0)  # uncommitted, on one device
    captured = jnp.full(3, 10.0)
    f = enn.ensemble_map(
        lambda x, s: x + s + captured, mesh=explicit_mesh, in_roles=(enn.PER_CHAIN, enn.BROADCAST)
    )
    x = jax.device_put(jnp.zeros((8, 3)), NamedSharding(explicit_mesh, P("chains")))
    puts = []
    device_put = jax.device_put

    def counting_put(*args, **kwargs):
        puts.append(args[0].shape)
        return device_put(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jax, "device_put", counting_put)
        first = f(x, shift)
        assert sorted(puts) == [(3,), (3,)]  # the argument and the capture, once each
        second = f(x, shift)
        assert len(puts) == 2  # reused: nothing placed again
    np.testing.assert_array_equal(first, second)
    alive = copies()
    del shift, first, second
    gc.collect()
    assert copies() == alive - 1  # the argument's copy went with it; the capture's stays
    np.testing.assert_array_equal(np.asarray(f(x, jnp.ones(3))), np.full((8, 3), 11.0))


def test_placing_inside_a_trace_is_not_reused_later(explicit_mesh):
    """A broadcast array first met inside jax.eval_shape / jax.jit is placed as a tracer
    there; that copy must not be kept (it would leak into the next eager call)."""
    shift = jnp.arange(3.0)
    f = enn.ensemble_map(
        lambda x, s: x + s, mesh=explicit_mesh, in_roles=(enn.PER_CHAIN, enn.BROADCAST)
    )
    x = jnp.zeros((8, 3))
    assert jax.eval_shape(lambda: f(x, shift)).shape == (8, 3)
    compiled = jax.jit(lambda x: f(x, shift)).lower(x).compile()
    np.testing.assert_array_equal(np.asarray(compiled(x)), np.tile(np.arange(3.0), (8, 1)))
    np.testing.assert_array_equal(np.asarray(f(x, shift)), np.tile(np.arange(3.0), (8, 1)))


def test_bad_out_roles_are_reported_as_out_roles(mesh):
    pair = enn.ensemble_map(
        lambda x: (x, x), mesh=mesh, in_roles=enn.PER_CHAIN, out_roles=(enn.PER_CHAIN,)
    )
    with pytest.raises(enn.RoleError) as err:
        pair(jnp.zeros(N))
    message = str(err.value)
    assert "out_roles does not match the output" in message and "give out_roles" in message
    assert "in_roles" not in message and "arguments" not in message
    spec = enn.ensemble_map(lambda x: x, mesh=mesh, in_roles=enn.PER_CHAIN, out_roles=P("chains"))
    with pytest.raises(enn.RoleError, match="out_roles at .* a PartitionSpec; out_roles takes"):
        spec(jnp.zeros(N))


@pytest.mark.parametrize("devices", [1, 4])
@pytest.mark.parametrize("kind", ["auto", "explicit"])
def test_outputs_feed_the_next_call_in_either_role(kind, devices):
    # On one device a per-chain array and a broadcast one hold the same bytes: on an Auto
    # mesh an output is passed on as it is (not put again); on an Explicit mesh the spec is
    # the array's type, which shard_map checks, so it is put in the role the call declares.
    # On four devices the roles differ in bytes: always put.
    axis_type = {"auto": jax.sharding.AxisType.Auto, "explicit": jax.sharding.AxisType.Explicit}
    some = jax.devices()[:devices]
    mesh = jax.make_mesh((devices,), ("chains",), axis_types=(axis_type[kind],), devices=some)
    step = enn.ensemble_map(
        lambda x, table: x + table.sum(0), mesh=mesh, in_roles=(enn.PER_CHAIN, enn.BROADCAST),
        out_roles=enn.PER_CHAIN,
    )  # fmt: skip
    x = step(jnp.zeros((N, 3)), jnp.ones((2, 3)))  # 2 everywhere
    y = step(x, x)  # a per-chain output as the broadcast argument: 2 + 8 * 2
    np.testing.assert_array_equal(y, 18.0)
    z = step(y, jnp.zeros((1, 3)))  # and as the per-chain one
    np.testing.assert_array_equal(z, y)
