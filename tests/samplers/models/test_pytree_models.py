"""Users' own models: pytree positions end to end (eight schools as a dict, a logistic
regression whose parameters are an equinox Module), diagnostics and names in their
structure, on 4 simulated devices."""

import subprocess
import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ensemblenn as enn
import samplers
from samplers.driver import _flat  # private: where per-coordinate names are made
from tests.interrupt import after_save

# Eight schools (Rubin 1981).
Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0], np.float32)
SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0], np.float32)

# Posterior means of mu and tau for mu ~ N(0, 5), tau ~ HalfCauchy(5), computed ONCE with
# NumPyro 0.22 NUTS (target_accept_prob=0.9, 4 chains x 100_000 draws after 2_000 warmup,
# key 2024, non-centred model): value, Monte Carlo standard error.
REF_MU, REF_MU_MCSE = 4.3888, 0.0056
REF_TAU, REF_TAU_MCSE = 3.6071, 0.0061


def _normal(x, mean, sd):
    return -0.5 * ((x - mean) / sd) ** 2 - jnp.log(sd) - 0.5 * jnp.log(2 * jnp.pi)


class EightSchools(eqx.Module):
    """Non-centred eight schools over `{"mu": (), "log_tau": (), "theta_z": (8,)}`."""

    y: jax.Array = enn.broadcast(converter=jnp.asarray, default_factory=lambda: Y)
    sigma: jax.Array = enn.broadcast(converter=jnp.asarray, default_factory=lambda: SIGMA)

    def __call__(self, p):
        tau = jnp.exp(p["log_tau"])
        theta = p["mu"] + tau * p["theta_z"]
        half_cauchy = jnp.log(2.0 / (jnp.pi * 5.0)) - jnp.log1p((tau / 5.0) ** 2)
        return (
            _normal(p["mu"], 0.0, 5.0)
            + half_cauchy
            + p["log_tau"]  # Jacobian of tau = exp(log_tau)
            + _normal(p["theta_z"], 0.0, 1.0).sum()
            + _normal(self.y, theta, self.sigma).sum()
        )

    def observable(self, p):
        tau = jnp.exp(p["log_tau"])
        return {"mu": p["mu"], "tau": tau, "theta": p["mu"] + tau * p["theta_z"]}


def eight_schools_start(num_chains, key=jax.random.key(7)):
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "mu": jax.random.normal(k1, (num_chains,)),
        "log_tau": jax.random.normal(k2, (num_chains,)),
        "theta_z": jax.random.normal(k3, (num_chains, 8)),
    }


def assert_eight_schools_means(result, names=("mu", "tau", "theta")):
    """Constrained means against the reference: within 5 Monte Carlo standard errors of the
    run (from its own ESS, floored so the tolerance cannot be vacuous) plus the
    reference's."""
    d = result.diagnostics
    assert set(d.mean) == set(names) and d.mean["theta"].shape == (8,)
    for name, ref, ref_se in (("mu", REF_MU, REF_MU_MCSE), ("tau", REF_TAU, REF_TAU_MCSE)):
        ess = float(d.ess[name])
        assert ess > 300, (name, ess)
        se = float(d.sd[name]) / np.sqrt(ess)
        assert abs(float(d.mean[name]) - ref) < 5 * (se + ref_se), (name, d.mean[name], se)
        assert float(d.rhat[name]) < 1.05


CHAINS = 128


def test_eight_schools_hmc_chees_from_dict_positions(mesh):
    result = samplers.run(
        samplers.HMC(step_size=0.3, num_integration_steps=4),
        EightSchools(),
        eight_schools_start(CHAINS),
        key=jax.random.key(0),
        num_steps=400,
        adaptation=samplers.ChEES(num_steps=200),
        mesh=mesh,
        thin=20,
        progress=False,
    )
    assert_eight_schools_means(result)
    # The state keeps the position's structure; the trace is the observable's.
    assert jax.tree.map(jnp.shape, result.state.position) == {
        "mu": (CHAINS,), "log_tau": (CHAINS,), "theta_z": (CHAINS, 8)
    }  # fmt: skip
    assert result.trace["theta"].shape == (CHAINS, 20, 8)
    assert result.unconstrained.trace["log_tau"].shape == (CHAINS, 20)
    np.testing.assert_allclose(
        result.trace["tau"], np.exp(result.unconstrained.trace["log_tau"]), rtol=1e-6
    )
    assert set(result.unconstrained.diagnostics.mean) == {"mu", "log_tau", "theta_z"}


def test_eight_schools_laps_from_dict_positions(mesh):
    result = samplers.run(
        None,
        EightSchools(),
        eight_schools_start(CHAINS),
        key=jax.random.key(1),
        num_steps=400,
        adaptation=samplers.LAPS(num_steps1=200, num_adaptation_steps=20),
        mesh=mesh,
        progress=False,
    )
    assert_eight_schools_means(result)


def test_summary_rows_are_named_by_path():
    result = samplers.run(
        samplers.MALA(step_size=0.2),
        EightSchools(),
        eight_schools_start(8),
        key=jax.random.key(0),
        num_steps=20,
        progress=False,
    )
    lines = result.summary(max_rows=20, print_it=False).splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line) == {"-"})
    names = [line.split()[0] for line in lines[rule + 1 :]]
    assert names == ["mu", "tau"] + [f"theta[{i}]" for i in range(8)]
    assert result.names == tuple(names)
    assert lines[0].startswith("NOT CONVERGED")  # 20 steps: the verdict line comes first
    assert any(line.startswith("8 chains on 4 device(s)") for line in lines)


@pytest.mark.filterwarnings("ignore::samplers.ConvergenceWarning")
def test_coordinate_names_are_made_when_read_not_per_run(monkeypatch):
    """One name per coordinate (`theta[3]`) is a string per dimension: made for every call
    it cost ~1 ms per 10 000 coordinates of fixed cost (and sat in static fields hashed into
    every program's cache key). A run makes none; the summary and `names` make them."""
    made = []
    element_names = _flat._element_names
    monkeypatch.setattr(_flat, "_element_names", lambda *a: made.append(a) or element_names(*a))
    _flat._flat_names.cache_clear()
    start = {"w": jnp.zeros((8, 50, 40)), "b": jnp.zeros((8, 3))}
    result = samplers.run(samplers.MALA(step_size=0.1), lambda p: -sum_squares(p), start,
                          key=jax.random.key(0), num_steps=3, progress=False)  # fmt: skip
    assert made == [] and result.state.position["w"].shape == (8, 50, 40)
    assert len(result.names) == 2003 and result.names[-1] == "w[49, 39]"  # b sorts first
    assert result.names[:3] == ("b[0]", "b[1]", "b[2]") and len(made) == 2


def sum_squares(p):
    return sum(jnp.sum(x**2) for x in jax.tree.leaves(p))


# --- a logistic regression whose parameters are an equinox Module --------------------------


class Params(eqx.Module):
    w: jax.Array
    b: jax.Array


def _data():
    x = jax.random.normal(jax.random.key(11), (200, 3))
    logits = x @ jnp.array([1.0, -2.0, 0.5]) + 0.3
    y = jax.random.bernoulli(jax.random.key(12), jax.nn.sigmoid(logits)).astype(jnp.float32)
    return x, y


X, LABELS = _data()


def _logistic(w, b):
    logits = X @ w + b
    likelihood = LABELS * jax.nn.log_sigmoid(logits) + (1 - LABELS) * jax.nn.log_sigmoid(-logits)
    return likelihood.sum() - 0.5 * (w @ w + b**2)


def _module_density(p: Params):
    return _logistic(p.w, p.b)


def _flat_density(x):
    return _logistic(x[:3], x[3])


@pytest.mark.parametrize(
    "sampler",
    [
        samplers.MALA(step_size=0.1),
        samplers.HMC(step_size=0.1, num_integration_steps=3),
        samplers.Stretch(),
        samplers.DifferentialEvolution(),
    ],
    ids=lambda s: type(s).__name__,
)
def test_module_parameters_are_the_flat_run_bitwise(mesh, sampler):
    """Ravel once: a run over `Params(w, b)` is, bit for bit, the run over the hand-ravelled
    vector `[w, b]` (fields in order) with the same key, for every kind of kernel."""
    start = jax.random.normal(jax.random.key(3), (32, 4)) * 0.1
    settings = dict(key=jax.random.key(4), num_steps=30, thin=10, progress=False, mesh=mesh)
    tree = samplers.run(sampler, _module_density, Params(start[:, :3], start[:, 3]), **settings)
    flat = samplers.run(sampler, _flat_density, start, **settings)
    assert isinstance(tree.state.position, Params)
    np.testing.assert_array_equal(tree.state.position.w, flat.state.position[:, :3])
    np.testing.assert_array_equal(tree.state.position.b, flat.state.position[:, 3])
    np.testing.assert_array_equal(tree.trace.w, flat.trace[..., :3])
    np.testing.assert_array_equal(tree.diagnostics.rhat.b, flat.diagnostics.rhat[3])
    np.testing.assert_array_equal(tree.diagnostics.mean.w, flat.diagnostics.mean[:3])
    assert tree.names == ("w[0]", "w[1]", "w[2]", "b")


def test_logistic_module_posterior_mean():
    """The Module-parameter posterior mean against an importance-sampling reference of the
    same model (a Laplace proposal): within 5 Monte Carlo standard errors of the run."""
    result = samplers.run(
        samplers.HMC(step_size=0.1, num_integration_steps=5),
        _module_density,
        Params(jnp.zeros((64, 3)), jnp.zeros(64)),
        key=jax.random.key(5),
        num_steps=300,
        num_warmup=50,
        progress=False,
    )
    # Reference: 200_000 draws from a wide Gaussian around the mode, self-normalised weights.
    mode = jnp.zeros(4)
    for _ in range(30):
        g, h = jax.grad(_flat_density)(mode), jax.hessian(_flat_density)(mode)
        mode = mode - jnp.linalg.solve(h, g)
    cov = jnp.linalg.inv(-jax.hessian(_flat_density)(mode)) * 1.5
    draws = jax.random.multivariate_normal(jax.random.key(6), mode, cov, (200_000,))
    proposal = jax.scipy.stats.multivariate_normal.logpdf(draws, mode, cov)
    log_w = jax.vmap(_flat_density)(draws) - proposal
    w = jnp.exp(log_w - log_w.max())
    reference = (w[:, None] * draws).sum(0) / w.sum()
    d = result.diagnostics
    mean = np.concatenate([np.asarray(d.mean.w), np.asarray(d.mean.b)[None]])
    sd = np.concatenate([np.asarray(d.sd.w), np.asarray(d.sd.b)[None]])
    ess = np.concatenate([np.asarray(d.ess.w), np.asarray(d.ess.b)[None]])
    assert (ess > 500).all()
    np.testing.assert_array_less(np.abs(mean - np.asarray(reference)), 5 * sd / np.sqrt(ess))


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "positions, match",
    [
        ({"a": jnp.zeros(4), "n": jnp.zeros(4, jnp.int32)}, r"leaf 'n' has dtype int32"),
        (
            {"a": jnp.zeros(4, jnp.float32), "b": jnp.zeros(4, jnp.float16)},
            r"different dtypes \('a': float32, 'b': float16\)",
        ),
        ({"a": jnp.zeros(4), "b": jnp.zeros((5, 2))}, r"'a': \(4,\), 'b': \(5, 2\)"),
        ({}, "empty pytree"),
        ({"a": jnp.zeros(4), "s": jnp.float32(0.0)}, r"leaf 's' is a scalar"),
    ],
    ids=["integer", "mixed", "chains", "empty", "scalar"],
)
def test_bad_pytrees_are_named(positions, match):
    with pytest.raises(samplers.PositionsError, match=match):
        samplers.run(
            samplers.RandomWalk(0.5),
            lambda p: -sum(jnp.sum(x**2) for x in jax.tree.leaves(p)),
            positions,
            key=jax.random.key(0),
            num_steps=2,
            progress=False,
        )


def test_observable_leaves_are_checked():
    class IntegerObservable(eqx.Module):
        def __call__(self, p):
            return -(p["a"] ** 2)

        def observable(self, p):
            return {"count": jnp.int32(1)}

    with pytest.raises(samplers.PositionsError, match="observable.*'count' has dtype int32"):
        samplers.run(samplers.RandomWalk(0.5), IntegerObservable(), {"a": jnp.zeros(4)},
                     key=jax.random.key(0), num_steps=2, progress=False)  # fmt: skip


# --- device counts and checkpoints -----------------------------------------------------------


def test_pytree_positions_bitwise_on_1_2_4_devices(tmp_path):
    program = Path(__file__).parents[2] / "programs" / "run_invariance.py"
    procs = {
        n: subprocess.Popen([sys.executable, str(program), str(n), str(tmp_path / f"{n}.npz")])
        for n in (1, 2, 4)
    }
    for n, proc in procs.items():
        assert proc.wait(timeout=300) == 0, f"program failed on {n} devices"
    out = {n: np.load(tmp_path / f"{n}_tree.npz") for n in procs}
    for n in (2, 4):
        for name in ("a", "b", "trace_b", "mean_b", "rhat_a"):
            np.testing.assert_array_equal(out[n][name], out[1][name], err_msg=f"{name}, {n}")
    assert out[1]["b"].shape == (16, 2, 2) and out[1]["trace_b"].shape == (16, 3, 2, 2)


class Interrupt(Exception):
    pass


def test_checkpoint_resume_with_pytree_positions(tmp_path, mesh):
    """Stopped (a preemption) after the save at step 20, then resumed through
    `samplers.run(..., resume=True)`: bitwise the uninterrupted run."""
    settings = dict(
        key=jax.random.key(2), num_steps=40, num_warmup=10, thin=5, chunk_size=10,
        adaptation=samplers.ChEES(num_steps=20), progress=False, mesh=mesh,
    )  # fmt: skip
    args = (samplers.HMC(0.3, 3), EightSchools(), eight_schools_start(16))
    whole = samplers.run(*args, **settings)

    with pytest.raises(Interrupt):
        samplers.run(*args, **settings, checkpoint_dir=tmp_path,
                     on_chunk=after_save(tmp_path, 20, Interrupt))  # fmt: skip
    resumed = samplers.run(*args, **settings, checkpoint_dir=tmp_path, resume=True)
    for name, a, b in (
        ("position", whole.state.position, resumed.state.position),
        ("trace", whole.trace, resumed.trace),
        ("unconstrained trace", whole.unconstrained.trace, resumed.unconstrained.trace),
        ("mean", whole.diagnostics.mean, resumed.diagnostics.mean),
        ("rhat", whole.diagnostics.rhat, resumed.diagnostics.rhat),
    ):
        assert jax.tree.structure(a) == jax.tree.structure(b), name
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_array_equal(x, y, err_msg=name)


def test_checkpoint_of_another_structure_does_not_resume(tmp_path):
    """Same flat shape, other structure (leaf names): the fingerprint tells them apart."""
    settings = dict(key=jax.random.key(0), num_steps=4, progress=False, checkpoint_dir=tmp_path)

    def density(p):
        return -0.5 * sum(jnp.sum(x**2) for x in jax.tree.leaves(p))

    samplers.run(samplers.MALA(0.3), density, {"a": jnp.zeros((8, 2))}, **settings)
    with pytest.raises(samplers.CheckpointMismatchError):
        samplers.run(samplers.MALA(0.3), density, {"b": jnp.zeros((8, 2))}, **settings,
                     resume=True)  # fmt: skip
