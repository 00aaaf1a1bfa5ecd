"""What `samplers.run` fills in when the user leaves it out: step sizes an adaptation
tunes (`samplers.NUTS()`), starting points drawn from the target (`positions=None` with
`num_chains`), and the kernel an adaptation builds (`run(logdensity=..., adaptation=...)`).
Left out where nothing can fill it in, each is the library's error naming the argument,
with a `fix:` line, before anything compiles."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import samplers
from tests.compile_counter import counting

TARGET = samplers.targets.IllConditionedGaussian(dim=3, condition_number=4.0)
KEY = jax.random.key(3)
QUIET = dict(progress=False)


HMC_UNSET = functools.partial(samplers.HMC, step_size=None, num_integration_steps=4)


@pytest.mark.parametrize(
    "kernel",
    [samplers.NUTS, samplers.MALA, samplers.RandomWalk, HMC_UNSET],
    ids=["NUTS", "MALA", "RandomWalk", "HMC"],
)
def test_an_adaptation_tunes_an_unset_step_size(kernel):
    assert kernel().unset_hyperparameters() == ("step_size",)
    result = samplers.run(kernel(), TARGET, jnp.zeros((16, 3)), key=KEY, num_steps=20,
                          adaptation=samplers.WindowAdaptation(num_steps=150), **QUIET)  # fmt: skip
    tuned = np.asarray(result.sampler.step_size)
    assert np.isfinite(tuned).all() and (tuned != 1.0).all()  # moved from 1.0 by the adaptation
    # The same as starting from 1.0 by hand: the documented start.
    by_hand = samplers.run(kernel(step_size=1.0), TARGET, jnp.zeros((16, 3)), key=KEY,
                           num_steps=20, adaptation=samplers.WindowAdaptation(num_steps=150),
                           **QUIET)  # fmt: skip
    np.testing.assert_array_equal(by_hand.sampler.step_size, tuned)


@pytest.mark.parametrize("kernel", [samplers.NUTS, HMC_UNSET], ids=["NUTS", "HMC"])
def test_an_unset_step_size_without_adaptation_is_refused_before_compiling(kernel):
    positions = jnp.zeros((8, 3))  # built outside the count: creating it may compile
    name = type(kernel()).__name__
    with counting() as compiles, pytest.raises(samplers.SamplerError) as err:
        samplers.run(kernel(), TARGET, positions, key=KEY, num_steps=10, **QUIET)
    assert compiles.names == []
    message = str(err.value)
    assert f"{name}.step_size is not set" in message
    assert f"fix: samplers.{name}(step_size=" in message
    assert "adaptation=samplers.WindowAdaptation()" in message


def test_a_kernel_stepped_by_hand_with_an_unset_step_size_says_so():
    kernel = samplers.MALA()
    state = kernel.init(TARGET, jnp.zeros(3), KEY)
    with pytest.raises(samplers.SamplerError, match="fix: set it"):
        kernel.step(TARGET, state, KEY)


def test_positions_drawn_from_a_standard_target():
    """positions=None: `num_chains` draws of the target's `initial_position`, from a stream
    of the run's key of its own; the same run as passing those draws."""
    drawn = samplers.run(samplers.MALA(0.5), TARGET, key=KEY, num_steps=30, num_chains=12,
                         **QUIET)  # fmt: skip
    keys = jax.random.split(jax.random.fold_in(KEY, 0x5EED), 12)
    given = jax.vmap(TARGET.initial_position)(keys)
    assert float(given.std()) > 0.5  # overdispersed draws, not zeros
    explicit = samplers.run(samplers.MALA(0.5), TARGET, given, key=KEY, num_steps=30, **QUIET)
    np.testing.assert_array_equal(drawn.state.position, explicit.state.position)


def test_an_adaptation_that_builds_its_kernel_needs_no_sampler():
    result = samplers.run(logdensity=TARGET, key=KEY, num_steps=20, num_chains=16,
                          adaptation=samplers.LAPS(num_steps1=40, num_adaptation_steps=10),
                          **QUIET)  # fmt: skip
    assert isinstance(result.sampler, samplers.AdjustedMCLMC)
    assert result.state.position.shape == (16, 3)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(sampler=samplers.MALA(0.5)), samplers.SamplerTypeError,
         ["needs a log density", "fix: samplers.run(sampler, logdensity, positions"]),
        (dict(sampler=samplers.MALA(0.5), logdensity=TARGET), samplers.SamplerTypeError,
         ["positions=None needs num_chains", "fix: samplers.run(sampler, target, num_chains="]),
        (dict(sampler=samplers.MALA(0.5), logdensity=lambda x: -(x**2).sum(), num_chains=8),
         samplers.SamplerError, ["cannot draw starting points", "fix: pass positions"]),
        (dict(sampler=samplers.MALA(0.5), logdensity=TARGET, positions=jnp.zeros((8, 3)),
              num_chains=4), samplers.SamplerError, ["num_chains=4", "[8] chains", "fix:"]),
        (dict(sampler=samplers.MALA(0.5), logdensity=TARGET, num_chains=0),
         samplers.SamplerError, ["num_chains must be an int >= 1"]),
        (dict(sampler=samplers.MALA(0.5), logdensity=TARGET, num_chains=2.5),
         samplers.SamplerTypeError, ["num_chains must be an int >= 1"]),
        (dict(logdensity=TARGET, positions=jnp.zeros((8, 3))), samplers.SamplerTypeError,
         ["sampler must be a samplers.Sampler", "adaptation=samplers.LAPS()"]),
    ],
    ids=["no logdensity", "no num_chains", "a function cannot draw", "num_chains mismatch",
         "zero chains", "float chains", "no sampler, no adaptation"],
)  # fmt: skip
def test_what_cannot_be_filled_in_is_a_clear_error(kwargs, error, words):
    with counting() as compiles, pytest.raises(error) as err:
        samplers.run(**kwargs, key=KEY, num_steps=10, **QUIET)
    assert len(compiles) == 0
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_positions_drawn_from_a_numpyro_model():
    """A NumPyro model's target draws its own starting points (`initial_positions`:
    NumPyro's uniform in (-2, 2) on the unconstrained scale), one dict entry per site."""
    numpyro = pytest.importorskip("numpyro")
    dist = pytest.importorskip("numpyro.distributions")

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
        numpyro.sample("obs", dist.Normal(mu, sigma), obs=y)

    target = samplers.targets.from_numpyro(model, jnp.array([0.5, 1.5, 1.0]))
    drawn = samplers.run(samplers.MALA(0.3), target, key=KEY, num_steps=20, num_chains=8,
                         **QUIET)  # fmt: skip
    given = target.initial_positions(jax.random.fold_in(KEY, 0x5EED), 8)
    explicit = samplers.run(samplers.MALA(0.3), target, given, key=KEY, num_steps=20, **QUIET)
    assert set(drawn.state.position) == {"mu", "sigma"}
    for site in ("mu", "sigma"):
        np.testing.assert_array_equal(drawn.state.position[site], explicit.state.position[site])
