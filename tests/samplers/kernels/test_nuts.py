"""samplers.NUTS: moments on known targets, divergences, tree depth, agreement with
BlackJAX's NUTS and with a long HMC run, device-count invariance, checkpoints, bad input."""

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ensemblenn as enn
import samplers
from tests.interrupt import after_save

PROGRAM = Path(__file__).parents[2] / "programs" / "nuts_invariance.py"


def chain_step_counts(kernel, logdensity, positions, key, num_steps):
    """Run `num_steps` transitions of every chain with a plain vmap; the per-step infos."""

    def one_chain(x, k):
        state = kernel.init(logdensity, x, k)

        def body(state, kk):
            state, info = kernel.step(logdensity, state, kk)
            return state, info

        return jax.lax.scan(body, state, jax.random.split(k, num_steps))

    keys = jax.random.split(key, positions.shape[0])
    return jax.jit(jax.vmap(one_chain))(positions, keys)


def test_moments_on_ill_conditioned_gaussian(mesh):
    target = samplers.targets.IllConditionedGaussian(dim=5, condition_number=100.0)
    kernel = samplers.NUTS(step_size=0.7, inverse_mass_matrix=target.variances)
    positions = jax.random.normal(jax.random.key(0), (32, 5))
    result = samplers.run(
        kernel,
        target,
        positions,
        key=jax.random.key(1),
        num_steps=150,
        num_warmup=30,
        mesh=mesh,
        progress=False,
    )
    d, ref = result.diagnostics, target.reference
    ess = np.asarray(d.ess)
    # Monte Carlo standard errors from the estimated ESS: sd / sqrt(ESS) for the mean and
    # sqrt(Var[x²] / ESS) for E[x²]; a 5-SE bound fails by chance with p < 1e-5 per entry.
    se_mean = np.sqrt(np.asarray(ref.second_moment) / ess)
    se_m2 = np.sqrt(np.asarray(ref.second_moment_var) / ess)
    assert np.all(np.abs(np.asarray(d.mean)) < 5 * se_mean), (d.mean, se_mean)
    assert np.all(np.abs(np.asarray(d.second_moment - ref.second_moment)) < 5 * se_m2)
    # With the exact diagonal metric the draws are nearly independent (ESS ~ 4800 here).
    assert ess.min() > 1000, ess
    assert int(result.num_divergent.sum()) == 0
    assert 0.7 < float(result.acceptance_rate.mean()) <= 1.0


def test_dense_metric_on_a_correlated_gaussian():
    target = samplers.targets.IllConditionedGaussian(dim=4, condition_number=100.0, rotated=True)
    rotation = np.asarray(target.rotation, np.float64)
    cov = rotation @ np.diag(np.asarray(target.variances, np.float64)) @ rotation.T
    positions = jax.random.normal(jax.random.key(0), (16, 4))
    kwargs = dict(key=jax.random.key(1), num_steps=150, num_warmup=20, progress=False)
    dense = samplers.run(
        samplers.NUTS(step_size=0.7, inverse_mass_matrix=jnp.asarray(cov, jnp.float32)),
        target,
        positions,
        thin=1,
        **kwargs,
    )
    identity = samplers.run(samplers.NUTS(step_size=0.7), target, positions, **kwargs)
    # The dense metric makes the target isotropic: short trees (about 3-7 steps), where the
    # identity needs trajectories of length ~ the largest sd (10): ~30 steps of 0.7.
    grads_dense = float(dense.num_grads.mean()) / 170
    grads_identity = float(identity.num_grads.mean()) / 170
    assert grads_dense < 8 and grads_identity > 3 * grads_dense, (grads_dense, grads_identity)
    # Whitened by the Cholesky factor of the true covariance, the draws' covariance is the
    # identity; each entry's MC sd is about sqrt((1 + delta_ij) / ESS). Bound: 5 SE.
    draws = np.asarray(dense.trace, np.float64).reshape(-1, 4)
    white = np.linalg.solve(np.linalg.cholesky(cov), draws.T).T
    ess = float(np.asarray(dense.diagnostics.ess).min())
    error = np.cov(white.T) - np.eye(4)
    assert np.all(np.abs(error) < 5 * np.sqrt((1 + np.eye(4)) / ess)), (error, ess)
    assert int(dense.num_divergent.sum()) == 0


def test_divergences_on_the_funnel():
    target = samplers.targets.NealsFunnel(dim=10)
    positions = jax.vmap(target.initial_position)(jax.random.split(jax.random.key(0), 16))
    counts = {}
    for step_size in (1.0, 0.2):
        result = samplers.run(
            samplers.NUTS(step_size=step_size, max_tree_depth=6),
            target,
            positions,
            key=jax.random.key(1),
            num_steps=60,
            progress=False,
        )
        counts[step_size] = int(result.num_divergent.sum())
    # Measured (32 chains x 100 steps, depth 10): step 1.0 diverges in 32 % of the
    # transitions (the neck is narrower than the step), step 0.3 in 0.03 %. Bounds with
    # wide margins for 16 x 60 = 960 transitions: > 10 % and < 1 %.
    assert counts[1.0] > 96, counts
    assert counts[0.2] < 10, counts


def test_nonfinite_density_is_divergent_and_never_accepted():
    # log p = -inf beyond |x| > 1: a long trajectory leaves the support and must stop there.
    def logdensity(x):
        return jnp.where(jnp.all(jnp.abs(x) < 1.0), -0.5 * jnp.sum(x**2), -jnp.inf)

    kernel = samplers.NUTS(step_size=0.3)
    state, info = chain_step_counts(
        kernel, logdensity, jnp.zeros((8, 2)), jax.random.key(0), num_steps=50
    )
    assert bool(info.is_divergent.any())
    assert bool((jnp.abs(state.position) < 1.0).all())  # every draw stays in the support
    assert bool(jnp.isfinite(state.logdensity).all())


def test_tree_depth_is_max_when_the_step_is_tiny():
    logdensity = samplers.targets.IllConditionedGaussian(dim=3, condition_number=10.0)
    kernel = samplers.NUTS(step_size=1e-4, max_tree_depth=5)
    _, info = chain_step_counts(kernel, logdensity, jnp.ones((8, 3)), jax.random.key(0), 4)
    # A trajectory of 31 * 1e-4 never turns: every tree is full, 1 + 2 + 4 + 8 + 16 steps.
    np.testing.assert_array_equal(info.tree_depth, 5)
    np.testing.assert_array_equal(info.num_grads, 31)
    assert bool((info.acceptance_rate > 0.999).all()) and not bool(info.is_divergent.any())
    # A reasonable step turns early, and num_grads is each chain's own count.
    _, info = chain_step_counts(
        samplers.NUTS(step_size=0.5, max_tree_depth=8),
        lambda x: -0.5 * jnp.sum(x**2),
        jnp.ones((8, 3)),
        jax.random.key(1),
        20,
    )
    assert int(info.tree_depth.max()) < 8 and len(np.unique(info.num_grads)) > 1
    assert bool((info.num_grads < 2**info.tree_depth).all())
    assert bool((info.num_grads >= 2 ** (info.tree_depth - 1)).all())


def test_run_reports_each_chains_gradients(mesh):
    result = samplers.run(
        samplers.NUTS(step_size=1e-4, max_tree_depth=4),
        lambda x: -0.5 * jnp.sum(x**2),
        jnp.ones((8, 2)),
        key=jax.random.key(0),
        num_steps=5,
        num_warmup=3,
        mesh=mesh,
        progress=False,
    )
    np.testing.assert_array_equal(result.num_grads, 8 * 15)  # (3 + 5) steps x (2^4 - 1)


def test_one_and_four_devices_are_bitwise_identical(tmp_path):
    out = {}
    procs = {
        n: subprocess.Popen([sys.executable, str(PROGRAM), str(n), str(tmp_path / f"{n}.npz")])
        for n in (1, 4)
    }
    for n, proc in procs.items():
        assert proc.wait(timeout=600) == 0, f"program failed on {n} devices"
        out[n] = dict(np.load(tmp_path / f"{n}.npz"))
    assert len(np.unique(out[1]["num_grads"])) > 1  # the chains' trees really differ
    for name, expected in out[1].items():
        np.testing.assert_array_equal(out[4][name], expected, err_msg=name)


def test_checkpoint_resume_is_bitwise(tmp_path):
    target = samplers.targets.IllConditionedGaussian(dim=3, condition_number=4.0)
    kernel = samplers.NUTS(step_size=0.5, max_tree_depth=5)
    positions = jax.random.normal(jax.random.key(3), (8, 3))
    kwargs = dict(key=jax.random.key(4), num_steps=20, chunk_size=10, progress=False)
    whole = samplers.run(kernel, target, positions, **kwargs)

    class Interrupt(Exception):
        pass

    with pytest.raises(Interrupt):
        samplers.run(kernel, target, positions, checkpoint_dir=tmp_path, **kwargs,
                     on_chunk=after_save(tmp_path, 10, Interrupt))  # fmt: skip
    resumed = samplers.run(
        kernel, target, positions, checkpoint_dir=tmp_path, resume=True, **kwargs
    )
    for name in ("position", "grad", "logdensity"):
        np.testing.assert_array_equal(
            getattr(resumed.state, name), getattr(whole.state, name), err_msg=name
        )
    np.testing.assert_array_equal(resumed.num_grads, whole.num_grads)
    np.testing.assert_array_equal(resumed.moments.mean, whole.moments.mean)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(max_tree_depth=0), enn.EnsembleError, "between 1 and 30"),
        (dict(max_tree_depth=31), enn.EnsembleError, "between 1 and 30"),
        (dict(max_tree_depth=2.5), TypeError, "must be a Python int"),
        (dict(max_tree_depth="10"), TypeError, "must be a Python int"),
        (dict(max_tree_depth=True), TypeError, "must be a Python int"),
        (dict(max_tree_depth=np.float64(4.0)), TypeError, "must be a Python int"),
        (dict(step_size=-0.1), enn.EnsembleError, "step_size must be positive"),
        (dict(inverse_mass_matrix=-jnp.ones(2)), enn.EnsembleError, "inverse_mass_matrix"),
    ],
)
def test_bad_hyperparameters_are_clear_errors(kwargs, error, match):
    kwargs = {"step_size": 0.1, **kwargs}
    with pytest.raises(error, match=match) as info:
        samplers.NUTS(**kwargs)
    assert isinstance(info.value, enn.EnsembleError)
    assert "fix:" in str(info.value)


def test_window_adaptation_contract():
    # What a step-size / metric adaptation reads from a kernel.
    kernel = samplers.NUTS(step_size=0.1)
    assert samplers.NUTS.default_target_acceptance == 0.9
    assert kernel.inverse_mass_matrix is None and kernel.max_tree_depth == 10
    assert kernel.grads_per_step == 2**10 - 1


@pytest.mark.slow
def test_agrees_with_blackjax_nuts_on_the_banana():
    """External reference: BlackJAX 1.7.1's `blackjax.nuts` (multinomial NUTS with the same
    trapezoidal generalized U-turn criterion), same step size and identity metric. Same
    algorithm, so the distribution of the number of leapfrog steps per transition must
    agree, not only the moments: a wrong U-turn check or sampling rule shifts it (counting
    both ends' momenta in full, for instance, adds ~1.2 steps to the ~19.4 measured here,
    6.5 SE of the difference: per-chain SEs 0.14 and 0.12 steps)."""
    blackjax = pytest.importorskip("blackjax")
    target = samplers.targets.Banana()
    num_chains, num_steps, step_size = 64, 300, 0.6
    positions = jax.vmap(target.sample)(jax.random.split(jax.random.key(0), num_chains))
    ours = samplers.run(
        samplers.NUTS(step_size=step_size),
        target,
        positions,
        key=jax.random.key(1),
        num_steps=num_steps,
        thin=1,
        progress=False,
    )
    nuts = blackjax.nuts(target, step_size=step_size, inverse_mass_matrix=jnp.ones(2))

    def their_chain(x, key):
        def body(state, k):
            state, info = nuts.step(k, state)
            return state, (state.position, info.num_integration_steps, info.acceptance_rate)

        return jax.lax.scan(body, nuts.init(x), jax.random.split(key, num_steps))[1]

    keys = jax.random.split(jax.random.key(2), num_chains)
    draws, steps, acceptance = jax.jit(jax.vmap(their_chain))(positions, keys)

    # Per-chain means are independent across chains: their spread gives the MC error.
    def mean_and_se(per_chain):
        per_chain = np.asarray(per_chain, np.float64)
        return per_chain.mean(0), per_chain.std(0, ddof=1) / np.sqrt(per_chain.shape[0])

    for a, b in [
        (np.asarray(ours.num_grads) / num_steps, np.asarray(steps).mean(axis=1)),
        (ours.acceptance_rate, np.asarray(acceptance).mean(axis=1)),
        ((np.asarray(ours.trace) ** 2).mean(axis=1), (np.asarray(draws) ** 2).mean(axis=1)),
    ]:
        (ma, sa), (mb, sb) = mean_and_se(a), mean_and_se(b)
        # 5 SE of the difference of two independent estimates (p < 1e-6 per comparison).
        assert np.all(np.abs(ma - mb) < 5 * np.hypot(sa, sb)), (ma, mb, sa, sb)
    ref = np.asarray(target.reference.second_moment)
    m2, se = mean_and_se((np.asarray(ours.trace) ** 2).mean(axis=1)[:, 0])
    assert abs(m2 - ref[0]) < 5 * se, (m2, ref[0], se)


@pytest.mark.slow
def test_agrees_with_a_long_hmc_run_on_logistic_regression():
    target = samplers.targets.LogisticRegression(num_data=500, num_features=5)
    positions = 0.1 * jax.random.normal(jax.random.key(0), (32, 5))
    nuts = samplers.run(
        samplers.NUTS(step_size=0.08),
        target,
        positions,
        key=jax.random.key(1),
        num_steps=300,
        num_warmup=50,
        progress=False,
    )
    # The reference: jittered HMC, ~4x as many gradients (trajectory ~1, about the
    # posterior's sd times 5, so draws are close to independent).
    hmc = samplers.run(
        samplers.HMC(step_size=0.08, num_integration_steps=12, jitter=True),
        target,
        positions,
        key=jax.random.key(2),
        num_steps=1500,
        num_warmup=100,
        progress=False,
    )
    for name in ("mean", "sd"):
        a, b = (
            np.asarray(getattr(nuts.diagnostics, name)),
            np.asarray(getattr(hmc.diagnostics, name)),
        )
        sd = np.asarray(hmc.diagnostics.sd)
        # MC error from each run's ESS: sd / sqrt(ESS) for a mean, ~ sd / sqrt(2 ESS) for an
        # sd (Gaussian approximation); 5 SE of the difference.
        scale = 1.0 if name == "mean" else 0.5
        se = np.hypot(
            sd * np.sqrt(scale / np.asarray(nuts.diagnostics.ess)),
            sd * np.sqrt(scale / np.asarray(hmc.diagnostics.ess)),
        )
        assert np.all(np.abs(a - b) < 5 * se), (name, a, b, se)
    assert float(nuts.acceptance_rate.mean()) > 0.7
