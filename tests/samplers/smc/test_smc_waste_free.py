"""Waste-free SMC (`SMC(waste_free=P)`): the evidence against a closed form, the same bits
on 1, 2 and 4 devices, chains of P states from N / P resampled starts, checkpoints, and
bad arguments refused before anything compiles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import samplers
from tests.compile_counter import counting
from tests.samplers.smc.test_smc_evidence import PRIOR_SD, conjugate_gaussian

HMC = samplers.HMC(step_size=0.5, num_integration_steps=4)


def log_prior(x):
    return -0.5 * jnp.sum(x**2)


def log_likelihood(x):
    return -2.0 * jnp.sum((x - 1.0) ** 2)


def fix_line(message):
    return any(line.startswith("  fix: ") for line in message.splitlines())


def start(n, dim=3, seed=0):
    return jax.random.normal(jax.random.key(seed), (n, dim))


def test_log_evidence_of_a_conjugate_gaussian():
    log_prior_, log_likelihood_, exact = conjugate_gaussian(10)
    smc = samplers.SMC(HMC, num_mutation_steps=1, waste_free=8)
    particles = PRIOR_SD * jax.random.normal(jax.random.key(0), (512, 10))
    result = smc.run(log_prior_, log_likelihood_, particles, key=jax.random.key(1))
    assert result.temperatures[-1] == 1.0 and result.verdict.converged, result.summary()
    assert abs(result.log_evidence - exact) < 3 * result.log_evidence_se, (
        result.log_evidence, exact, result.log_evidence_se,
    )  # fmt: skip
    assert 0.02 < result.log_evidence_se < 0.5  # a standard error with teeth
    # The posterior: x | y ~ N(y PRIOR_SD^2 / (PRIOR_SD^2 + 1), PRIOR_SD^2 / (PRIOR_SD^2 + 1)).
    y = jnp.asarray(np.random.default_rng(10).normal(0.0, np.sqrt(PRIOR_SD**2 + 1), 10))
    shrink = PRIOR_SD**2 / (PRIOR_SD**2 + 1)
    mean = np.asarray(result.particles).mean(0)
    np.testing.assert_allclose(mean, shrink * np.asarray(y, np.float32), atol=0.35)


@pytest.mark.slow
def test_standard_error_against_the_spread_over_seeds():
    # The lineage standard error counts what the chains share: its mean square against
    # the variance of log Z over 16 seeds, within the chi2(15) 0.1% and 99.9% quantiles
    # (measured: sd 0.137 over seeds, rms se 0.142).
    log_prior_, log_likelihood_, exact = conjugate_gaussian(10)
    smc = samplers.SMC(HMC, num_mutation_steps=1, waste_free=8)
    log_z, se = [], []
    for seed in range(16):
        particles = PRIOR_SD * jax.random.normal(jax.random.key(seed), (512, 10))
        result = smc.run(log_prior_, log_likelihood_, particles, key=jax.random.key(1000 + seed))
        log_z.append(result.log_evidence)
        se.append(result.log_evidence_se)
    log_z, se = np.array(log_z), np.array(se)
    low, high = stats.chi2.ppf([0.001, 0.999], 15) / 15
    assert low < log_z.var(ddof=1) / np.mean(se**2) < high, (log_z.std(ddof=1), se.mean())
    assert abs(log_z.mean() - exact) < 3 * np.sqrt(np.mean(se**2) / 16), (log_z.mean(), exact)


def test_chains_of_p_states_from_n_over_p_starts(mesh):
    n, length, steps = 128, 8, 2
    smc = samplers.SMC(samplers.RandomWalk(0.5), num_mutation_steps=steps, waste_free=length)
    result = smc.run(log_prior, log_likelihood, start(n), key=jax.random.key(1), mesh=mesh)
    chains = n // length
    ancestors = np.asarray(result.ancestors)
    # Each run of P particles is one chain: they share the start's ancestor, and at most
    # M = N / P particles were resampled (resample-move would keep ~0.4 N distinct ones).
    assert np.all(ancestors.reshape(chains, length) == ancestors[::length, None])
    assert len(np.unique(ancestors)) <= chains
    np.testing.assert_array_equal(result.mutation_steps, (length - 1) * steps)
    # The states move along each chain, and each particle's log likelihood is its own.
    path = np.asarray(result.particles).reshape(chains, length, -1)
    assert np.mean(np.any(path[:, 1:] != path[:, :-1], axis=-1)) > 0.3
    np.testing.assert_allclose(result.log_likelihood, jax.vmap(log_likelihood)(result.particles),
                               rtol=1e-5)  # fmt: skip
    np.testing.assert_allclose(result.log_prior, jax.vmap(log_prior)(result.particles),
                               rtol=1e-5)  # fmt: skip
    first = result.summary(print_it=False).splitlines()[0]
    assert first.endswith(f"x {steps} steps between the {length} states of {chains} waste-free "
                          "chains"), first  # fmt: skip


def test_chains_that_never_move_leave_at_most_m_distinct_particles():
    # A random walk whose proposals are never accepted: every chain is its start P times.
    smc = samplers.SMC(samplers.RandomWalk(1e4), num_mutation_steps=1, metric=None,
                       waste_free=4, target_acceptance=0.01)  # fmt: skip
    result = smc.run(log_prior, log_likelihood, start(64), key=jax.random.key(2))
    flat = result.flat_particles().reshape(16, 4, -1)
    assert np.all(flat == flat[:, :1])
    assert len(np.unique(result.flat_particles(), axis=0)) <= 16


def test_the_same_bits_on_1_2_and_4_devices():
    smc = samplers.SMC(HMC, num_mutation_steps=1, waste_free=4)
    runs = []
    for d in (1, 2, 4):
        mesh = jax.make_mesh((d,), ("chains",), devices=jax.devices()[:d])
        runs.append(smc.run(log_prior, log_likelihood, start(128), key=jax.random.key(3),
                            mesh=mesh, block_size="auto"))  # fmt: skip
    one = runs[0]
    assert one.num_stages >= 3
    for other in runs[1:]:
        for name in ("particles", "log_likelihood", "log_prior", "ancestors", "temperatures",
                     "acceptance", "step_sizes", "lineages"):  # fmt: skip
            np.testing.assert_array_equal(getattr(other, name), getattr(one, name), name)
        np.testing.assert_array_equal(other.kernel.inverse_mass_matrix,
                                      one.kernel.inverse_mass_matrix)  # fmt: skip
        assert (other.log_evidence, other.log_evidence_se) == (
            one.log_evidence, one.log_evidence_se,
        )  # fmt: skip


def test_interrupted_and_resumed_is_the_uninterrupted_run(tmp_path, monkeypatch):
    from samplers.smc._history import History  # private: a stage interrupted at its bookkeeping

    smc = samplers.SMC(samplers.MALA(step_size=0.5), num_mutation_steps=1, waste_free=4)

    def run(**kwargs):
        return smc.run(log_prior, log_likelihood, start(64), key=jax.random.key(4), **kwargs)

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
    resumed = run(checkpoint_dir=tmp_path, resume=True)
    for name in ("particles", "log_likelihood", "ancestors", "temperatures", "lineages",
                 "step_sizes", "log_evidence_increments"):  # fmt: skip
        np.testing.assert_array_equal(getattr(resumed, name), getattr(full, name), name)
    assert (resumed.log_evidence, resumed.log_evidence_se) == (
        full.log_evidence, full.log_evidence_se,
    )  # fmt: skip
    # Another chain length is another configuration.
    other = samplers.SMC(samplers.MALA(step_size=0.5), num_mutation_steps=1, waste_free=8)
    with pytest.raises(samplers.CheckpointMismatchError):
        other.run(log_prior, log_likelihood, start(64), key=jax.random.key(4),
                  checkpoint_dir=tmp_path, resume=True)  # fmt: skip


@pytest.mark.parametrize(
    ("settings", "error", "found"),
    [
        (dict(waste_free=1), samplers.SamplerError, "waste_free must be None or an int >= 2"),
        (dict(waste_free=0), samplers.SamplerError, "got 0"),
        (dict(waste_free=2.5), samplers.SamplerTypeError, "got 2.5"),
        (dict(waste_free=True), samplers.SamplerTypeError, "got True"),
        (dict(waste_free=4, decorrelation=0.1), samplers.SamplerError,
         "waste_free=4 cannot be combined with decorrelation=0.1"),
    ],
)  # fmt: skip
def test_bad_waste_free_is_refused_when_built(settings, error, found):
    with counting() as compiles, pytest.raises(error) as info:
        samplers.SMC(samplers.MALA(step_size=0.5), **settings)
    message = str(info.value)
    assert message.startswith("SMC.waste_free") and found in message, message
    assert fix_line(message) and len(compiles) == 0


@pytest.mark.parametrize(
    ("n", "length", "found"),
    [
        (18, 4, "must divide the number of particles, 18"),
        (16, 8, "leaves 2 chains (= 16 particles / 8), which cannot be split evenly over the "
         "4 devices"),
    ],
)  # fmt: skip
def test_a_chain_length_that_does_not_fit_is_refused_before_anything_compiles(n, length, found):
    particles, key = jnp.zeros((n, 2)), jax.random.key(0)
    smc = samplers.SMC(samplers.MALA(step_size=0.5), waste_free=length)
    with counting() as compiles, pytest.raises(samplers.SamplerError) as info:
        smc.run(log_prior, log_likelihood, particles, key=key)
    message = str(info.value)
    assert message.startswith(f"SMC.run: SMC.waste_free={length}"), message
    assert found in message and fix_line(message), message
    assert len(compiles) == 0, compiles.names
