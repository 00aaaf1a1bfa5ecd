"""Superchains chosen automatically for many short chains (the verdict then reads nested
R-hat), an explicit `superchain_size` winning over the rule, and the divergence rate."""

import re
import warnings

import jax
import jax.numpy as jnp
import pytest

import samplers
from samplers.driver import _verdict  # private: the documented rule, checked directly
from samplers.driver._verdict import automatic_superchain_size  # private: the same rule

GAUSSIAN = samplers.targets.IllConditionedGaussian(dim=4, condition_number=4.0)


def run(logdensity, positions, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", samplers.ConvergenceWarning)
        return samplers.run(
            samplers.MALA(step_size=0.8), logdensity, positions, key=jax.random.key(1),
            num_warmup=50, progress=False, **options,
        )  # fmt: skip


@pytest.fixture(scope="module")
def well_mixed():
    """128 starts drawn from the target: run for 300 steps, the chains are stationary but
    too short for split R-hat (its excess tau / n is ~0.1 on the slowest coordinate)."""
    return jax.vmap(GAUSSIAN.initial_position)(jax.random.split(jax.random.key(0), 128))


@pytest.mark.parametrize(
    "num_chains, num_steps, expected",
    [
        (128, 300, 8),  # 16 superchains of 8
        (64, 300, 4),  # 16 of 4: the fewest chains the rule reads with superchains
        (4096, 999, 8),  # more chains make more superchains, not larger ones
        (100, 300, 5),  # the largest of 8..4 that leaves at least 16 superchains
        (96, 300, 6),
        (67, 300, None),  # a prime count: no even superchains, split R-hat
        (63, 300, None),  # too few chains for 16 superchains of 4
        (32, 300, None),
        (8, 300, None),  # few chains
        (128, 1000, None),  # long chains: split R-hat is passable and the standard
        (8, 5000, None),  # few long chains
    ],
)
def test_the_rule_picks_superchains_for_many_short_chains_only(num_chains, num_steps, expected):
    assert automatic_superchain_size(num_chains, num_steps) == expected
    if expected is not None:
        assert num_chains % expected == 0 and num_chains // expected >= 16


def test_many_short_chains_split_rhat_fails_nested_rhat_converges(well_mixed):
    result = run(GAUSSIAN, well_mixed, num_steps=300)
    d = result.diagnostics
    assert result.superchain_size == 8 and result.superchain_auto
    # The regime the rule is for: split R-hat above the threshold, nested R-hat below it.
    assert float(jnp.max(d.rhat)) > 1.05 and float(jnp.max(d.nested_rhat)) < 1.01
    assert result.converged and result.verdict.line.startswith("CONVERGED (max nested R-hat")
    text = result.summary(print_it=False)
    assert "verdict read: nested R-hat, 16 superchains of 8 chains (automatic)" in text
    # Without superchains (superchain_size=0) the same draws fail on split R-hat.
    split = run(GAUSSIAN, well_mixed, num_steps=300, superchain_size=0)
    assert split.superchain_size is None and not split.superchain_auto
    assert split.diagnostics.nested_rhat is None
    assert [r.criterion for r in split.verdict.reasons] == ["rhat"]
    assert split.verdict.line.startswith("NOT CONVERGED: max R-hat")
    assert "verdict read: split R-hat" in split.summary(print_it=False)
    assert jnp.array_equal(split.state.position, result.state.position)  # same run


def test_an_explicit_superchain_size_wins(well_mixed):
    result = run(GAUSSIAN, well_mixed, num_steps=300, superchain_size=32)
    assert result.superchain_size == 32 and not result.superchain_auto
    assert "verdict read: nested R-hat, 4 superchains of 32 chains (superchain_size=32)" in (
        result.summary(print_it=False)
    )
    assert result.verdict.line.startswith(("CONVERGED (max nested", "NOT CONVERGED: max nested"))


def test_few_chains_keep_split_rhat():
    result = run(GAUSSIAN, jnp.zeros((8, 4)), num_steps=50)
    assert result.superchain_size is None and not result.superchain_auto
    assert result.diagnostics.nested_rhat is None
    assert "verdict read: split R-hat" in result.summary(print_it=False)


def bimodal(x):
    """Modes at x[0] = +-4 (a barrier of exp(-8) between them), x[1] standard normal."""
    return jnp.logaddexp(-0.5 * (x[0] - 4) ** 2, -0.5 * (x[0] + 4) ** 2) - 0.5 * x[1] ** 2


def test_chains_stuck_in_two_modes_are_not_converged_under_nested_rhat():
    # Each chain falls into the mode nearest its start and stays: superchains of 8 hold
    # different shares of the two modes, so their means differ (nested R-hat ~1.04-1.08).
    positions = 3.0 * jax.random.normal(jax.random.key(0), (128, 2))
    result = run(bimodal, positions, num_steps=300)
    assert result.superchain_auto and result.superchain_size == 8
    assert not result.converged
    rhat = result.verdict.reasons[0]
    assert rhat.criterion == "rhat" and rhat.problem.startswith("max nested R-hat")
    assert rhat.value > 1.02


def test_the_divergence_rate_is_in_the_verdict_and_the_summary():
    # A step beyond the leapfrog's stability limit (2 sd of the narrowest coordinate):
    # about half of the transitions diverge.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", samplers.ConvergenceWarning)
        result = samplers.run(
            samplers.HMC(step_size=2.2, num_integration_steps=4), GAUSSIAN,
            jnp.full((8, 4), 3.0), key=jax.random.key(0), num_steps=20, num_warmup=5,
            progress=False,
        )  # fmt: skip
    count = int(jnp.sum(result.num_divergent))
    assert 0 < count < 160
    # Over the sampling transitions (8 chains x 20), as NumPyro and Stan report them.
    rate = _verdict.divergence_rate(count, 8 * 20)
    assert f"{count} divergent transitions ({rate})" in result.verdict.line
    summary = result.summary(print_it=False)
    assert re.search(rf"divergent transitions {count} \(\d[\d.]*% of 160\)", summary)
    assert f"divergent transitions {count} ({rate})" in summary
