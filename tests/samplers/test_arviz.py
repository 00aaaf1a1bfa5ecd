"""`Result.to_arviz`: the trace as ArviZ InferenceData, agreeing with samplers.diagnostics."""

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

import ensemblenn as enn
import samplers

az = pytest.importorskip("arviz")


@pytest.fixture(scope="module")
def result():
    """test_checkpoint's run (the same compiled chunks): 8 draws of 8 chains."""
    sys.path.insert(0, str(Path(__file__).parent / "checkpoint"))  # when this file runs alone
    from test_checkpoint import make_run

    sampler, target, positions, kwargs = make_run()
    return samplers.run(sampler, target, positions, **kwargs)


def test_posterior_sample_stats_and_superchains(result):
    idata = result.to_arviz()
    x = idata.posterior["x"]
    assert x.dims == ("chain", "draw", "x_dim_0") and x.shape == (8, 8, 3)
    np.testing.assert_array_equal(x.values, np.asarray(result.trace))
    assert idata.posterior["superchain"].values.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert idata.posterior.attrs["superchain_size"] == 4
    assert idata.posterior.attrs["num_steps"] == 40
    assert idata.posterior.attrs["sampler"] == "MALA"
    stats = idata.sample_stats
    np.testing.assert_array_equal(
        stats["mean_acceptance_rate"].values, np.asarray(result.acceptance_rate)
    )
    np.testing.assert_array_equal(stats["num_divergent"].values, np.asarray(result.num_divergent))
    np.testing.assert_array_equal(stats["lp"].values, np.asarray(result.draw_logdensity))
    assert stats["lp"].dims == ("chain", "draw")
    assert stats["mean_acceptance_rate"].dims == ("chain",)
    # The superchain coordinate is what nested R-hat groups by.
    grouped = idata.posterior["x"].groupby("superchain")
    assert len(grouped.groups) == 2
    other = result.to_arviz(var_name="theta", superchain_size=2)
    assert other.posterior["superchain"].values.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_arviz_rhat_and_ess_match_samplers_diagnostics(result):
    idata = result.to_arviz()
    np.testing.assert_allclose(
        az.rhat(idata)["x"].values, np.asarray(samplers.diagnostics.rhat(result.trace)), rtol=1e-4
    )
    np.testing.assert_allclose(
        az.ess(idata, method="bulk")["x"].values,
        np.asarray(samplers.diagnostics.ess(result.trace)),
        rtol=1e-3,
    )


def test_clear_errors(result, monkeypatch):
    no_trace = dataclasses.replace(result, trace=None)
    with pytest.raises(enn.EnsembleError, match="thin="):
        no_trace.to_arviz()
    with pytest.raises(enn.EnsembleError, match="dividing the 8 chains"):
        result.to_arviz(superchain_size=3)
    monkeypatch.setitem(sys.modules, "arviz", None)  # as if ArviZ were not installed
    with pytest.raises(ImportError, match="pip install arviz"):
        result.to_arviz()
