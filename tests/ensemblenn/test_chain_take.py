"""`enn.chain_take`: a gather by global chain index that moves only the rows it needs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

import ensemblenn as enn
from ensemblenn import _chain_take  # private: its fallback is poisoned below to see the path

N = 16


def _mesh(kind, num_devices):
    axis = AxisType.Explicit if kind == "explicit" else AxisType.Auto
    return jax.make_mesh(
        (num_devices,), ("chains",), axis_types=(axis,), devices=jax.devices()[:num_devices]
    )


def _tree():
    return {
        "x": jnp.arange(N * 3.0).reshape(N, 3),
        "n": jnp.arange(N, dtype=jnp.int32) * 7,
        "ok": jnp.arange(N) % 3 == 0,
    }


def _take(mesh, tree, index, reach):
    body = lambda t, i: enn.chain_take(t, i, reach=reach)  # noqa: E731
    return enn.ensemble_map(body, in_roles=enn.PER_CHAIN, mesh=mesh)(tree, index)


_RNG = np.random.default_rng(0)
INDICES = {
    "sorted": np.sort(_RNG.integers(0, N, N)),
    "shift": (np.arange(N) + 1) % N,  # wraps: chain 15 reads chain 0, three blocks away
    "random": _RNG.integers(0, N, N),
    "far": np.clip(np.arange(N) + 6, 0, N - 1),
}


@pytest.mark.parametrize("kind", ["auto", "explicit"])
@pytest.mark.parametrize("num_devices", [1, 2, 4])
@pytest.mark.parametrize("reach", [None, 0, 1, 3, 4, 100])
@pytest.mark.parametrize("case", sorted(INDICES))
def test_takes_the_indexed_chains_on_any_mesh(kind, num_devices, reach, case):
    index = jnp.asarray(INDICES[case], jnp.int32)
    out = _take(_mesh(kind, num_devices), _tree(), index, reach)
    for name, leaf in _tree().items():
        np.testing.assert_array_equal(out[name], np.asarray(leaf)[INDICES[case]])
        assert out[name].dtype == leaf.dtype


def _poisoned_fallback(monkeypatch):
    real = _chain_take._gather_devices

    def poisoned(leaves, frame, *, tiled):
        return [jnp.full_like(x, -1) for x in real(leaves, frame, tiled=tiled)]

    monkeypatch.setattr(_chain_take, "_gather_devices", poisoned)


@pytest.mark.parametrize("kind", ["auto", "explicit"])
def test_near_indices_take_the_neighbour_path(kind, monkeypatch):
    """With every index within `reach` of its device's block, no chain reads the gathered
    ensemble (poisoned here): the rows come from the two neighbours."""
    _poisoned_fallback(monkeypatch)
    near = np.clip(np.arange(N) + np.array([-2, 2] * (N // 2)), 0, N - 1)  # 4 chains a device
    out = _take(_mesh(kind, 4), _tree(), jnp.asarray(near, jnp.int32), reach=2)
    np.testing.assert_array_equal(out["x"], np.asarray(_tree()["x"])[near])
    np.testing.assert_array_equal(out["n"], np.asarray(_tree()["n"])[near])


def test_one_far_index_sends_every_device_to_the_gather(monkeypatch):
    """A single index out of reach switches the whole ensemble to the all-gather: the
    poisoned fallback shows in every chain, not only the far one."""
    _poisoned_fallback(monkeypatch)
    index = np.arange(N)
    index[0] = N - 1  # chain 0 (device 0) reads the last chain (device 3)
    out = _take(_mesh("explicit", 4), _tree(), jnp.asarray(index, jnp.int32), reach=2)
    np.testing.assert_array_equal(out["n"], -np.ones(N))


@pytest.mark.parametrize(
    ("index", "reach", "says"),
    [
        (jnp.zeros((N, 2), jnp.int32), 1, "one integer per chain"),
        (jnp.zeros(N), 1, "one integer per chain"),
        (jnp.zeros(N, jnp.int32), -1, "reach must be None"),
        (jnp.zeros(N, jnp.int32), 1.5, "reach must be None"),
        (jnp.zeros(N, jnp.int32), True, "reach must be None"),
    ],
)
def test_bad_index_or_reach_is_a_collective_error(mesh, index, reach, says):
    with pytest.raises(enn.CollectiveError, match=says) as err:
        _take(mesh, _tree(), index, reach)
    assert "fix:" in str(err.value)


def test_outside_ensemble_map_is_a_collective_error():
    with pytest.raises(enn.CollectiveError, match="outside a function run by ensemble_map"):
        enn.chain_take(jnp.zeros(3), 0)
