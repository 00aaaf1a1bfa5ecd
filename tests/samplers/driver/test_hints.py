"""The verdict's fixes fit what ran: after an adaptation they never suggest one; the
library's name `samplers.run`'s arguments, the command line's its flags; the CLI's legend
is printed only with --explain."""

import types
import warnings

import jax
import jax.numpy as jnp
import pytest

import samplers
import samplers.cli
from samplers.cli import _main, _report  # private: the parser's help text and the legend
from samplers.driver import _verdict  # private: the hint rules, case by case

# Every criterion fails: R-hat, ESS, divergences, low acceptance (and high, below).
BAD = dict(rhat=[1.5], ess=[30.0], acceptance=0.01, num_divergent=7)
SUGGESTS_AN_ADAPTATION = ("or an adaptation", "an adaptation, which tunes it",
                          "adaptation=samplers", "--adaptation default")  # fmt: skip


def fixes(adapted, hints, **changes):
    v = _verdict.judge(**{**BAD, **changes}, adapted=adapted, hints=hints)
    assert not v.converged
    return {r.criterion: r.fix for r in v.reasons}


def every_fix(adapted, hints):
    """The fix of every criterion, both acceptance failures included."""
    low = fixes(adapted, hints)
    high = fixes(adapted, hints, acceptance=0.999)["acceptance"]
    assert set(low) == {"rhat", "ess", "divergences", "acceptance"}
    return [*low.values(), high]


@pytest.mark.parametrize("hints", ["library", "cli"])
def test_after_an_adaptation_no_fix_suggests_an_adaptation(hints):
    for fix in every_fix(True, hints):
        assert not any(s in fix for s in SUGGESTS_AN_ADAPTATION), fix
        assert "longer warmup or an adaptation" not in fix


@pytest.mark.parametrize("hints", ["library", "cli"])
def test_without_an_adaptation_the_fixes_suggest_one(hints):
    tune = "adaptation=samplers.WindowAdaptation()" if hints == "library" else "--adaptation"
    by = fixes(False, hints)
    assert tune in by["rhat"] and tune in by["divergences"] and tune in by["acceptance"]
    assert "warmup" in by["rhat"]


def test_library_fixes_name_the_arguments():
    by = fixes(False, "library")
    assert "longer warmup (num_warmup=)" in by["rhat"]
    assert "superchain_size=" in by["rhat"]  # split R-hat: superchains may help
    assert "superchain_size=" not in fixes(False, "library", nested=True)["rhat"]
    assert "more sampling steps (num_steps=)" in by["ess"]
    assert "smaller step size (the sampler's step_size=)" in by["divergences"]
    assert (
        "larger step size (step_size=)" in fixes(False, "library", acceptance=0.999)["acceptance"]
    )
    tuned = fixes(True, "library")
    assert "num_steps=" in tuned["rhat"] and "num_warmup=" in tuned["rhat"]
    assert "target_acceptance=" in tuned["divergences"]
    assert "target_acceptance=" in fixes(True, "library", acceptance=0.999)["acceptance"]
    for fix in every_fix(True, "library") + every_fix(False, "library"):
        assert "--" not in fix, fix  # no command-line flag in the library's fixes


def test_cli_fixes_name_the_flags():
    by = fixes(False, "cli")
    assert "--warmup" in by["rhat"] and "--adaptation default" in by["rhat"]
    assert "--steps" in by["ess"] and "--chains" in by["ess"]
    tuned = fixes(True, "cli")
    assert "--warmup" in tuned["rhat"] and "--steps" in tuned["rhat"]
    assert "--warmup" in tuned["divergences"] and "--metric" in tuned["divergences"]
    assert "--warmup" in fixes(True, "cli", acceptance=0.999)["acceptance"]
    for fix in every_fix(True, "cli") + every_fix(False, "cli"):
        assert "=" not in fix, fix  # no keyword argument of samplers.run


def test_unknown_hints_are_an_error():
    with pytest.raises(samplers.SamplerError, match='hints must be "library" or "cli"'):
        _verdict.judge(**BAD, hints="gui")


def test_verdict_of_reads_whether_an_adaptation_ran():
    d = types.SimpleNamespace(rhat=jnp.array([1.5]), nested_rhat=None, ess=jnp.array([30.0]))

    def result(**fields):
        return types.SimpleNamespace(diagnostics=d, acceptance_rate=jnp.full(8, 0.7),
                                     num_divergent=jnp.zeros(8, int),
                                     sampler=samplers.MALA(0.1), **fields)  # fmt: skip

    def rhat_fix(r, hints="library"):
        return _verdict.verdict_of(r, hints).reasons[0].fix

    assert "adaptation=samplers" in rhat_fix(result())  # says nothing: no adaptation
    assert "adaptation=samplers" in rhat_fix(result(adaptation_info=None))
    assert "adaptation=samplers" not in rhat_fix(result(adaptation_info=object()))
    assert "adaptation=samplers" not in rhat_fix(result(adapted=True, adaptation_info=None))
    assert "adaptation=samplers" in rhat_fix(result(adapted=False, adaptation_info=object()))
    assert "--warmup" in rhat_fix(result(adapted=True), "cli")


def short_run(**kwargs):
    target = samplers.targets.IllConditionedGaussian(dim=3, condition_number=4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", samplers.ConvergenceWarning)
        return samplers.run(samplers.MALA(0.5), target, jnp.full((8, 3), 3.0),
                            key=jax.random.key(0), num_steps=10, progress=False,
                            **kwargs)  # fmt: skip


def test_a_tuned_run_does_not_suggest_an_adaptation():
    result = short_run(adaptation=samplers.WindowAdaptation(num_steps=20))
    assert result.adapted is True and not result.converged
    assert "rhat" in [r.criterion for r in result.verdict.reasons]
    text = result.summary(print_it=False)
    fixes_shown = [line for line in text.splitlines() if line.startswith("  - ")]
    assert fixes_shown and not any(s in text for s in SUGGESTS_AN_ADAPTATION), fixes_shown
    assert "a longer adaptation (its num_steps=" in text
    cli = result.summary(print_it=False, hints="cli")
    assert "more tuning steps (--warmup)" in cli and "num_steps=" not in cli
    untuned = short_run(num_warmup=5)
    assert untuned.adapted is False
    assert "longer warmup (num_warmup=) or an adaptation (adaptation=samplers.Window" in (
        untuned.summary(print_it=False)
    )


TINY = ["run", "--target", "gaussian", "--dim", "3", "--chains", "8", "--steps", "10",
        "--warmup", "0", "--devices", "4", "--no-progress", "--no-cache", "--sampler", "mala",
        "--adaptation", "none"]  # fmt: skip


def test_the_cli_legend_only_with_explain(capsys):
    assert samplers.cli.main(TINY) == 0
    out = capsys.readouterr().out
    assert "how to read it:" not in out and "  R-hat (split) split R-hat" not in out
    assert out.count(_report.EXPLAIN_HINT) == 1 and "--explain" in _report.EXPLAIN_HINT
    # The fixes name flags: no adaptation ran, so tuning is one of them.
    fix_lines = [line for line in out.splitlines() if line.startswith("  - ")]
    assert fix_lines and all("--" in line for line in fix_lines)
    assert any("--adaptation default" in line for line in fix_lines)
    assert "num_warmup=" not in out and "adaptation=samplers" not in out
    assert samplers.cli.main([*TINY, "--explain"]) == 0
    explained = capsys.readouterr().out
    assert _report.LEGEND in explained and _report.EXPLAIN_HINT not in explained
    assert explained.splitlines()[-1].startswith("verdict: NOT CONVERGED")


def test_the_legend_names_the_summarys_columns():
    for column in ("mean, sd", "ESS (mean)", "R-hat (split)", "R-hat", "(nested)", "bias^2"):
        assert column in _report.LEGEND
    help_text = _main.parser()._subparsers._group_actions[0].choices["run"].format_help()
    assert "--explain" in help_text
