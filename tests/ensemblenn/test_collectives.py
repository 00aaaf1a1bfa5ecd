"""Cross-chain collectives and per-chain keys."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ensemblenn as enn


def canonical_tree_sum(x):
    """The documented order: pairwise over the global chain index, zero-padded to 2^k."""
    x = np.asarray(x, np.float32)
    size = 1 << max(len(x) - 1, 0).bit_length()
    x = np.concatenate([x, np.zeros((size - len(x),) + x.shape[1:], np.float32)])
    while len(x) > 1:
        x = (x[0::2] + x[1::2]).astype(np.float32)
    return x[0]


@pytest.mark.parametrize("num_chains", [4, 8, 12, 20, 24, 32, 44, 96])  # 12: 3 per device
def test_chain_sum_and_mean_follow_the_fixed_tree(mesh, num_chains):
    x = jax.random.normal(jax.random.key(0), (num_chains, 3))

    def body(x):
        return enn.chain_sum(x * x), enn.chain_mean(x), enn.chain_sum({"a": x, "n": 1})

    total, mean, tree = enn.ensemble_map(body, mesh=mesh, in_roles=enn.PER_CHAIN)(x)
    squares = (np.asarray(x) * np.asarray(x)).astype(np.float32)
    np.testing.assert_array_equal(total, canonical_tree_sum(squares))
    # (XLA may divide by multiplying with 1/n: same on every device count, not always IEEE /.)
    np.testing.assert_allclose(mean, canonical_tree_sum(x) / np.float32(num_chains), rtol=2e-7)
    np.testing.assert_array_equal(tree["a"], canonical_tree_sum(x))
    assert int(tree["n"]) == num_chains


def test_all_gather_index_and_count(mesh):
    x = jnp.arange(12.0).reshape(12, 1)

    def body(x):
        everyone = enn.chain_all_gather(x)
        return everyone, enn.chain_index(), enn.num_chains() + x * 0

    gathered, index, count = enn.ensemble_map(body, mesh=mesh, in_roles=enn.PER_CHAIN)(x)
    np.testing.assert_array_equal(gathered, x)  # global chain order, returned once
    np.testing.assert_array_equal(index, np.arange(12))
    np.testing.assert_array_equal(count, np.full((12, 1), 12.0))


@pytest.mark.parametrize("devices", [1, 4])
def test_all_gather_of_mixed_dtypes_is_exact_and_packed(devices):
    """32-bit leaves of every kind travel together as their bits: exact copies (negative
    zero, a NaN payload, negative ints, booleans), one collective for all of them."""
    mesh = jax.make_mesh((devices,), ("chains",), devices=jax.devices()[:devices])
    bits = np.array([0x80000000, 0x7FC01234, 0x3F800000, 0xFF800000] * 2, np.uint32)
    tree = {
        "f": jnp.asarray(bits.view(np.float32)).reshape(8, 1),
        "i": jnp.arange(-4, 4, dtype=jnp.int32),
        "u": jnp.asarray(bits),
        "b": jnp.arange(8) % 3 == 0,
        "h": jnp.arange(8, dtype=jnp.float16),  # another width: a buffer of its own
    }
    f = enn.ensemble_map(enn.chain_all_gather, mesh=mesh, in_roles=enn.PER_CHAIN)
    out = f(tree)
    assert np.asarray(out["f"]).view(np.uint32).tolist() == bits.reshape(8, 1).tolist()
    for name in ("i", "u", "b", "h"):
        assert out[name].dtype == tree[name].dtype
        np.testing.assert_array_equal(out[name], tree[name])
    if devices > 1:
        text = str(jax.make_jaxpr(f)(tree))
        assert text.count("all_gather[") == 2, text  # the 32-bit leaves, then float16


def test_collectives_outside_ensemble_map_raise():
    for fn in (enn.chain_mean, enn.chain_sum, enn.chain_all_gather):
        with pytest.raises(enn.CollectiveError, match="outside a function run by ensemble_map"):
            fn(jnp.ones(3))
    with pytest.raises(enn.CollectiveError):
        enn.chain_index()
    with pytest.raises(enn.CollectiveError):
        enn.num_chains()


def test_non_finite_values_propagate(mesh):
    x = jnp.array([1.0, jnp.inf, 2.0, 3.0, 0, 0, 0, 0])
    total = enn.ensemble_map(lambda x: enn.chain_sum(x), mesh=mesh, in_roles=enn.PER_CHAIN)(x)
    assert float(total) == np.inf


def test_chain_keys_typed_and_raw():
    typed = enn.chain_keys(jax.random.key(7), 6)
    raw = enn.chain_keys(jax.random.PRNGKey(7), 6)
    assert typed.shape == (6,) and raw.shape == (6, 2) and raw.dtype == jnp.uint32
    np.testing.assert_array_equal(jax.random.key_data(typed), raw)
    # Key i depends on i only: a bigger ensemble keeps the existing chains' keys.
    np.testing.assert_array_equal(
        jax.random.key_data(enn.chain_keys(jax.random.key(7), 10))[:6], jax.random.key_data(typed)
    )
    assert len({tuple(k) for k in np.asarray(raw)}) == 6


@pytest.mark.parametrize(
    "bad",
    [
        jax.random.split(jax.random.key(0), 2),
        jnp.zeros((4, 2), jnp.uint32),
        jnp.zeros(2, jnp.float32),
    ],
)
def test_chain_keys_rejects_key_arrays_of_the_wrong_shape(bad):
    with pytest.raises(enn.EnsembleError, match="key"):
        enn.chain_keys(bad, 4)


def test_chain_keys_rejects_bad_counts():
    with pytest.raises(enn.EnsembleError, match="positive int"):
        enn.chain_keys(jax.random.key(0), 0)


def test_per_chain_keys_give_per_chain_draws(mesh):
    keys = enn.chain_keys(jax.random.key(1), 8)
    draws = enn.ensemble_map(
        lambda k: jax.random.normal(k, (2,)), mesh=mesh, in_roles=enn.PER_CHAIN
    )(keys)
    np.testing.assert_array_equal(draws, jax.vmap(lambda k: jax.random.normal(k, (2,)))(keys))


@pytest.mark.parametrize("length", [1, 2, 3, 5, 7, 8, 25, 37, 100, 129])
def test_ordered_sum_follows_the_fixed_tree(length):
    """Byte for byte (signed zeros too) the zero-padded pairwise tree, per row and under
    vmap: magnitudes over 12 decades make any other association order round differently."""
    rng = np.random.default_rng(length)
    x = rng.standard_normal((3, length)) * 10.0 ** rng.integers(-6, 6, (3, length))
    x = np.where(rng.random((3, length)) < 0.1, -0.0, x).astype(np.float32)
    expected = np.stack([canonical_tree_sum(row) for row in x])
    assert enn.ordered_sum(x).tobytes() == expected.tobytes()
    assert jax.jit(jax.vmap(enn.ordered_sum))(x).tobytes() == expected.tobytes()
    np.testing.assert_array_equal(enn.ordered_sum(x.T, axis=0), enn.ordered_sum(x))
    assert enn.ordered_sum(jnp.arange(4)).dtype == jnp.arange(4).dtype  # ints stay ints


def test_ordered_sum_is_the_same_for_any_chains_per_device():
    """Per-chain sums over 100 dimensions, with 64, 32 and 16 chains per device, in the
    bitwise mode (a block_size; the sums outside the blocks): jnp.sum may round
    differently for these batch shapes, ordered_sum not."""
    x = jax.random.normal(jax.random.key(0), (64, 100))
    out = {}
    for n in (1, 2, 4):
        mesh = jax.make_mesh((n,), ("chains",), devices=jax.devices()[:n])
        f = enn.ensemble_map(
            lambda v: enn.ordered_sum(v * v / 3.0), mesh=mesh, in_roles=enn.PER_CHAIN,
            block_size=8,
        )  # fmt: skip
        out[n] = np.asarray(f(x))
    np.testing.assert_array_equal(out[1], out[2])
    np.testing.assert_array_equal(out[1], out[4])
    np.testing.assert_allclose(out[1], np.sum(np.asarray(x) ** 2 / 3.0, axis=1), rtol=1e-5)


def _multiplies(fn, x, **options) -> int:
    jaxpr = jax.make_jaxpr(enn.ensemble_map(fn, in_roles=enn.PER_CHAIN, **options))(x)
    return str(jaxpr).count(" mul ")


@pytest.mark.parametrize("block_size", [None, 8])
def test_rounding_guards_act_only_where_bits_are_promised(block_size):
    """Without a block_size an ensemble_map promises results to rounding only: rounded is
    x and ordered_sum is jnp.sum there (no guard ending a fusion, no tree); with one (and
    outside ensemble_map) both keep their bits."""
    x = jax.random.normal(jax.random.key(0), (16, 100))
    plain = _multiplies(lambda v: 2.0 * v, x, block_size=block_size)
    guarded = _multiplies(lambda v: enn.rounded(2.0 * v), x, block_size=block_size)
    assert guarded == (plain if block_size is None else plain + 2)  # 0 * first, x * one
    tree = enn.ensemble_map(enn.ordered_sum, in_roles=enn.PER_CHAIN, block_size=block_size)
    flat = enn.ensemble_map(jnp.sum, in_roles=enn.PER_CHAIN, block_size=block_size)
    if block_size is None:
        np.testing.assert_array_equal(tree(x), flat(x))  # the very same program
    else:
        expected = np.stack([canonical_tree_sum(row) for row in np.asarray(x)])
        np.testing.assert_array_equal(tree(x), expected)
    assert str(jax.make_jaxpr(lambda v: enn.rounded(2.0 * v))(x)).count(" mul ") == 3


def test_rounded_keeps_values_and_non_floats():
    x = jnp.array([1.5, -jnp.inf, jnp.nan])
    r = enn.rounded(x)
    assert r[0] == 1.5 and r[1] == -jnp.inf and bool(jnp.isnan(r[2]))
    assert enn.rounded(jnp.arange(3)).dtype == jnp.arange(3).dtype
    # The 1.0 is taken from the first element: a non-finite one must not spread.
    r = enn.rounded(jnp.array([jnp.nan, 1.5, -2.0]))
    assert bool(jnp.isnan(r[0])) and r[1] == 1.5 and r[2] == -2.0
    assert enn.rounded(jnp.zeros((0, 3))).shape == (0, 3)


def test_rounded_survives_compilation():
    """The rounding multiply is still in the optimized program (XLA did not fold the 1.0),
    and the result is the unfused `round(round(a * b) + c)`."""
    a = b = np.float32(1 + 2**-12)  # a * b = 1 + 2^-11 + 2^-24: not a float32
    c = np.float32(-1.0)
    f = jax.jit(lambda a, b, c: enn.rounded(a * b) + c)
    hlo = f.lower(a, b, c).compile().as_text()
    assert hlo.count(" multiply(") >= 2, hlo
    expected = np.float32(np.float32(a * b) + c)  # NumPy rounds the product: no FMA
    assert float(f(a, b, c)) == float(expected) != 0.0


@pytest.mark.parametrize("devices,num_chains", [(1, 7), (2, 6), (3, 12), (3, 15), (3, 33), (2, 22)])
def test_fixed_tree_on_other_device_counts(devices, num_chains):
    """Blocks of 7, 3, 4, 5, 11 and 11 chains per device: the same canonical tree."""
    mesh = jax.make_mesh((devices,), ("chains",), devices=jax.devices()[:devices])
    x = jax.random.normal(jax.random.key(num_chains), (num_chains, 2))
    total = enn.ensemble_map(lambda v: enn.chain_sum(v), mesh=mesh, in_roles=enn.PER_CHAIN)(x)
    np.testing.assert_array_equal(total, canonical_tree_sum(x))


def test_uneven_blocks_gather_node_sums_not_every_chain():
    """96 chains on 4 devices (24 each): what crosses devices is a few tree-node sums per
    device, not every chain's value."""
    mesh = jax.make_mesh((4,), ("chains",))
    f = enn.ensemble_map(lambda v: enn.chain_sum(v), mesh=mesh, in_roles=enn.PER_CHAIN)
    hlo = jax.jit(f).lower(jnp.ones((96, 1000))).compile().as_text()
    gathers = [line for line in hlo.splitlines() if "all-gather(" in line]
    assert gathers, "expected the node sums to be all-gathered"
    # 24 = 16 + 8: two nodes per device at most here, so (4, 2, 1000) floats, not (96, 1000)
    assert all("96,1000" not in line for line in gathers), gathers


@pytest.mark.parametrize("num_chains", [1, 3, 8, 13])
def test_chain_keys_follow_the_documented_fold_in_recipe(num_chains):
    key = jax.random.key(5)
    keys = enn.chain_keys(key, num_chains)
    for i in sorted({0, min(1, num_chains - 1), num_chains // 2, num_chains - 1}):
        expected = jax.random.key_data(jax.random.fold_in(key, i))
        np.testing.assert_array_equal(jax.random.key_data(keys[i]), expected, err_msg=str(i))
    raw = enn.chain_keys(jax.random.PRNGKey(5), num_chains)
    np.testing.assert_array_equal(
        raw[-1], jax.random.fold_in(jax.random.PRNGKey(5), num_chains - 1)
    )


def test_chain_keys_on_a_mesh_with_one_process_are_the_plain_keys(mesh):
    plain = enn.chain_keys(jax.random.key(2), 8)
    on_mesh = enn.chain_keys(jax.random.key(2), 8, mesh=mesh, axis="chains")
    np.testing.assert_array_equal(jax.random.key_data(on_mesh), jax.random.key_data(plain))
