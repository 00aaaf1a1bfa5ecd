"""b² recorded during adaptation (`Result.adaptation_bias`): one row per adaptation step of
LAPS, ChEES, MEADS and WindowAdaptation, read-only, and continued by the sampling steps."""

import importlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ensemblenn as enn
import samplers
from samplers import checkpoint
from tests.interrupt import after_save

# Short runs from far off: not converged, by design.
pytestmark = pytest.mark.filterwarnings("ignore::samplers.ConvergenceWarning")

TARGET = samplers.targets.IllConditionedGaussian(dim=3, condition_number=4.0)
NUM_CHAINS = 16
# Far from the target (variance <= 1): b² starts in the thousands.
START = 10.0 + jax.random.normal(jax.random.key(0), (NUM_CHAINS, 3))
WINDOW = dict(initial_buffer=10, first_window=10, final_buffer=10)

CASES = {
    # name: (sampler, adaptation, the number of adaptation steps it takes, or None: early stop)
    "laps": (None, samplers.LAPS(num_steps1=40, num_adaptation_steps=10), None),
    "chees": (samplers.HMC(0.1, 4), samplers.ChEES(num_steps=30), 30),
    "meads": (samplers.GHMC(0.1, 0.5), samplers.MEADS(num_steps=30), 30),
    "window": (samplers.MALA(0.1), samplers.WindowAdaptation(num_steps=40, **WINDOW), 40),
}


def run(name, mesh, *, track_bias=True, **kwargs):
    """The case's run, and the positions the adaptation handed to sampling."""
    sampler, adaptation, _ = CASES[name]
    driver = importlib.import_module("samplers.driver._run")  # private: spied on, see below
    handed = {}
    prepare = driver.prepare

    def spy(*args, **kw):
        out = prepare(*args, **kw)
        position = out[1].state.position
        if not isinstance(position, jax.core.Tracer):  # a resumed run only traces it
            handed["position"] = np.asarray(position)
        return out

    driver.prepare = spy
    try:
        result = samplers.run(
            sampler, TARGET, START, key=jax.random.key(1), num_steps=kwargs.pop("num_steps", 5),
            adaptation=adaptation, track_bias=track_bias, mesh=mesh, progress=False, **kwargs,
        )  # fmt: skip
    finally:
        driver.prepare = prepare
    return result, handed.get("position")


def numpy_b2(position):
    """(b² max, b² mean) of the ensemble at `position`, against the target's reference."""
    second = np.mean(np.asarray(position, np.float64) ** 2, axis=0)
    ref = TARGET.reference
    b2 = (second - np.asarray(ref.second_moment)) ** 2 / np.asarray(ref.second_moment_var)
    return np.array([b2.max(), b2.mean()])


@pytest.fixture(scope="module", params=[(n, m) for n in CASES for m in ("explicit", "auto")],
                ids=lambda p: f"{p[0]}-{p[1]}")  # fmt: skip
def case(request):
    name, kind = request.param
    axis_type = jax.sharding.AxisType.Explicit if kind == "explicit" else jax.sharding.AxisType.Auto
    mesh = jax.make_mesh((4,), ("chains",), axis_types=(axis_type,))
    return name, mesh, *run(name, mesh)


def test_one_row_per_adaptation_step(case):
    name, _, result, _ = case
    rows = np.asarray(result.adaptation_bias)
    info = result.adaptation_info
    steps = CASES[name][2]
    if steps is None:  # LAPS: the phase-1 steps taken, then the phase-2 steps
        steps = int(info.num_steps1) + 10
    assert rows.shape == (steps, 3)
    assert np.all(np.isfinite(rows))
    grads = rows[:, 2]
    assert np.all(np.diff(grads) >= 0) and grads[0] > 0
    assert grads[-1] == int(info.num_grads)
    # The raw buffer stays in the adaptation's info (NaN rows for steps not taken).
    assert info.bias_history.shape[0] >= steps


def test_last_row_is_the_b2_of_the_positions_handed_to_sampling(case):
    _, _, result, handed = case
    last = np.asarray(result.adaptation_bias)[-1, :2]
    np.testing.assert_allclose(last, numpy_b2(handed), rtol=1e-4, atol=1e-7)
    # Not the starting positions' b², nor the final ones'.
    assert not np.allclose(last, numpy_b2(START), rtol=1e-2)
    assert not np.allclose(last, numpy_b2(result.state.position), rtol=1e-4, atol=1e-7)


def test_b2_falls_from_a_far_start(case):
    name, _, result, _ = case
    rows = np.asarray(result.adaptation_bias)
    # E[x²] ~ 100 where the target has <= 1 (b² ~ 5000); WindowAdaptation's large first
    # MALA steps jump most of the way in.
    assert rows[0, 0] > 10.0
    if name != "meads":  # 30 MEADS steps from a far start are still on the way in
        assert rows[-1, 0] < 1e-2 * rows[0, 0]
    assert rows[-1, 0] < rows[0, 0]


def test_grads_to_bias_over_adaptation_and_sampling(case):
    _, _, result, _ = case
    adapt = np.asarray(result.adaptation_bias, np.float64)
    b2, grads = result.bias_trajectory("max")
    np.testing.assert_array_equal(b2[: len(adapt)], adapt[:, 0])
    np.testing.assert_array_equal(b2[len(adapt) :], np.asarray(result.bias_history)[:, 0])
    sampled = np.asarray(result.grads_history, np.float64) + adapt[-1, 2]
    np.testing.assert_array_equal(grads, np.concatenate([adapt[:, 2], sampled]))
    for threshold in (1e3, 1.0, 0.1, float(np.median(b2)), float(b2.min())):
        # The rule of samplers.driver._bias, by hand: the step after the last one at or
        # above the threshold.
        above = np.flatnonzero(~(b2 < threshold))
        if above.size and above[-1] == len(b2) - 1:
            expected = math.inf
        else:
            expected = grads[above[-1] + 1] if above.size else grads[0]
        assert result.grads_to_bias(threshold) == expected


@pytest.mark.parametrize("name", ["laps", "window"])
def test_tracking_changes_no_sampled_bit(name, explicit_mesh):
    on, _ = run(name, explicit_mesh)
    off, _ = run(name, explicit_mesh, track_bias=False)
    assert off.adaptation_bias is None and off.adaptation_info.bias_history is None
    assert on.adaptation_bias is not None
    np.testing.assert_array_equal(np.asarray(on.state.position), np.asarray(off.state.position))
    for a, b in zip(jax.tree.leaves(on.sampler), jax.tree.leaves(off.sampler)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("name", ["laps", "window"])
def test_the_same_rows_on_one_and_four_devices(name):
    """Device-count invariance of the rows: the 4-device run against 1 device (a reduction
    whose order followed the sharding differs there already). Each device count is a ~25 s
    compilation; LAPS's and WindowAdaptation's own invariance tests run 2 and 8 devices
    (without the rows)."""
    rows = {}
    for n in (4, 1):
        mesh = jax.make_mesh((n,), ("chains",), devices=jax.devices()[:n])
        rows[n] = np.asarray(run(name, mesh, block_size="auto")[0].adaptation_bias)
    assert rows[4].shape[0] > 0 and np.all(np.isfinite(rows[4]))
    np.testing.assert_array_equal(rows[1], rows[4])


def test_an_adaptation_without_support_records_nothing(explicit_mesh):
    class Halve(samplers.Adaptation):
        def run(self, sampler, logdensity, state, key):
            return samplers.MALA(enn.chain_mean(jnp.ones(())) * 0.5), state, {"ok": True}

    result = samplers.run(samplers.MALA(0.1), TARGET, START, key=jax.random.key(1),
                          num_steps=5, adaptation=Halve(), track_bias=True,
                          mesh=explicit_mesh, progress=False)  # fmt: skip
    assert result.adaptation_bias is None
    assert result.bias_history.shape == (5, 2)
    b2, grads = result.bias_trajectory()
    assert b2.shape == (5,) and grads.tolist() == np.asarray(result.grads_history).tolist()


def test_a_resumed_run_has_the_same_adaptation_bias(tmp_path):
    class Interrupt(Exception):
        pass

    kwargs = dict(num_steps=20, chunk_size=5, checkpoint_dir=tmp_path)
    uninterrupted, _ = run("laps", None, num_steps=20, chunk_size=5)
    with pytest.raises(Interrupt):
        run("laps", None, **kwargs, on_chunk=after_save(tmp_path, 10, Interrupt))
    assert checkpoint.inspect(tmp_path)["step"] == 10
    resumed, _ = run("laps", None, resume=True, **kwargs)
    np.testing.assert_array_equal(
        np.asarray(resumed.adaptation_bias), np.asarray(uninterrupted.adaptation_bias)
    )
    np.testing.assert_array_equal(
        np.asarray(resumed.state.position), np.asarray(uninterrupted.state.position)
    )


def test_the_monitor_is_no_setting_of_the_fingerprint():
    # Checkpoints written before adaptations had a bias_monitor field still resume.
    from samplers.checkpoint._fingerprint import _digest  # private: the hash compared

    monitor = samplers.adaptation.BiasMonitor(jnp.ones(3), jnp.ones(3))
    for _, adaptation, _ in CASES.values():
        assert _digest(adaptation.with_bias_monitor(monitor)) == _digest(adaptation)
    assert _digest(samplers.LAPS(num_steps1=41)) != _digest(samplers.LAPS(num_steps1=40))


def test_the_cli_mclmc_tuning_records_its_steps(explicit_mesh):
    result = samplers.run(None, TARGET, START, key=jax.random.key(1), num_steps=5,
                          adaptation=samplers.MCLMCTuning(num_steps=40), track_bias=True,
                          mesh=explicit_mesh, progress=False)  # fmt: skip
    rows = np.asarray(result.adaptation_bias)
    info = result.adaptation_info
    assert rows.shape == (int(info.num_steps), 3) and np.all(np.isfinite(rows))
    assert rows[-1, 2] == int(info.num_grads) and rows[0, 0] > 100 * rows[-1, 0]
