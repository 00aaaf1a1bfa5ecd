"""An SMC run saved after every stage, interrupted, and resumed: bitwise the uninterrupted
run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import samplers
from samplers.smc._history import History  # private: a stage interrupted at its bookkeeping

N = 128


def log_prior(x):
    return -0.5 * jnp.sum(x**2)


def log_likelihood(x):
    return -2.0 * jnp.sum((x - 1.0) ** 2)


START = jax.random.normal(jax.random.key(0), (N, 3))
SMC = samplers.SMC(samplers.MALA(step_size=0.5), num_mutation_steps=2)
FIELDS = ("temperatures", "ess", "acceptance", "step_sizes", "lineages", "mutation_steps",
          "log_evidence_increments")  # fmt: skip


def run(**kwargs):
    return SMC.run(log_prior, log_likelihood, START, key=jax.random.key(1), **kwargs)


def assert_same(a, b):
    np.testing.assert_array_equal(a.particles, b.particles)
    np.testing.assert_array_equal(a.log_likelihood, b.log_likelihood)
    np.testing.assert_array_equal(a.kernel.inverse_mass_matrix, b.kernel.inverse_mass_matrix)
    assert (a.log_evidence, a.log_evidence_se) == (b.log_evidence, b.log_evidence_se)
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_interrupted_and_resumed_is_the_uninterrupted_run(tmp_path, monkeypatch):
    full = run()
    assert full.num_stages >= 3
    moved, calls = History.moved, []

    def interrupted(self, *args):  # stop during the third stage's bookkeeping
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return moved(self, *args)

    monkeypatch.setattr(History, "moved", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(checkpoint_dir=tmp_path)
    monkeypatch.setattr(History, "moved", moved)
    assert [p.name for p in tmp_path.iterdir()] == ["smc.npz"]
    assert samplers.SMC.saved_stages(tmp_path) == 2
    assert_same(run(checkpoint_dir=tmp_path, resume=True), full)
    assert samplers.SMC.saved_stages(tmp_path) == full.num_stages
    # A complete checkpoint: nothing left to run, the same result.
    assert_same(run(checkpoint_dir=tmp_path, resume=True), full)
    assert samplers.SMC.saved_stages(tmp_path / "absent") is None
    (tmp_path / "smc.npz").write_bytes(b"not a checkpoint")
    assert samplers.SMC.saved_stages(tmp_path) is None


def test_checkpoint_of_another_run_or_not_resuming_is_refused(tmp_path):
    run(checkpoint_dir=tmp_path)
    with pytest.raises(samplers.CheckpointMismatchError, match="another configuration"):
        SMC.run(log_prior, log_likelihood, START, key=jax.random.key(2),
                checkpoint_dir=tmp_path, resume=True)  # fmt: skip
    with pytest.raises(samplers.CheckpointError, match="resume=False") as info:
        run(checkpoint_dir=tmp_path)
    assert "\n  fix: resume=True" in str(info.value)
    with pytest.raises(samplers.CheckpointError):
        run(checkpoint_dir=tmp_path / "smc.npz")  # a file, not a folder
