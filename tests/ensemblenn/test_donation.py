"""`ensemble_map(..., donate_argnums=...)`: buffers a loop of calls updates in place."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import ensemblenn as enn


def _write(buffer, value, slot):
    return buffer.at[slot].set(value), 2 * value


def _mapped(mesh, donate):
    return enn.ensemble_map(
        _write,
        mesh=mesh,
        in_roles=(enn.PER_CHAIN, enn.PER_CHAIN, enn.BROADCAST),
        out_roles=(enn.PER_CHAIN, enn.PER_CHAIN),
        donate_argnums=donate,
    )


def _meshes():
    one = jax.devices()[:1]
    return [
        pytest.param(lambda k: jax.make_mesh((4,), ("chains",), axis_types=(k,)), id="4"),
        pytest.param(
            lambda k: jax.make_mesh((1,), ("chains",), axis_types=(k,), devices=one), id="1"
        ),
    ]


@pytest.mark.parametrize("make", _meshes())
@pytest.mark.parametrize("kind", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
def test_a_donated_buffer_is_updated_in_place_call_after_call(make, kind, monkeypatch):
    mesh = make(kind)
    f = _mapped(mesh, 0)
    values = jnp.arange(8.0)
    buffer = jax.device_put(jnp.zeros((8, 3)), NamedSharding(mesh, P("chains")))
    first, doubled = f(buffer, values, 0)
    put, placed = jax.device_put, []
    monkeypatch.setattr(
        jax, "device_put", lambda x, *a, **k: placed.append(x is first) or put(x, *a, **k)
    )
    second, _ = f(first, values + 1, 2)
    monkeypatch.undo()
    # An output passed back in is not put on the mesh again (on a one-device Explicit mesh
    # it is: there the spec is the array's type, see the program's one-device process test).
    assert not any(placed) or (mesh.size == 1 and kind == AxisType.Explicit)
    # Each call's input buffer was taken by the call (not a copy of it).
    assert buffer.is_deleted() and first.is_deleted()
    expected = np.zeros((8, 3), np.float32)
    expected[:, 0], expected[:, 2] = np.arange(8.0), np.arange(8.0) + 1
    np.testing.assert_array_equal(np.asarray(second), expected)
    np.testing.assert_array_equal(np.asarray(doubled), 2 * np.arange(8.0))
    assert not values.is_deleted()  # only the donated argument


def test_without_donation_the_inputs_stay_alive(auto_mesh):
    f = _mapped(auto_mesh, ())
    buffer = jnp.zeros((8, 3))
    out, _ = f(buffer, jnp.arange(8.0), 1)
    assert not buffer.is_deleted()
    np.testing.assert_array_equal(np.asarray(buffer), 0.0)
    np.testing.assert_array_equal(np.asarray(out[:, 1]), np.arange(8.0))


def test_donating_an_argument_the_call_lacks_is_a_clear_error(auto_mesh):
    f = _mapped(auto_mesh, 3)
    with pytest.raises(
        enn.EnsembleTypeError, match=r"donate_argnums names argument 3.*3 positional"
    ):
        f(jnp.zeros((8, 3)), jnp.arange(8.0), 1)


@pytest.mark.parametrize("bad", ["a", -1, (0, 1.5), True])
def test_a_bad_donate_argnums_is_a_clear_error(bad):
    with pytest.raises(enn.EnsembleTypeError, match="donate_argnums must be a non-negative int"):
        enn.ensemble_map(_write, donate_argnums=bad)


def test_on_a_one_device_process_the_output_is_donated_again_without_a_copy():
    # One device in the process (conftest gives this one four): shard_map's outputs come
    # back as P(), not the P("chains") an input is placed as; the donation must still reach
    # the caller's buffer (a copy made by the placing would be donated instead).
    script = Path(__file__).parents[1] / "programs" / "one_device_donation.py"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["devices"] == 1
    assert got["first_taken"], "the second call copied its donated input instead of taking it"
    assert not got["first_put_again"], "an output laid out as P() was put again as P(chains)"
    assert got["values"] == [[i, i, 0.0] for i in range(8)]
