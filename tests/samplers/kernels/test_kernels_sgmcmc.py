"""SGLD and SGHMC: exact discrete-time stationary laws, schedules, minibatches, the driver."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

import ensemblenn as enn
import samplers

NUM_DATA = 100
SIGMA = np.array([0.5, 1.0, 2.0])  # per-dimension posterior standard deviations


def quadratic_minibatch(x, indices):
    """A 'minibatch' estimator that is exact: every datum contributes the same term, so
    `NUM_DATA / batch * sum over the batch` equals the full-data sum, -0.5 sum(x^2/SIGMA^2)."""
    per_datum = -0.5 * jnp.sum((x / SIGMA) ** 2) / NUM_DATA
    return NUM_DATA / indices.shape[0] * jnp.sum(jnp.full(indices.shape, per_datum))


def run_chains(kernel, logdensity, positions, key, num_steps, mesh=None, record=None):
    """`num_steps` steps on every chain: (final states, stacked per-step records), by
    default the records are `(position, info)`."""
    record = record or (lambda state, info: (state.position, info))

    def chain(kernel, logdensity, x, k):
        k_init, k_run = jax.random.split(k)
        state = kernel.init(logdensity, x, k_init)

        def body(s, kk):
            s, info = kernel.step(logdensity, s, kk)
            return s, record(s, info)

        return jax.lax.scan(body, state, jax.random.split(k_run, num_steps))

    keys = enn.chain_keys(key, positions.shape[0])
    if mesh is None:
        return eqx.filter_jit(jax.vmap(chain, in_axes=(None, None, 0, 0)))(
            kernel, logdensity, positions, keys
        )
    fn = enn.ensemble_map(
        chain,
        mesh=mesh,
        in_roles=(None, None, enn.PER_CHAIN, enn.PER_CHAIN),
        out_roles=enn.PER_CHAIN,
    )
    return fn(kernel, logdensity, positions, keys)


# --- exact stationary laws of the discrete dynamics on a Gaussian --------------------------


def _stationary_cov(A, noise):
    """Solve S = A S A^T + noise noise^T (discrete Lyapunov) by vectorisation."""
    n = A.shape[0]
    q = np.outer(noise, noise)
    vec = np.linalg.solve(np.eye(n * n) - np.kron(A, A), q.reshape(-1))
    return vec.reshape(n, n)


def test_sgld_and_sghmc_have_the_exact_discrete_stationary_variance():
    """On a Gaussian with exact gradients both updates are linear, so their stationary
    variance is known in closed form; a wrong noise scale or drift would change it.

    SGLD: x' = (1 - eps/s^2) x + sqrt(2 eps) xi, Var = s^2 / (1 - eps / (2 s^2)).
    SGHMC: (x, v) is a 2-d linear recursion; Var x from the discrete Lyapunov equation.
    Chains start at (a draw from) the exact stationary law and run 60 steps; 4096 chains
    give a relative MC error of sqrt(2/4096) = 2.2% per dimension and per time step, and the
    time average over 60 correlated steps only reduces it. Tolerance: 8%.
    """
    n, steps, eps, eta, alpha = 4096, 60, 0.2, 0.05, 0.3
    z = jax.random.normal(jax.random.key(0), (n, SIGMA.size))

    sgld_var = SIGMA**2 / (1 - eps / (2 * SIGMA**2))
    kernel = samplers.SGLD(step_size=eps, batch_size=5, num_data=NUM_DATA)
    _, (positions, _) = run_chains(
        kernel, quadratic_minibatch, z * np.sqrt(sgld_var), jax.random.key(1), steps
    )
    var = np.asarray(jnp.mean(positions**2, axis=(0, 1)))
    np.testing.assert_allclose(var / sgld_var, 1.0, atol=0.08)
    # The check resolves the discretisation: in the narrowest dimension the discrete law's
    # variance is 1.67 s^2, far outside the tolerance around s^2.
    assert var[0] / SIGMA[0] ** 2 > 1.4

    sghmc_var = []
    for s in SIGMA:
        A = np.array([[1 - eta / s**2, 1 - alpha], [-eta / s**2, 1 - alpha]])
        sghmc_var.append(_stationary_cov(A, np.full(2, math.sqrt(2 * alpha * eta)))[0, 0])
    sghmc_var = np.array(sghmc_var)
    kernel = samplers.SGHMC(step_size=eta, batch_size=5, num_data=NUM_DATA, friction=alpha)
    _, (positions, _) = run_chains(
        kernel, quadratic_minibatch, z * np.sqrt(sghmc_var), jax.random.key(2), steps
    )
    var = np.asarray(jnp.mean(positions**2, axis=(0, 1)))
    np.testing.assert_allclose(var / sghmc_var, 1.0, atol=0.08)


def test_sghmc_with_unit_friction_is_sgld():
    """friction=1 drops the momentum memory: v = eta g + sqrt(2 eta) xi, x += v, i.e. SGLD
    with step eta, driven by the same noise (same key splits)."""
    x0 = jnp.array([1.0, -2.0, 0.5])
    sgld = samplers.SGLD(step_size=0.05, batch_size=5, num_data=NUM_DATA)
    sghmc = samplers.SGHMC(step_size=0.05, batch_size=5, num_data=NUM_DATA, friction=1.0)
    a = sgld.init(quadratic_minibatch, x0, jax.random.key(0))
    b = sghmc.init(quadratic_minibatch, x0, jax.random.key(0))
    for t in range(5):
        a, _ = sgld.step(quadratic_minibatch, a, jax.random.key(10 + t))
        b, _ = sghmc.step(quadratic_minibatch, b, jax.random.key(10 + t))
    np.testing.assert_allclose(a.position, b.position, rtol=1e-5, atol=1e-6)


# --- schedules, minibatches, divergences ----------------------------------------------------

SCHEDULES = {
    "cosine": optax.cosine_decay_schedule(1e-2, 12, alpha=0.1),
    "polynomial": optax.polynomial_schedule(1e-2, 1e-3, power=0.55, transition_steps=12),
    "cyclical": optax.sgdr_schedule(
        [dict(init_value=0.0, peak_value=1e-2, warmup_steps=1, decay_steps=4, end_value=1e-4)] * 3
    ),
}


@pytest.mark.parametrize(
    "kernel_name,schedule_name",
    [("SGLD", "cosine"), ("SGLD", "polynomial"), ("SGLD", "cyclical"), ("SGHMC", "cosine")],
)
def test_step_size_follows_the_schedule_exactly(kernel_name, schedule_name, explicit_mesh):
    """`Info.step_size` at step t is `schedule(t)`: bitwise equal to the schedule evaluated
    in the same compiled program at the count the step used, and within float32 rounding
    of eager evaluation (XLA evaluates `cos`/`pow` slightly differently inside a fused
    program; near the end of the cosine decay `1 + cos` cancels, so a few ulp: rtol 1e-6)."""
    schedule = SCHEDULES[schedule_name]
    kernel = getattr(samplers, kernel_name)(step_size=schedule, batch_size=5, num_data=NUM_DATA)
    steps, n = 12, 8
    state, (used, expected_in_program) = run_chains(
        kernel,
        quadratic_minibatch,
        jnp.zeros((n, 3)),
        jax.random.key(3),
        steps,
        mesh=explicit_mesh,
        record=lambda s, info: (info, jnp.asarray(schedule(s.count - 1), jnp.float32)),
    )
    np.testing.assert_array_equal(used.step_size, expected_in_program)
    expected = np.array([schedule(t) for t in range(steps)], np.float32)
    np.testing.assert_allclose(
        used.step_size, np.broadcast_to(expected, (n, steps)), rtol=1e-6, atol=0
    )
    np.testing.assert_array_equal(state.count, steps)
    np.testing.assert_array_equal(used.num_grads, 1)
    np.testing.assert_array_equal(used.acceptance_rate, 1.0)


@pytest.mark.parametrize("replace", [True, False])
def test_each_chain_draws_its_own_valid_minibatch(replace):
    kernel = samplers.SGLD(step_size=1e-3, batch_size=20, num_data=50, replace=replace)
    keys = jax.random.split(jax.random.key(4), 8)
    batches = np.asarray(jax.vmap(kernel.batch_indices)(keys))
    assert batches.shape == (8, 20)
    assert batches.min() >= 0 and batches.max() < 50
    assert len({tuple(b) for b in batches}) == 8  # different chains, different batches
    if not replace:
        assert all(len(set(b)) == 20 for b in batches)


def test_nonfinite_updates_are_reverted_and_flagged():
    def logdensity(x, indices):  # NaN beyond |x| = 3
        value = -0.5 * jnp.sum(x**2) + 0.0 * indices.sum()
        return jnp.where(jnp.abs(x[0]) < 3.0, value, jnp.nan)

    x0 = jnp.array([2.9, 0.0])
    for kernel in [
        samplers.SGLD(step_size=50.0, batch_size=4, num_data=10),
        samplers.SGHMC(step_size=50.0, batch_size=4, num_data=10, friction=1.0),
    ]:
        state = kernel.init(logdensity, x0, jax.random.key(0))
        new, info = kernel.step(logdensity, state, jax.random.key(1))
        assert bool(info.is_divergent) and float(info.acceptance_rate) == 0.0
        np.testing.assert_array_equal(new.position, x0)
        assert int(new.count) == 1
        assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(new))


def test_pytree_parameters_are_ravelled_outside_the_kernel():
    """A pytree of parameters (as in an equinox MLP) is sampled as its flat vector."""
    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    flat, unravel = ravel_pytree(params)

    def logdensity(x, indices):
        p = unravel(x)
        return -0.5 * (jnp.sum(p["w"] ** 2) + jnp.sum(p["b"] ** 2)) + 0.0 * indices.sum()

    kernel = samplers.SGHMC(step_size=1e-2, batch_size=4, num_data=10)
    state = kernel.init(logdensity, flat, jax.random.key(0))
    state, _ = kernel.step(logdensity, state, jax.random.key(1))
    sampled = unravel(state.position)
    assert sampled["w"].shape == (3, 2) and sampled["b"].shape == (2,)


# --- through the driver: Bayesian logistic regression, 256 chains on the mesh --------------

NUM_CHAINS = 256


@pytest.fixture(scope="module")
def logistic():
    """1000 x 10 logistic regression and its reference moments (importance sampling,
    20k draws: the reference mean's own error is ~0.01 posterior sd)."""
    target = samplers.targets.LogisticRegression(num_data=1000, num_features=10)
    reference = target.compute_reference(20_000, jax.random.key(0))
    positions = jax.vmap(target.initial_position)(jax.random.split(jax.random.key(1), NUM_CHAINS))
    return target, reference, positions


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SGLD", "SGHMC"])
def test_sg_mcmc_posterior_mean_on_logistic_regression(name, logistic, explicit_mesh):
    """Budget: 50 warmup + 150 sampling steps, one minibatch gradient each (batch 100 of
    1000 data), from prior draws, step size cosine-decayed by 10x over the 200 steps
    (SGLD from 1e-2, SGHMC learning rate from 1e-3 with friction 0.1).

    Asserts: every posterior mean within 0.15 posterior sd of the reference (observed
    ~0.05), and every posterior sd within [0.9, 1.5] x the reference (observed ~1.2: the
    minibatch noise at a finite step inflates the spread; a kernel that only optimised, or
    sampled a much wider law, fails).
    """
    target, reference, positions = logistic
    schedule = optax.cosine_decay_schedule(1.0, 200, alpha=0.1)
    if name == "SGLD":
        kernel = samplers.SGLD(
            step_size=lambda t: 1e-2 * schedule(t), batch_size=100, num_data=target.num_data
        )
    else:
        kernel = samplers.SGHMC(
            step_size=lambda t: 1e-3 * schedule(t),
            batch_size=100,
            num_data=target.num_data,
            friction=0.1,
        )
    result = samplers.run(
        kernel,
        target.minibatch_logdensity,
        positions,
        key=jax.random.key(2),
        num_warmup=50,
        num_steps=150,
        mesh=explicit_mesh,
        chunk_size=50,
        progress=False,
    )
    ref_sd = jnp.sqrt(reference.second_moment - reference.mean**2)
    mean_error = jnp.abs(result.diagnostics.mean - reference.mean) / ref_sd
    assert float(mean_error.max()) < 0.15, mean_error
    sd_ratio = np.asarray(result.diagnostics.sd / ref_sd)
    assert np.all((sd_ratio > 0.9) & (sd_ratio < 1.5)), sd_ratio
    assert int(jnp.sum(result.num_divergent)) == 0
    np.testing.assert_array_equal(result.num_grads, 200)
    # A minibatch's log density is an estimate: no per-draw value is reported.
    assert result.trace is not None and result.draw_logdensity is None
