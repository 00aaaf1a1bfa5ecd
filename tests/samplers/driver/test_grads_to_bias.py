"""`Result.grads_to_bias`: gradients per chain until the per-step ensemble b² stays below a
threshold, from the b² history and the gradient count recorded at every sampling step."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ensemblenn as enn
import samplers
from samplers.driver._bias import grads_to_threshold  # private: the search on its own

TARGET = samplers.targets.IllConditionedGaussian(dim=3, condition_number=4.0)


@pytest.fixture(scope="module", params=["explicit", "auto"])
def result(request):
    kind = (
        jax.sharding.AxisType.Explicit
        if request.param == "explicit"
        else jax.sharding.AxisType.Auto
    )
    mesh = jax.make_mesh((4,), ("chains",), axis_types=(kind,))
    return samplers.run(
        samplers.HMC(step_size=0.4, num_integration_steps=4, jitter=False),  # 4 grads/step
        TARGET,
        jnp.full((16, 3), 3.0),
        key=jax.random.key(0),
        num_steps=50,
        num_warmup=5,
        track_bias=True,
        mesh=mesh,
        progress=False,
    )


def test_hand_computed_crossing():
    b2 = [0.9, 0.2, 0.008, 0.03, 0.009, 0.002, 0.001]
    grads = [10, 20, 30, 40, 50, 60, 70]
    # Last step at or above 0.01 is index 3 (0.03): below from index 4 on, at 50 gradients.
    assert grads_to_threshold(b2, grads, 0.01) == 50.0
    assert grads_to_threshold(b2, grads, 0.5) == 20.0  # below from index 1
    assert grads_to_threshold(b2, grads, 1.0) == 10.0  # always below: the first step
    assert grads_to_threshold(b2, grads, 0.001) == math.inf  # the last step is not below
    assert grads_to_threshold([0.001, float("nan")], [1, 2], 0.01) == math.inf


def test_the_history_counts_gradients_per_sampling_step(result):
    # HMC with 4 leapfrog steps: 4 gradients per step, warmup (5 steps) included.
    expected = 4.0 * (5 + np.arange(1, 51))
    np.testing.assert_array_equal(np.asarray(result.grads_history), expected)
    assert result.bias_history.shape == (50, 2)
    b2, grads = result.bias_trajectory("mean")
    np.testing.assert_array_equal(b2, np.asarray(result.bias_history)[:, 1])


@pytest.mark.parametrize("reduction, column", [("max", 0), ("mean", 1)])
def test_grads_to_bias_reads_the_recorded_history(result, reduction, column):
    b2 = np.asarray(result.bias_history)[:, column]
    # A threshold just above the last step's b²: the crossing is after the last step that
    # is at or above it (4 gradients per step, 5 warmup steps before the first).
    threshold = float(b2[-1]) * 1.0001
    above = np.flatnonzero(~(b2 < threshold))
    first = above[-1] + 1 if above.size else 0
    assert first < len(b2)
    assert result.grads_to_bias(threshold, reduction=reduction) == 4.0 * (5 + first + 1)
    assert result.grads_to_bias(float(b2.min()), reduction=reduction) == math.inf


def test_synthetic_history_and_adaptation_prepended(result):
    synthetic = dataclasses.replace(
        result,
        bias_history=jnp.array([[0.5, 0.05], [0.02, 0.002], [0.005, 0.001]]),
        grads_history=jnp.array([100.0, 200.0, 300.0]),
    )
    assert synthetic.grads_to_bias(0.01) == 300.0
    assert synthetic.grads_to_bias(0.01, reduction="mean") == 200.0
    assert synthetic.grads_to_bias(0.001) == math.inf
    # The hook for adaptation phases: their rows come first, and the sampling gradients
    # count on from the adaptation's last.
    adapted = dataclasses.replace(
        synthetic, adaptation_bias=jnp.array([[0.9, 0.9, 10.0], [0.004, 0.0001, 20.0]])
    )
    b2, grads = adapted.bias_trajectory()
    np.testing.assert_array_equal(grads, [10.0, 20.0, 120.0, 220.0, 320.0])
    assert adapted.grads_to_bias(0.01) == 320.0
    assert adapted.grads_to_bias(0.06, reduction="mean") == 20.0  # 0.0001 < 0.06 from row 1


def test_errors_without_a_history(result):
    plain = samplers.run(samplers.MALA(0.5), TARGET, jnp.zeros((8, 3)), key=jax.random.key(0),
                         num_steps=5, progress=False)  # fmt: skip
    assert plain.grads_history is None
    with pytest.raises(enn.EnsembleError, match="track_bias=True"):
        plain.grads_to_bias()
    with pytest.raises(enn.EnsembleError, match='"max" or "mean"'):
        result.grads_to_bias(reduction="median")
