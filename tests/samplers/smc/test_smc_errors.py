"""Bad input to samplers.SMC: the library's own errors, naming the argument, with a fix,
before anything compiles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import samplers
from samplers.smc import _smc  # private: its stage program spied on, to prove none ran
from tests.compile_counter import counting

KEY = jax.random.key(0)
PARTICLES = jnp.zeros((16, 2))
SMC = samplers.SMC(samplers.MALA(step_size=0.5), num_mutation_steps=2)


def log_prior(x):
    return -0.5 * jnp.sum(x**2)


def log_likelihood(x):
    return -0.5 * jnp.sum((x - 1.0) ** 2)


def fix_line(message):
    return any(line.startswith("  fix: ") for line in message.splitlines())


@pytest.mark.parametrize(
    ("settings", "error", "names"),
    [
        (dict(kernel="mala"), samplers.SamplerTypeError, "SMC.kernel"),
        (dict(num_mutation_steps=0), samplers.SamplerError, "SMC.num_mutation_steps"),
        (dict(num_mutation_steps=2.5), samplers.SamplerTypeError, "SMC.num_mutation_steps"),
        (dict(target_ess=1.0), samplers.SamplerError, "SMC.target_ess"),
        (dict(schedule=[0.5, 0.2, 1.0]), samplers.SamplerError, "SMC.schedule"),
        (dict(schedule=[0.1, 0.5]), samplers.SamplerError, "SMC.schedule"),
        (dict(schedule="linear"), samplers.SamplerTypeError, "SMC.schedule"),
        (dict(resampling="bogus"), samplers.SamplerError, "SMC.resampling"),
        (dict(metric="full"), samplers.SamplerError, "SMC.metric"),
        (dict(target_acceptance=1.5), samplers.SamplerError, "SMC.target_acceptance"),
        (dict(max_stages=0), samplers.SamplerError, "SMC.max_stages"),
        (dict(decorrelation=1.0), samplers.SamplerError, "SMC.decorrelation"),
        (
            dict(num_mutation_steps=8, max_mutation_steps=4),
            samplers.SamplerError,
            "SMC.max_mutation_steps",
        ),
    ],
)
def test_bad_hyperparameters_are_refused_when_built(settings, error, names):
    kwargs = dict(kernel=samplers.MALA(step_size=0.5)) | settings
    with counting() as compiles, pytest.raises(error) as info:
        samplers.SMC(**kwargs)
    message = str(info.value)
    assert message.startswith(names) and fix_line(message), message
    assert len(compiles) == 0


def _vector(x):
    return -0.5 * x**2


@pytest.mark.parametrize(
    ("args", "error", "starts"),
    [
        ((log_prior, "likelihood", PARTICLES), samplers.SamplerTypeError,
         "SMC.run: log_likelihood must be a callable"),
        ((log_prior, _vector, PARTICLES), samplers.SamplerError,
         "SMC.run: log_likelihood must return a real floating scalar"),
        ((_vector, log_likelihood, PARTICLES), samplers.SamplerError,
         "SMC.run: log_prior must return a real floating scalar"),
        ((log_prior, log_likelihood, jnp.zeros((16, 2), jnp.int32)), samplers.SamplerTypeError,
         "particles leaf 'x' has dtype int32"),
        ((log_prior, log_likelihood, jnp.zeros((1, 2))), samplers.SamplerError,
         "SMC.run: particles has 1 particle(s)"),
        ((log_prior, log_likelihood, {"a": jnp.zeros((16, 2)), "b": jnp.zeros(8)}),
         samplers.SamplerError, "particles leaves disagree"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_before_anything_compiles(args, error, starts):
    with counting() as compiles, pytest.raises(error) as info:
        SMC.run(*args, key=KEY)
    message = str(info.value)
    assert message.startswith(starts) and fix_line(message), message
    assert len(compiles) == 0, compiles.names


def test_a_bad_key_and_a_kernel_of_the_wrong_dimension():
    wide = samplers.SMC(samplers.HMC(0.1, 3, inverse_mass_matrix=np.ones(5)), metric=None)
    with counting() as compiles:
        with pytest.raises(samplers.SamplerTypeError, match="key must be one PRNG key"):
            SMC.run(log_prior, log_likelihood, PARTICLES, key=0)
        with pytest.raises(samplers.SamplerError, match="HMC.inverse_mass_matrix has shape"):
            wide.run(log_prior, log_likelihood, PARTICLES, key=KEY)
        with pytest.raises(samplers.SamplerTypeError, match="progress must be") as info:
            SMC.run(log_prior, log_likelihood, PARTICLES, key=KEY, progress="yes")
        dense = samplers.SMC(samplers.MCLMC(step_size=0.5, L=1.0), metric="dense")
        with pytest.raises(samplers.SamplerError, match="takes a vector") as info:
            dense.run(log_prior, log_likelihood, PARTICLES, key=KEY)
        assert fix_line(str(info.value))
    assert len(compiles) == 0, compiles.names


@pytest.fixture
def stages(monkeypatch):
    """The stage programs' traces (none: no stage was compiled or run)."""
    traced = []

    class Spy(_smc.Resample):
        def __call__(self, *args):
            traced.append(args)
            return super().__call__(*args)

    monkeypatch.setattr(_smc, "Resample", Spy)
    return traced


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_log_likelihood_at_a_particle_is_an_error(bad, stages):
    def broken(x):  # NaN (or +inf) at the particles with x[0] > 1
        return jnp.where(x[0] > 1.0, bad, log_likelihood(x))

    particles = jnp.zeros((16, 2)).at[5, 0].set(2.0)
    with pytest.raises(samplers.SamplerError) as info:
        SMC.run(log_prior, broken, particles, key=KEY)
    message = str(info.value)
    assert "log_likelihood is" in message and "at particle 5" in message, message
    assert fix_line(message) and not stages


def test_particles_outside_the_prior_are_an_error(stages):
    def bounded(x):  # uniform on the unit square
        return jnp.where(jnp.all((x >= 0) & (x <= 1)), 0.0, -jnp.inf)

    particles = jnp.full((16, 2), 0.5).at[3].set(-1.0)
    with pytest.raises(samplers.SamplerError, match="log_prior is -inf at particle 3") as info:
        SMC.run(bounded, log_likelihood, particles, key=KEY)
    assert fix_line(str(info.value)) and not stages


def test_every_weight_zero_is_an_error_before_the_stage_runs(stages):
    def impossible(x):
        return jnp.full((), -jnp.inf) + 0.0 * x[0]

    with pytest.raises(samplers.SamplerError, match="every particle's weight is zero") as info:
        SMC.run(log_prior, impossible, PARTICLES, key=KEY)
    assert fix_line(str(info.value)) and not stages


def test_errors_leave_the_inputs_unchanged():
    particles = {"a": np.zeros((16, 2), np.float32)}
    before = particles["a"].copy()
    with pytest.raises(samplers.SamplerError):
        SMC.run(lambda p: -jnp.sum(p["a"] ** 2), lambda p: p["a"], particles, key=KEY)
    np.testing.assert_array_equal(particles["a"], before)


def test_under_jit_is_a_type_error():
    @jax.jit
    def inside(particles):
        return SMC.run(log_prior, log_likelihood, particles, key=KEY).log_likelihood

    with pytest.raises(samplers.SamplerTypeError, match="outside jax.jit") as info:
        inside(PARTICLES)
    assert fix_line(str(info.value))
