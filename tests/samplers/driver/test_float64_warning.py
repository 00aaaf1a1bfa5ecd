"""float64 positions without x64: `samplers.run` warns once (`samplers.PrecisionWarning`),
naming the leaf, the dtype, what happens (sampled in float32) and the fix; no warning for
float32 input, nor with x64 enabled (a subprocess: x64 is global)."""

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import samplers

ROOT = Path(__file__).resolve().parents[3]


def standard_normal(x):
    return -0.5 * sum(jnp.sum(leaf**2) for leaf in jax.tree.leaves(x))


def precision_warnings(positions):
    """`(the PrecisionWarnings of one short run, its result)`."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", samplers.ConvergenceWarning)
        result = samplers.run(samplers.MALA(0.5), standard_normal, positions,
                              key=jax.random.key(0), num_steps=2, progress=False)  # fmt: skip
    return [w for w in seen if issubclass(w.category, samplers.PrecisionWarning)], result


def test_numpy_float64_positions_warn_once():
    assert not jax.config.jax_enable_x64  # the suite runs in JAX's default float32
    caught, result = precision_warnings(np.zeros((8, 2)))
    assert len(caught) == 1 and issubclass(samplers.PrecisionWarning, UserWarning)
    message = str(caught[0].message)
    assert message.startswith(
        "positions has dtype float64, but jax_enable_x64 is off: it is sampled in float32."
    )
    assert 'jax.config.update("jax_enable_x64", True)' in message
    assert "before creating any arrays" in message and "float32" in message.splitlines()[1]
    assert caught[0].filename == __file__  # points at the call of samplers.run
    assert result.state.position.dtype == jnp.float32  # what the message says


def test_a_pytree_names_its_float64_leaf():
    positions = {"mu": np.zeros(8), "theta": np.zeros((8, 3), np.float32)}
    caught, result = precision_warnings(positions)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message.startswith("positions leaf 'mu' has dtype float64") and "'theta'" not in message
    assert result.state.position["mu"].dtype == jnp.float32
    nested = {"a": {"b": np.zeros((8, 2))}, "c": np.zeros((8, 1))}
    caught, _ = precision_warnings(nested)
    assert len(caught) == 1  # one warning, every float64 leaf named
    assert str(caught[0].message).startswith("positions leaves 'a.b', 'c' have dtype float64")


@pytest.mark.parametrize(
    "positions",
    [np.zeros((8, 2), np.float32), jnp.zeros((8, 2)), {"mu": np.zeros(8, np.float32)}],
    ids=["numpy float32", "jax float32", "pytree float32"],
)
def test_float32_positions_do_not_warn(positions):
    caught, _ = precision_warnings(positions)
    assert caught == []


def test_with_x64_enabled_float64_positions_do_not_warn():
    script = textwrap.dedent(
        """
        import warnings
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        import numpy as np
        import samplers
        warnings.simplefilter("error", samplers.PrecisionWarning)
        warnings.simplefilter("ignore", samplers.ConvergenceWarning)
        for positions in (np.zeros((8, 2)), {"mu": np.zeros(8), "theta": np.zeros((8, 3))}):
            result = samplers.run(
                samplers.MALA(0.5), lambda x: -0.5 * sum(jnp.sum(v**2) for v in
                jax.tree.leaves(x)), positions, key=jax.random.key(0), num_steps=2,
                progress=False)
            assert all(v.dtype == jnp.float64 for v in jax.tree.leaves(result.state.position))
        print("no warning")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no warning"
