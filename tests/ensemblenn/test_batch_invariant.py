"""enn.batch_invariant and ensemble_map(block_size=...): per-chain results that do not
depend on how many chains each device holds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

import ensemblenn as enn
import samplers
import samplers.integrators.isokinetic as iso

DIM = 100
VARIANCES = np.logspace(0.0, 2.0, DIM).astype(np.float32)


def _data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((n, DIM)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((n, DIM)), jnp.float32)
    return x, v / jnp.linalg.norm(v, axis=1, keepdims=True)


def velocity_step(u, x):
    """Per-chain work with reductions over the dimension (norms, dots, a log density)."""
    grad = jax.grad(lambda y: -0.5 * jnp.sum(y * y / VARIANCES))(x)
    return iso.isokinetic_velocity_update(u, grad, 0.3, VARIANCES)


def _mesh(devices, kind=AxisType.Explicit):
    return jax.make_mesh(
        (devices,), ("chains",), axis_types=(kind,), devices=jax.devices()[:devices]
    )


def test_xla_rounds_per_chain_reductions_by_batch_shape():
    """Why the module exists: without blocking, the same chain's result depends on how many
    chains share the vmap (jax 0.10.2 CPU). If a JAX release stops doing this, this test
    fails and tells us blocking has become unnecessary (the feature still works)."""
    x, u = _data()
    f = jax.jit(jax.vmap(velocity_step))
    whole = f(u, x)[0]
    pairs = jnp.concatenate([f(u[i : i + 2], x[i : i + 2])[0] for i in range(0, 64, 2)])
    assert not np.array_equal(whole, pairs)
    np.testing.assert_allclose(whole, pairs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_same_bits_for_every_local_batch(block_size):
    x, u = _data()
    f = jax.jit(jax.vmap(enn.batch_invariant(velocity_step, block_size=block_size)))
    whole = f(u, x)
    for b in (1, 2, 3, 5, 16, 32):  # 3 and 5: the last block is padded
        cut = 64 - 64 % b
        parts = [f(u[i : i + b], x[i : i + b]) for i in range(0, cut, b)]
        for w, p in zip(whole, zip(*parts)):
            np.testing.assert_array_equal(w[:cut], jnp.concatenate(p), err_msg=f"batch {b}")
    # and the values are the function's own, up to rounding
    new_u, kinetic = jax.vmap(velocity_step)(u, x)
    np.testing.assert_allclose(whole[0], new_u, rtol=1e-5, atol=1e-6)
    # (d - 1) (delta + log(...)) cancels: its rounding is ~100x float32's epsilon
    np.testing.assert_allclose(whole[1], kinetic, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("block_size", [8, "auto"])
@pytest.mark.parametrize("kind", [AxisType.Explicit, AxisType.Auto])
def test_ensemble_map_block_size_gives_one_answer_on_1_2_4_devices(kind, block_size):
    x, u = _data()

    def per_chain(u, x):
        new_u, dk = enn.batch_invariant(velocity_step)(u, x)
        return new_u, dk, enn.chain_mean(dk)  # a collective outside the block is fine

    out = {
        n: enn.ensemble_map(
            per_chain, mesh=_mesh(n, kind), in_roles=enn.PER_CHAIN, block_size=block_size
        )(u, x)
        for n in (1, 2, 4)
    }
    for n in (2, 4):
        for a, b in zip(out[1], out[n]):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_without_block_size_the_function_runs_unchanged():
    calls = []

    def f(x):
        calls.append(jax.typeof(x).shape)
        return 2 * x

    wrapped = enn.batch_invariant(f)  # no block size here, none from an ensemble
    assert wrapped(jnp.ones(3)).tolist() == [2.0, 2.0, 2.0]
    assert calls == [(3,)]
    mapped = enn.ensemble_map(wrapped, in_roles=enn.PER_CHAIN)  # block_size=None
    assert mapped(jnp.arange(4.0)).tolist() == [0.0, 2.0, 4.0, 6.0]


def test_one_chain_pytrees_static_outputs_and_keys():
    def f(state, key, scale):
        noise = jax.random.normal(key, state["x"].shape)
        return {"x": state["x"] + scale * noise, "n": state["n"] + 1}, "label", 3

    state = {"x": jnp.ones(5), "n": jnp.int32(0)}
    key = jax.random.key(1)
    out, label, three = enn.batch_invariant(f, block_size=4)(state, key, 0.5)
    expected, _, _ = f(state, key, 0.5)
    assert label == "label" and three == 3 and int(out["n"]) == 1
    np.testing.assert_allclose(out["x"], expected["x"], rtol=1e-6)


def test_closures_over_per_chain_values_and_broadcast_outputs(mesh):
    """A per-chain value captured by the wrapped function is batched like an argument, and
    an output that depends on no per-chain value stays a single (BROADCAST) value."""

    def per_chain(x, shift):
        def f(y):
            return y + shift, jnp.float32(7.0)  # shift: captured, per chain

        moved, constant = enn.batch_invariant(f)(x)
        return moved, constant

    x = jnp.arange(8.0)
    moved, constant = enn.ensemble_map(
        per_chain,
        mesh=mesh,
        in_roles=enn.PER_CHAIN,
        out_roles=(enn.PER_CHAIN, enn.BROADCAST),
        block_size=3,
    )(x, 10 * x)
    assert moved.tolist() == (11 * x).tolist()
    assert constant.shape == () and float(constant) == 7.0


def test_collectives_inside_a_block_are_refused(mesh):
    def per_chain(x):
        return enn.batch_invariant(lambda y: y - enn.chain_mean(y))(x)

    with pytest.raises(enn.CollectiveError, match="batch_invariant"):
        enn.ensemble_map(per_chain, mesh=mesh, in_roles=enn.PER_CHAIN, block_size=2)(
            jnp.arange(8.0)
        )
    # num_chains is a constant, not a reduction: allowed
    f = enn.ensemble_map(
        lambda x: enn.batch_invariant(lambda y: y * enn.num_chains())(x),
        mesh=mesh,
        in_roles=enn.PER_CHAIN,
        block_size=2,
    )
    assert f(jnp.ones(8)).tolist() == [8.0] * 8


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8"])
def test_bad_block_sizes_are_explained(bad):
    with pytest.raises(enn.EnsembleError, match="block_size"):
        enn.batch_invariant(jnp.sin, block_size=bad)
    with pytest.raises(enn.EnsembleError, match="block_size"):
        enn.ensemble_map(jnp.sin, in_roles=enn.PER_CHAIN, block_size=bad)
    with pytest.raises(enn.EnsembleError, match="block_size"):
        samplers.run(
            samplers.MALA(step_size=0.1),
            lambda x: -jnp.sum(x**2),
            jnp.zeros((4, 2)),
            key=jax.random.key(0),
            num_steps=2,
            progress=False,
            block_size=bad,
        )


def test_gradients_inside_work_and_reverse_mode_through_is_explained():
    x = jnp.linspace(0.0, 1.0, 5)
    grad_inside = enn.batch_invariant(jax.grad(lambda y: jnp.sum(jnp.sin(y))), block_size=4)
    np.testing.assert_allclose(
        jax.vmap(grad_inside)(jnp.stack([x, 2 * x])), jnp.cos(jnp.stack([x, 2 * x])), rtol=1e-6
    )
    f = enn.batch_invariant(lambda y: jnp.sum(jnp.sin(y)), block_size=4)
    with pytest.raises(enn.EnsembleError, match="reverse mode"):
        jax.grad(f)(x)


def test_under_set_mesh_with_constant_outputs_and_keys(explicit_mesh):
    """With `jax.set_mesh(explicit)` the loop's buffers are typed on the mesh, while an
    output made of constants alone is typed on none: the block writes must reconcile them."""

    def step(x, key):
        return x + jax.random.normal(key, x.shape), jnp.int32(3)

    f = enn.ensemble_map(
        lambda x, k: enn.batch_invariant(step)(x, k), in_roles=enn.PER_CHAIN, block_size=4
    )
    keys = enn.chain_keys(jax.random.key(0), 8)
    with jax.set_mesh(explicit_mesh):
        moved, three = f(jnp.ones((8, 5)), keys)
    expected = jax.vmap(step)(jnp.ones((8, 5)), keys)[0]
    # A block of 4 and a plain vmap of 8 are different programs: their O(1) normal draws may
    # differ in the last bit (they do on jax 0.12), which 1 + draw near 0 makes a large
    # relative error; a few ulps of the draw, absolutely, is the honest bound.
    eps = np.finfo(np.float32).eps
    np.testing.assert_allclose(np.asarray(moved), np.asarray(expected), rtol=0, atol=8 * eps)
    assert int(three) == 3


def test_auto_block_size_depends_on_the_chain_count_only():
    from ensemblenn._context import current_frame  # private: the frame the blocks set

    seen = {}
    for devices in (1, 2, 4):
        for chains in (8, 64, 256):

            def per_chain(x, key=(devices, chains)):
                seen[key] = current_frame().block_size
                return enn.batch_invariant(lambda y: 2 * y)(x)

            out = enn.ensemble_map(
                per_chain, mesh=_mesh(devices), in_roles=enn.PER_CHAIN, block_size="auto"
            )(jnp.ones((chains, 3)))
            assert out.shape == (chains, 3) and float(out.sum()) == 6.0 * chains
    assert seen == {(d, c): max(1, c // 8) for d in (1, 2, 4) for c in (8, 64, 256)}
