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


# -- the complete export: a NumPyro user's run, without thin ------------------------------
# One 8-schools run (NUTS, a window adaptation, 16 chains x 100 draws, the default thin)
# serves the tests below, under ArviZ 0.x (lane 1) and 1.x (lane 2). Its plates name the
# dims, its observations give the pointwise log likelihood.

numpyro = pytest.importorskip("numpyro")
jax = pytest.importorskip("jax")


class _EnergyInfo(samplers.kernels.nuts.NUTSInfo):
    energy: "jax.Array"


class _EnergyNUTS(samplers.NUTS):
    """NUTS whose info also reports the Hamiltonian of the selected point (NumPyro's
    `energy`): the start's `K(p0) - log p(x)`, with `p0` drawn as NUTS.step draws it, plus
    the selected point's energy error. What a kernel that reports `energy` looks like."""

    def step(self, logdensity, state, key):
        from samplers import random
        from samplers.integrators import kinetic_energy, sample_momentum

        metric = self.metric(state.count)
        p0 = sample_momentum(state.position, metric, random.split(key)[0])
        start = kinetic_energy(p0, metric) - state.logdensity
        new, info = super().step(logdensity, state, key)
        fields = {f.name: getattr(info, f.name) for f in dataclasses.fields(info)}
        return new, _EnergyInfo(**fields, energy=start + info.energy_change)


def _eight_schools(y, sigma):
    import numpyro.distributions as dist

    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", len(sigma)):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.deterministic("theta_shift", theta - mu)
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


@pytest.fixture(scope="module")
def schools():
    import jax.numpy as jnp

    y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    sigma = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
    target = samplers.targets.from_numpyro(_eight_schools, y, sigma)
    with pytest.warns(samplers.ConvergenceWarning):  # a funnel: divergences, as expected
        result = samplers.run(
            _EnergyNUTS(max_tree_depth=6),
            target,
            None,
            num_chains=16,
            key=jax.random.key(0),
            num_steps=100,
            adaptation=samplers.WindowAdaptation(num_steps=150),
            progress=False,
        )
    return result, result.to_arviz()


def test_default_keeps_every_draw_with_sample_stats(schools):
    result, idata = schools
    assert result.thin == 1 and result.thin_auto
    assert "trace: every draw kept (memory budget 256 MiB)" in result.summary(print_it=False)
    stats = idata.sample_stats
    for name in ("diverging", "energy", "tree_depth", "n_steps", "step_size",
                 "acceptance_rate", "lp"):  # fmt: skip
        assert stats[name].dims == ("chain", "draw"), name
        assert stats[name].shape == (16, 100), name
    assert stats["diverging"].dtype == bool
    # Per draw, what the run counted per chain: divergences and leapfrog steps.
    np.testing.assert_array_equal(
        stats["diverging"].values.sum(1), np.asarray(result.num_divergent)
    )
    assert stats["diverging"].values.sum() > 0  # the funnel's divergences, to be marked
    n_steps = stats["n_steps"].values
    depth = stats["tree_depth"].values  # its last subtree may stop early (a turn inside)
    assert np.all((n_steps <= 2**depth - 1) & (n_steps >= 2 ** (depth - 1)))
    assert np.all(n_steps.sum(1) <= np.asarray(result.num_grads))
    np.testing.assert_allclose(np.unique(stats["step_size"].values), [result.sampler.step_size])
    assert idata.posterior.attrs["num_warmup"] == 150  # the adaptation's steps


def test_numpyro_plates_deterministic_sites_and_constrained_values(schools):
    result, idata = schools
    posterior = idata.posterior
    assert set(posterior.data_vars) == {"mu", "tau", "theta", "theta_shift"}
    assert posterior["theta"].dims == ("chain", "draw", "school")
    assert posterior["theta_shift"].dims == ("chain", "draw", "school")
    assert posterior["school"].values.tolist() == list(range(8))
    assert float(posterior["tau"].min()) > 0  # constrained (HalfCauchy), not log tau
    np.testing.assert_allclose(
        posterior["theta_shift"].values,
        posterior["theta"].values - posterior["mu"].values[..., None],
        rtol=1e-5, atol=1e-4,
    )  # fmt: skip
    log_lik = idata.log_likelihood["obs"]
    assert log_lik.dims == ("chain", "draw", "school") and log_lik.shape == (16, 100, 8)
    assert idata.observed_data["obs"].dims == ("school",)
    # log N(y | theta, sigma) of the first draw, by hand.
    y = np.asarray(idata.observed_data["obs"].values)
    sigma = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
    theta = posterior["theta"].values[0, 0]
    expected = -0.5 * ((y - theta) / sigma) ** 2 - np.log(sigma) - 0.5 * np.log(2 * np.pi)
    np.testing.assert_allclose(log_lik.values[0, 0], expected, rtol=1e-4)


def test_arviz_summary_plots_and_loo(schools):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, idata = schools
    summary = az.summary(idata)
    names = [str(i) for i in summary.index]
    assert any("theta" in name for name in names) and any("tau" in name for name in names)
    az.plot_trace(idata, var_names=["mu", "tau"])  # divergences marked (sample_stats)
    plt.close("all")
    az.plot_energy(idata)
    plt.close("all")
    loo = az.loo(idata)
    elpd = loo.elpd if hasattr(loo, "elpd") else loo["elpd_loo"]  # ArviZ 1.x, 0.x
    assert np.isfinite(float(elpd))


def test_thin_zero_keeps_no_trace(schools):
    result, _ = schools
    import jax.numpy as jnp

    run = samplers.run(
        samplers.MALA(0.5), lambda x: -0.5 * jnp.sum(x**2), jnp.zeros((8, 2)),
        key=jax.random.key(0), num_steps=10, thin=0, progress=False,
    )  # fmt: skip
    assert run.trace is None and run.sample_stats is None
    assert "trace: no draws kept (thin=0)" in run.summary(print_it=False)
    with pytest.raises(enn.EnsembleError, match="thin=0"):
        run.to_arviz()
