"""`samplers.targets.from_numpyro`: a NumPyro model sampled on the sharded ensemble, read
back on the constrained scale, with the model's data entering the shard_map as operands."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_pytree_models import SIGMA, Y, assert_eight_schools_means

import ensemblenn as enn
import samplers

numpyro = pytest.importorskip("numpyro")
dist = pytest.importorskip("numpyro.distributions")


def eight_schools(sigma, y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", 8):
        theta_z = numpyro.sample("theta_z", dist.Normal(0.0, 1.0))
        theta = numpyro.deterministic("theta", mu + tau * theta_z)
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


def test_sites_observable_and_initial_positions():
    target = samplers.targets.from_numpyro(eight_schools, jnp.asarray(SIGMA), y=jnp.asarray(Y))
    assert target.shapes == {"mu": (), "tau": (), "theta_z": (8,)}
    assert target.deterministic == ("theta",)
    x = target.initial_positions(jax.random.key(0), 16)
    assert jax.tree.map(jnp.shape, x) == {"mu": (16,), "tau": (16,), "theta_z": (16, 8)}
    leaves = np.concatenate([np.ravel(v) for v in jax.tree.leaves(x)])
    assert (np.abs(leaves) < 2).all() and leaves.std() > 0.5  # uniform(-2, 2): sd 1.15
    one = jax.tree.map(lambda v: v[0], x)
    obs = target.observable(one)
    np.testing.assert_allclose(obs["tau"], np.exp(one["tau"]), rtol=1e-6)  # tau > 0: exp
    np.testing.assert_allclose(obs["theta"], obs["mu"] + obs["tau"] * one["theta_z"], rtol=1e-5)
    # The log density is NumPyro's log joint on the unconstrained scale.
    expected = -numpyro.infer.util.potential_energy(
        eight_schools, (jnp.asarray(SIGMA),), {"y": jnp.asarray(Y)}, one
    )
    np.testing.assert_allclose(target(one), expected, rtol=1e-6)


def test_eight_schools_from_numpyro_on_an_explicit_mesh(explicit_mesh):
    """The same model as the plain-JAX one of test_pytree_models: the same answer."""
    target = samplers.targets.from_numpyro(eight_schools, jnp.asarray(SIGMA), jnp.asarray(Y))
    result = samplers.run(
        samplers.HMC(step_size=0.3, num_integration_steps=4),
        target,
        target.initial_positions(jax.random.key(3), 128),
        key=jax.random.key(0),
        num_steps=400,
        adaptation=samplers.ChEES(num_steps=200),
        mesh=explicit_mesh,
        progress=False,
    )
    assert_eight_schools_means(result, names=("mu", "tau", "theta_z", "theta"))
    assert result.names[:3] == ("mu", "tau", "theta[0]")  # sorted sites, deterministic too
    assert set(result.unconstrained.diagnostics.mean) == {"mu", "tau", "theta_z"}


def _shard_map_eqns(jaxpr):
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "shard_map":
            found.append(eqn)
        for param in eqn.params.values():
            if hasattr(param, "jaxpr") and hasattr(param.jaxpr, "eqns"):
                found += _shard_map_eqns(param.jaxpr)
    return found


@pytest.mark.parametrize("how", ["model arguments", "closed over"])
def test_the_data_enter_the_shard_map_as_operands(explicit_mesh, how):
    y = jnp.asarray(Y) + 0.25  # a value no constant of the model has
    if how == "model arguments":
        target = samplers.targets.from_numpyro(eight_schools, jnp.asarray(SIGMA), y)
    else:

        def closed(sigma):
            eight_schools(sigma, y)

        target = samplers.targets.from_numpyro(closed, jnp.asarray(SIGMA))
    positions = target.initial_positions(jax.random.key(0), 8)

    def go(positions):
        result = samplers.run(samplers.MALA(0.1), target, positions, key=jax.random.key(1),
                              num_steps=2, mesh=explicit_mesh, progress=False)  # fmt: skip
        return result.state.position

    closed_jaxpr = jax.make_jaxpr(go)(positions)
    assert _shard_map_eqns(closed_jaxpr.jaxpr)
    assert enn.shard_map_captures(closed_jaxpr) == []
    # y is a (replicated) operand of the chunk's shard_map: some shard_map input is y.
    consts = [np.asarray(c) for c in closed_jaxpr.consts if np.shape(c) == (8,)]
    assert any(np.array_equal(c, np.asarray(y)) for c in consts)


def test_without_numpyro_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "numpyro", None)
    monkeypatch.setitem(sys.modules, "numpyro.infer", None)
    with pytest.raises(ImportError, match=r"pip install 'ensemblenn\[numpyro\]'"):
        samplers.targets.from_numpyro(eight_schools, SIGMA, Y)


def test_discrete_latent_sites_are_refused():
    def model():
        numpyro.sample("k", dist.Poisson(3.0))

    with pytest.raises(enn.EnsembleError, match=r"discrete latent sites \['k'\]"):
        samplers.targets.from_numpyro(model)
