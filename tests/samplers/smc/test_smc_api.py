"""samplers.SMC's interface: meshes, pytree particles, any kernel, schedules, the result's
summary and verdict."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import samplers

N = 256  # the verdict asks for a last-stage ESS of 100: N / 2 at the default target


def log_prior(p):  # a: N(0, I_2), b: N(0, 2^2), normalised
    return (-0.5 * jnp.sum(p["a"] ** 2) - 0.5 * p["b"] ** 2 / 4.0
            - 1.5 * jnp.log(2 * jnp.pi) - jnp.log(2.0))  # fmt: skip


def log_likelihood(p):  # one observation of each coordinate at 1, unit noise
    return -0.5 * (jnp.sum((p["a"] - 1.0) ** 2) + (p["b"] - 1.0) ** 2) - 1.5 * jnp.log(2 * jnp.pi)


def start(key=0):
    x = jax.random.normal(jax.random.key(key), (N, 3))
    return {"a": x[:, :2], "b": 2.0 * x[:, 2]}


# Posterior means: a = 1/2 (prior var 1), b = 4/5 (prior var 4); log Z in closed form.
MEAN_A, MEAN_B = 0.5, 0.8
LOG_Z = float(2 * (-0.5 / 2.0 - 0.5 * np.log(2 * np.pi * 2.0)) - 0.5 / 5.0
              - 0.5 * np.log(2 * np.pi * 5.0))  # fmt: skip


def test_pytree_particles_on_auto_and_explicit_meshes(mesh):
    smc = samplers.SMC(samplers.MALA(step_size=0.5), num_mutation_steps=3)
    result = smc.run(log_prior, log_likelihood, start(), key=jax.random.key(1), mesh=mesh)
    assert result.particles["a"].shape == (N, 2) and result.particles["b"].shape == (N,)
    assert result.names == ("a[0]", "a[1]", "b")
    assert result.temperatures[0] == 0.0 and result.temperatures[-1] == 1.0
    assert np.all(np.diff(result.temperatures) > 0)
    assert len(result.ess) == len(result.acceptance) == result.num_stages
    np.testing.assert_allclose(result.ess[:-1], 0.5 * N, rtol=0.01)  # the bisection's target
    assert result.ess[-1] >= 0.49 * N  # the last step, to 1, may keep more
    assert abs(result.log_evidence - LOG_Z) < 4 * result.log_evidence_se
    assert abs(float(result.particles["b"].mean()) - MEAN_B) < 0.3
    np.testing.assert_allclose(np.exp(np.asarray(result.log_weights)), 1.0 / N, rtol=1e-5)
    # For ArviZ: one chain of N draws per leaf, the evidence in the attributes.
    data = result.to_arviz()
    assert data["posterior"]["a"].shape == (1, N, 2) and data["posterior"]["b"].shape == (1, N)
    assert data["posterior"].attrs["log_evidence"] == result.log_evidence
    np.testing.assert_array_equal(data["sample_stats"]["log_likelihood"][0],
                                  result.log_likelihood)  # fmt: skip
    # What the particles' log densities are.
    np.testing.assert_allclose(result.log_likelihood, jax.vmap(log_likelihood)(result.particles),
                               rtol=1e-5)  # fmt: skip


class Independent(samplers.Sampler):
    """A user's kernel without a step size: an independence sampler from N(0, 2^2 I)."""

    def init(self, logdensity, position, key):
        return samplers.State(position, logdensity(position), jnp.int32(0))

    def step(self, logdensity, state, key):
        k1, k2 = jax.random.split(key)
        x = 2.0 * jax.random.normal(k1, state.position.shape)
        logq = lambda y: -0.125 * jnp.sum(y**2)  # noqa: E731
        new = logdensity(x)
        log_ratio = new - state.logdensity + logq(state.position) - logq(x)
        accept = jnp.log(jax.random.uniform(k2)) < log_ratio
        out = samplers.State(jnp.where(accept, x, state.position),
                             jnp.where(accept, new, state.logdensity), state.count + 1)  # fmt: skip
        info = samplers.unadjusted_info(num_grads=0)
        return out, eqx.tree_at(lambda i: i.acceptance_rate, info,
                                jnp.minimum(1.0, jnp.exp(log_ratio)))  # fmt: skip


@pytest.mark.parametrize(
    "kernel",
    [
        samplers.RandomWalk(0.5),
        samplers.NUTS(step_size=0.5),
        samplers.MCLMC(step_size=0.5, L=1.0),
        Independent(),
    ],
    ids=["RandomWalk", "NUTS", "MCLMC", "user kernel"],
)
def test_any_kernel_mutates(kernel):
    smc = samplers.SMC(kernel, num_mutation_steps=3)
    result = smc.run(log_prior, log_likelihood, start(), key=jax.random.key(2))
    assert result.temperatures[-1] == 1.0
    assert abs(float(result.particles["b"].mean()) - MEAN_B) < 0.35
    np.testing.assert_array_less(np.abs(np.asarray(result.particles["a"].mean(0)) - MEAN_A), 0.25)
    tuned = result.kernel
    fields = {f.name for f in dataclasses.fields(tuned)}
    if "inverse_mass_matrix" in fields:  # the particles' variances (posterior: 1/2, 4/5)
        np.testing.assert_allclose(tuned.inverse_mass_matrix, [0.5, 0.5, 0.8], rtol=0.5)
    if isinstance(kernel, samplers.RandomWalk):  # a per-coordinate scale
        assert np.shape(tuned.step_size) == (3,)
    if isinstance(kernel, samplers.MCLMC):  # unadjusted: its step size is kept
        assert float(tuned.step_size) == 0.5 and not result.adjusted


def test_dense_metric_fixed_schedule_and_resampling_schemes():
    kernel = samplers.HMC(step_size=0.4, num_integration_steps=3)
    smc = samplers.SMC(kernel, num_mutation_steps=2, metric="dense",
                       schedule=np.array([0.1, 0.4, 1.0]), resampling="residual")  # fmt: skip
    result = smc.run(log_prior, log_likelihood, start(), key=jax.random.key(3))
    np.testing.assert_array_equal(result.temperatures, [0.0, 0.1, 0.4, 1.0])
    imm = np.asarray(result.kernel.inverse_mass_matrix)
    assert imm.shape == (3, 3) and np.allclose(imm, imm.T)
    assert abs(result.log_evidence - LOG_Z) < 4 * result.log_evidence_se


def test_verdict_and_summary(capsys):
    # A collapsed stage: the whole way in one step is too far for 10 informative points.
    def sharp(p):
        return 10.0 * log_likelihood(p)

    smc = samplers.SMC(samplers.MALA(step_size=0.5), num_mutation_steps=2, schedule=[1.0])
    result = smc.run(log_prior, sharp, start(), key=jax.random.key(4))
    verdict = result.verdict
    assert not verdict.converged and "collapse" in [r.criterion for r in verdict.reasons]
    text = result.summary(print_it=False)
    assert text.splitlines()[0].startswith(f"SMC: {N} particles, 1 stages to temperature 1")
    assert "log Z = " in text and "NOT CONVERGED: stage 1 collapsed" in text
    assert any(line.startswith("  - stage 1 collapsed") for line in text.splitlines())
    # A schedule that runs out of stages: stalled before temperature 1.
    stalled = samplers.SMC(samplers.MALA(step_size=0.5), num_mutation_steps=2, max_stages=2)
    result = stalled.run(log_prior, sharp, start(), key=jax.random.key(4))
    assert result.num_stages == 2 and result.temperatures[-1] < 1.0
    assert [r.criterion for r in result.verdict.reasons] == ["schedule"]
    assert "the schedule stalled at temperature" in result.verdict.line
    # A healthy run passes, and its rows name the coordinates.
    good = samplers.SMC(samplers.MALA(step_size=0.5), num_mutation_steps=3)
    capsys.readouterr()
    result = good.run(log_prior, log_likelihood, start(), key=jax.random.key(5), progress=True)
    shown = capsys.readouterr().err  # the bar over the temperature, to 100%
    assert "SMC temperature: 100%" in shown and f"stage={result.num_stages}" in shown
    assert result.verdict.converged, result.verdict
    rows = [line.split()[0] for line in result.summary(print_it=False).splitlines()[4:7]]
    assert rows == ["a[0]", "a[1]", "b"]
    # Moves that never accept leave copies: the particles are not distinct.
    frozen = samplers.SMC(samplers.RandomWalk(1e3), num_mutation_steps=1, metric=None,
                          target_acceptance=0.01)  # fmt: skip
    result = frozen.run(log_prior, sharp, start(), key=jax.random.key(6))
    assert "distinct" in [r.criterion for r in result.verdict.reasons], result.verdict


def test_step_size_is_tuned_towards_the_target_acceptance():
    # Far too long a first step (acceptance near 0): one update per stage brings it down.
    smc = samplers.SMC(samplers.MALA(step_size=5.0), num_mutation_steps=3, target_ess=0.8)
    result = smc.run(log_prior, lambda p: 4.0 * log_likelihood(p), start(),
                     key=jax.random.key(7))  # fmt: skip
    target = samplers.MALA.default_target_acceptance
    assert result.acceptance[0] < 0.2 and result.num_stages >= 6
    assert np.all(np.diff(result.step_sizes[:3]) < 0)  # shrinking while it rejects
    assert abs(np.mean(result.acceptance[-3:]) - target) < 0.2, result.acceptance


def test_moves_until_the_particles_decorrelate():
    smc = samplers.SMC(samplers.RandomWalk(0.5), num_mutation_steps=2, decorrelation=0.2,
                       max_mutation_steps=40)  # fmt: skip
    result = smc.run(log_prior, log_likelihood, start(), key=jax.random.key(8))
    steps, corr = result.mutation_steps, result.correlations
    assert np.all(steps % 2 == 0) and np.all(steps <= 40) and np.max(steps) > 2, steps
    assert np.all((corr <= 0.2) | (steps == 40)), (corr, steps)
    assert result.verdict.converged, result.verdict
    assert f"RandomWalk x {steps.min()}-{steps.max()} steps" in result.summary(print_it=False)
    # Moves that never accept cannot decorrelate: the verdict says so.
    stuck = samplers.SMC(samplers.RandomWalk(1e4), num_mutation_steps=2, decorrelation=0.2,
                         max_mutation_steps=4, metric=None)  # fmt: skip
    result = stuck.run(log_prior, log_likelihood, start(), key=jax.random.key(8))
    assert np.all(result.mutation_steps == 4) and np.all(result.correlations == 1.0)
    assert "decorrelation" in [r.criterion for r in result.verdict.reasons]
    # Without decorrelation, one round per stage, nothing measured.
    fixed = samplers.SMC(samplers.RandomWalk(0.5), num_mutation_steps=2)
    result = fixed.run(log_prior, log_likelihood, start(), key=jax.random.key(8))
    assert np.all(result.mutation_steps == 2) and np.all(np.isnan(result.correlations))
