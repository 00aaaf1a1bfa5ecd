"""The convergence verdict: one rule (samplers/driver/_verdict.py) for Result, run and CLI."""

import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import samplers
from samplers.driver import _verdict  # private: the verdict rules, case by case

GOOD = dict(rhat=1.002, ess=5000.0, acceptance=0.7, divergent=0)


def fake_result(rhat=1.002, ess=5000.0, acceptance=0.7, divergent=0, nested=None,
                sampler=None):  # fmt: skip
    """A stand-in for a `Result`: only what the verdict reads, with 3 dimensions."""
    d = types.SimpleNamespace(
        rhat=jnp.array([1.0, rhat, 1.001]),
        nested_rhat=None if nested is None else jnp.array([1.0, nested, 1.0]),
        ess=jnp.array([9000.0, ess, 8000.0]),
    )
    return types.SimpleNamespace(
        diagnostics=d,
        acceptance_rate=jnp.full(8, acceptance),
        num_divergent=jnp.array([divergent] + [0] * 7),
        sampler=sampler or samplers.MALA(step_size=0.1),
    )


def failed(**changes):
    v = _verdict.verdict_of(fake_result(**{**GOOD, **changes}))
    return [r.criterion for r in v.reasons]


def test_the_good_synthetic_run_passes_every_criterion():
    v = _verdict.verdict_of(fake_result(**GOOD))
    assert v.converged and v.reasons == () and v.line.startswith("CONVERGED (max R-hat 1.0020")


@pytest.mark.parametrize(
    "change, criterion",
    [
        (dict(rhat=1.01), "rhat"),  # the threshold itself fails: R-hat < 1.01 is required
        (dict(rhat=float("nan")), "rhat"),
        (dict(rhat=float("inf")), "rhat"),
        (dict(ess=399.9), "ess"),
        (dict(ess=float("nan")), "ess"),
        (dict(divergent=1), "divergences"),
        (dict(acceptance=0.0499), "acceptance"),
        (dict(acceptance=0.9951), "acceptance"),
    ],
)
def test_each_criterion_fails_alone(change, criterion):
    assert failed(**change) == [criterion]


@pytest.mark.parametrize(
    "change", [dict(rhat=1.0099), dict(ess=400.0), dict(acceptance=0.05), dict(acceptance=0.995)]
)
def test_values_just_inside_the_thresholds_pass(change):
    assert failed(**change) == []


def test_nested_rhat_replaces_split_rhat_with_superchains():
    # Split R-hat of many short chains is inflated (1 + tau / n); nested R-hat is read.
    ok = _verdict.verdict_of(fake_result(**{**GOOD, "rhat": 1.05}, nested=1.004))
    assert ok.converged and "nested R-hat 1.0040" in ok.line
    bad = _verdict.verdict_of(fake_result(**{**GOOD, "rhat": 1.001}, nested=1.2))
    assert [r.criterion for r in bad.reasons] == ["rhat"] and "nested R-hat 1.2000" in bad.line


def test_unadjusted_kernels_are_not_judged_on_acceptance():
    mclmc = samplers.MCLMC(step_size=0.1, L=1.0)
    assert not samplers.MCLMC.adjusted and samplers.MALA.adjusted
    assert not samplers.SGLD.adjusted and not samplers.SGHMC.adjusted
    v = _verdict.verdict_of(fake_result(**{**GOOD, "acceptance": 1.0}, sampler=mclmc))
    assert v.converged and "acceptance" not in v.line
    # ... but its divergences still count
    v = _verdict.verdict_of(fake_result(**{**GOOD, "divergent": 3}, sampler=mclmc))
    assert [r.criterion for r in v.reasons] == ["divergences"]


def test_reasons_carry_value_and_fix():
    v = _verdict.verdict_of(fake_result(rhat=1.5, ess=30.0, acceptance=0.01, divergent=7))
    assert not v.converged
    assert [r.criterion for r in v.reasons] == ["rhat", "ess", "divergences", "acceptance"]
    assert v.line == (
        "NOT CONVERGED: max R-hat 1.5000 >= 1.01; min ESS 30 < 400; 7 divergent transitions; "
        "acceptance 0.010 < 0.05"
    )
    by = {r.criterion: r for r in v.reasons}
    assert by["rhat"].value == pytest.approx(1.5) and "warmup" in by["rhat"].fix
    assert "more sampling steps" in by["ess"].fix
    assert "smaller step" in by["divergences"].fix and "smaller step" in by["acceptance"].fix
    assert "larger step" in _verdict.verdict_of(fake_result(acceptance=0.999)).reasons[0].fix


def test_a_short_run_is_not_converged_says_why_and_warns():
    target = samplers.targets.IllConditionedGaussian(dim=3, condition_number=4.0)
    with pytest.warns(samplers.ConvergenceWarning, match="NOT CONVERGED: max R-hat"):
        result = samplers.run(
            samplers.RandomWalk(0.3), target, jnp.full((8, 3), 5.0), key=jax.random.key(0),
            num_steps=20, progress=False,
        )  # fmt: skip
    assert result.converged is False
    criteria = [r.criterion for r in result.verdict.reasons]
    assert "rhat" in criteria and "ess" in criteria
    text = result.summary(print_it=False).splitlines()
    assert text[0] == result.verdict.line and text[0].startswith("NOT CONVERGED")
    assert any("longer warmup" in line for line in text[1:4])


def test_the_warning_is_filterable():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=samplers.ConvergenceWarning)
        samplers.run(samplers.RandomWalk(0.3), lambda x: -0.5 * (x**2).sum(),
                     jnp.zeros((8, 2)), key=jax.random.key(0), num_steps=10,
                     progress=False)  # fmt: skip
    assert not [w for w in seen if issubclass(w.category, samplers.ConvergenceWarning)]
    assert issubclass(samplers.ConvergenceWarning, UserWarning)


def test_a_good_run_converges_and_does_not_warn():
    target = samplers.targets.IllConditionedGaussian(dim=2, condition_number=2.0)
    positions = jax.random.normal(jax.random.key(0), (64, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", samplers.ConvergenceWarning)
        result = samplers.run(
            samplers.MALA(step_size=1.0), target, positions, key=jax.random.key(1),
            num_steps=400, num_warmup=100, superchain_size=8, progress=False,
        )  # fmt: skip
    assert result.converged and result.verdict.reasons == ()
    assert result.summary(print_it=False).startswith("CONVERGED (max nested R-hat")
    assert np.isfinite(float(jnp.mean(result.acceptance_rate)))


def test_no_warning_when_traced():
    # Under jit the numbers are tracers: no verdict, no warning, no error.
    def final(key):
        return samplers.run(samplers.RandomWalk(0.3), lambda x: -0.5 * (x**2).sum(),
                            jnp.zeros((8, 2)), key=key, num_steps=5,
                            progress=False).state.position  # fmt: skip

    with warnings.catch_warnings():
        warnings.simplefilter("error", samplers.ConvergenceWarning)
        assert jax.jit(final)(jax.random.key(0)).shape == (8, 2)
