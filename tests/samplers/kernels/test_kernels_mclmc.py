"""MCLMC and adjusted MCLMC (MAMS) (the isokinetic integrators:
tests/samplers/integrators/test_isokinetic.py).

The unit tests are chosen to fail if the math is wrong: the velocity flow is checked against
its ODE, the energy error against the integrators' orders, and the adjusted kernel against
exact invariance of a Gaussian (with a deliberately broken variant as a power check).
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ensemblenn as enn
import samplers

DIM = 10
SIGMA = jnp.logspace(-0.5, 0.5, DIM)  # standard deviations: condition number 10 in sd


def gaussian_logdensity(x):
    return -0.5 * jnp.sum((x / SIGMA) ** 2)


def run_chains(kernel, logdensity, positions, key, num_steps, mesh=None, record=None):
    """Run `num_steps` of `kernel` on every chain; returns (final states, stacked record).

    `record(state, info)` picks what to keep per step (default: the Info). With a mesh the
    chains go through `enn.ensemble_map`, else through `jax.vmap`.
    """
    record = record or (lambda state, info: info)

    def chain(kernel, logdensity, x, k):
        k_init, k_run = jax.random.split(k)
        state = kernel.init(logdensity, x, k_init)

        def body(s, kk):
            s, info = kernel.step(logdensity, s, kk)
            return s, record(s, info)

        return jax.lax.scan(body, state, jax.random.split(k_run, num_steps))

    keys = enn.chain_keys(key, positions.shape[0])
    if mesh is None:
        fn = eqx.filter_jit(jax.vmap(chain, in_axes=(None, None, 0, 0)))
    else:
        fn = enn.ensemble_map(
            chain,
            mesh=mesh,
            in_roles=(None, None, enn.PER_CHAIN, enn.PER_CHAIN),
            out_roles=enn.PER_CHAIN,
        )
    return fn(kernel, logdensity, positions, keys)


@pytest.mark.parametrize("name,order", [("leapfrog", 2), ("mclachlan", 2), ("omelyan", 4)])
def test_adjusted_energy_error_vanishes_at_the_integrator_order(name, order):
    """Fixed trajectory time T=2: halving the step divides the energy error by 2^order."""
    with jax.enable_x64(True):
        x0 = SIGMA * jax.random.normal(jax.random.key(3), (DIM,), jnp.float64)
        key = jax.random.key(4)  # same key: same initial velocity at every step size
        step = eqx.filter_jit(lambda kernel, state: kernel.step(gaussian_logdensity, state, key))
        errors = []
        for eps in [0.4, 0.2, 0.1, 0.05]:
            # Array hyperparameters are traced: one compilation serves every step size.
            kernel = samplers.AdjustedMCLMC(
                step_size=jnp.asarray(eps),
                num_integration_steps=jnp.asarray(round(2.0 / eps)),
                inverse_mass_matrix=SIGMA**2 * 1.3,
                integrator=name,
                jitter=False,  # the fixed trajectory time
            )
            _, info = step(kernel, kernel.init(gaussian_logdensity, x0, key))
            errors.append(abs(float(info.energy_change)))
        slopes = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert errors[-1] < 1e-3, errors
    np.testing.assert_allclose(slopes, order, atol=0.35, err_msg=f"errors {errors}")


# --- adjusted MCLMC: exact invariance -----------------------------------------------------


class _NoKineticTerm(samplers.AdjustedMCLMC):
    """A deliberately wrong MAMS that forgets the isokinetic kinetic-energy change."""

    def trajectory(self, *args):
        end, kinetic = super().trajectory(*args)
        return end, 0.0 * kinetic


NUM_INVARIANCE_CHAINS = 2048


def _invariance_statistics(kernel, mesh):
    """Start every chain at an exact draw of N(0, diag(SIGMA^2)), take 10 transitions.

    Returns z-scores: per-dimension means, per-dimension second moments, and the pooled
    second moment (sd of mean(z^2) over n*d i.i.d. draws is sqrt(2/(n*d))), plus the mean
    acceptance.
    """
    n = NUM_INVARIANCE_CHAINS
    x0 = SIGMA * jax.random.normal(jax.random.key(10), (n, DIM))
    final, info = run_chains(kernel, gaussian_logdensity, x0, jax.random.key(11), 10, mesh=mesh)
    z = np.asarray(final.position / SIGMA)
    z_mean = z.mean(0) * math.sqrt(n)
    z_second = ((z**2).mean(0) - 1.0) / math.sqrt(2.0 / n)
    z_pooled = ((z**2).mean() - 1.0) / math.sqrt(2.0 / (n * DIM))
    return z_mean, z_second, z_pooled, float(jnp.mean(info.acceptance_rate))


# A mismatched preconditioner (0.7x to 1.5x the true variances) exercises the metric.
IMM = SIGMA**2 * jnp.linspace(0.7, 1.5, DIM)


@pytest.mark.parametrize(
    "L_proposal_factor, jitter", [(math.inf, False), (1.25, False), (math.inf, True)]
)
def test_adjusted_mclmc_leaves_a_gaussian_invariant(explicit_mesh, L_proposal_factor, jitter):
    kernel = samplers.AdjustedMCLMC(
        step_size=5.0,
        num_integration_steps=5,
        inverse_mass_matrix=IMM,
        L_proposal_factor=L_proposal_factor,
        jitter=jitter,
    )
    z_mean, z_second, z_pooled, acceptance = _invariance_statistics(kernel, explicit_mesh)
    # The step is large enough that the Metropolis test matters (many rejections) ...
    assert 0.5 < acceptance < 0.95
    # ... and moments stay exact: |z| < 4.5 per dimension, < 4 pooled (fixed keys).
    assert np.abs(z_mean).max() < 4.5, z_mean
    assert np.abs(z_second).max() < 4.5, z_second
    assert abs(z_pooled) < 4.0, z_pooled


def test_adjusted_mclmc_jitter_draws_each_chains_length():
    """jitter=True (the default): every length in {1, ..., 9} for 5 steps (mean 5), each
    chain its own, and two gradients per McLachlan step counted per chain."""
    logdensity = lambda x: -0.5 * jnp.sum(x**2)  # noqa: E731
    x = jax.random.normal(jax.random.key(0), (4000, 3))
    keys = jax.random.split(jax.random.key(1), 4000)

    def one(kernel):
        def step(x, key):
            return kernel.step(logdensity, kernel.init(logdensity, x, key), key)

        return jax.vmap(step)(x, keys)

    jittered = samplers.AdjustedMCLMC(step_size=0.3, num_integration_steps=5)
    assert jittered.jitter
    _, info = one(jittered)
    steps = np.asarray(info.num_grads) // 2
    assert set(np.unique(steps).tolist()) == set(range(1, 10))
    assert abs(steps.mean() - 5) < 0.1 and jittered.grads_per_step == 10
    fixed = samplers.AdjustedMCLMC(step_size=0.3, num_integration_steps=5, jitter=False)
    _, info = one(fixed)
    np.testing.assert_array_equal(info.num_grads, 10)


def test_invariance_check_has_power_against_a_wrong_energy():
    """The same statistics flag a kernel that omits the kinetic-energy term (pooled z ~ -40)."""
    kernel = _NoKineticTerm(step_size=5.0, num_integration_steps=5, inverse_mass_matrix=IMM)
    _, _, z_pooled, _ = _invariance_statistics(kernel, None)
    assert abs(z_pooled) > 10.0, z_pooled


# --- unadjusted MCLMC ---------------------------------------------------------------------


@pytest.mark.parametrize("preconditioned", [True, False])
def test_mclmc_small_step_second_moments_are_close_to_exact(preconditioned):
    """Time-and-ensemble average of x^2 over 200 steps of 1024 chains, step 0.5, L=3."""
    n = 1024
    # Same array structure either way, so both cases share one compilation.
    kernel = samplers.MCLMC(
        step_size=0.5, L=3.0, inverse_mass_matrix=SIGMA**2 if preconditioned else jnp.ones(DIM)
    )
    x0 = SIGMA * jax.random.normal(jax.random.key(20), (n, DIM))
    _, (x2, energy) = run_chains(
        kernel,
        gaussian_logdensity,
        x0,
        jax.random.key(21),
        200,
        record=lambda s, info: (s.position**2, info.energy_change),
    )
    ratio = np.asarray(x2.mean((0, 1)) / SIGMA**2)
    # MC error of each ratio is ~0.01; the discretisation bias at this step is below that.
    # (A velocity flow using d instead of d-1 would be off by ~11%.)
    np.testing.assert_allclose(ratio, 1.0, atol=0.05)
    assert bool(jnp.all(jnp.isfinite(energy)))
    assert float(jnp.var(energy)) / DIM < 1e-3  # small energy error per dimension


def test_nonfinite_steps_are_reverted_and_flagged():
    def logdensity(x):  # NaN outside the ball of radius 3
        return jnp.where(jnp.sum(x**2) < 9.0, -0.5 * jnp.sum(x**2), jnp.nan)

    x0 = jnp.zeros(DIM).at[0].set(2.9)
    for kernel in [
        samplers.MCLMC(step_size=20.0, L=1.0),
        samplers.AdjustedMCLMC(step_size=20.0, num_integration_steps=3),
    ]:
        state = kernel.init(logdensity, x0, jax.random.key(0))
        new, info = kernel.step(logdensity, state, jax.random.key(1))
        assert bool(info.is_divergent)
        assert float(info.acceptance_rate) == 0.0
        assert float(info.energy_change) == 0.0
        np.testing.assert_array_equal(new.position, x0)
        assert int(new.count) == 1
        assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(new))


def test_hyperparameters_per_chain_and_schedules(mesh):
    """Per-chain values and optax schedules reach each chain's step, on both mesh kinds."""
    n, steps = 8, 4
    x0 = jax.random.normal(jax.random.key(30), (n, DIM))
    per_chain_eps = jnp.linspace(0.1, 0.8, n)
    per_chain_imm = jnp.ones((n, DIM)) * jnp.linspace(0.5, 1.5, n)[:, None]
    kernel = samplers.MCLMC(
        step_size=enn.PerChainValue(per_chain_eps),
        L=optax.linear_schedule(1.0, 3.0, steps),
        inverse_mass_matrix=enn.PerChainValue(per_chain_imm),
        integrator="leapfrog",
    )
    state, info = run_chains(kernel, gaussian_logdensity, x0, jax.random.key(31), steps, mesh=mesh)
    np.testing.assert_array_equal(info.step_size, jnp.repeat(per_chain_eps[:, None], steps, 1))
    np.testing.assert_array_equal(info.num_grads, 1)
    np.testing.assert_array_equal(state.count, steps)

    schedule = optax.cosine_decay_schedule(2.0, steps, alpha=0.25)
    num_steps = jnp.arange(1, n + 1)
    kernel = samplers.AdjustedMCLMC(
        step_size=schedule,
        num_integration_steps=enn.PerChainValue(num_steps),
        L_proposal_factor=1.25,
        jitter=False,  # each chain's exact number of steps
    )
    state, (info, in_program) = run_chains(
        kernel,
        gaussian_logdensity,
        x0,
        jax.random.key(32),
        steps,
        mesh=mesh,
        record=lambda s, info: (info, jnp.asarray(schedule(s.count - 1), jnp.float32)),
    )
    # Bitwise the schedule at the step's count; eager evaluation may differ by float32
    # rounding of the fused `cos`.
    np.testing.assert_array_equal(info.step_size, in_program)
    expected = np.array([schedule(t) for t in range(steps)], np.float32)
    np.testing.assert_allclose(
        info.step_size, np.broadcast_to(expected, (n, steps)), rtol=1e-6, atol=0
    )
    np.testing.assert_array_equal(info.num_grads, jnp.repeat(2 * num_steps[:, None], steps, 1))
    assert bool(jnp.all(jnp.isfinite(state.position)))


# --- through the driver: ill-conditioned Gaussian, 256 chains on the 4-device mesh --------

NUM_CHAINS = 256
GAUSSIAN = samplers.targets.IllConditionedGaussian(dim=10, condition_number=100.0)


def _initial_positions():
    # The target's default start: Gaussian with twice the target's standard deviations.
    keys = jax.random.split(jax.random.key(40), NUM_CHAINS)
    return jax.vmap(GAUSSIAN.initial_position)(keys)


@pytest.mark.slow
def test_mclmc_converges_on_ill_conditioned_gaussian(mesh):
    """Budget: 20 warmup + 50 sampling steps x 2 grads = 140 gradients per chain.

    Fixed step size 1.0 and L = 3 (~sqrt(d)) with the preconditioner equal to the known
    variances (so the whitened target is isotropic; the condition number is 100).
    """
    kernel = samplers.MCLMC(step_size=1.0, L=3.0, inverse_mass_matrix=GAUSSIAN.variances)
    result = samplers.run(
        kernel,
        GAUSSIAN,
        _initial_positions(),
        key=jax.random.key(41),
        num_warmup=20,
        num_steps=50,
        mesh=mesh,
        chunk_size=50,
        progress=False,
    )
    assert float(result.diagnostics.bias_squared_max) < 0.01  # stricter than 0.05
    np.testing.assert_array_equal(result.num_grads, 140)
    np.testing.assert_array_equal(result.num_divergent, 0)
    np.testing.assert_array_equal(result.state.count, 70)


@pytest.mark.slow
def test_adjusted_mclmc_converges_on_ill_conditioned_gaussian(explicit_mesh):
    """Budget: 10 warmup + 20 sampling transitions x 3 steps x 2 grads = 180 gradients.

    Fixed step size 5.0, 3 integration steps, preconditioner equal to the known variances,
    and Langevin noise inside the trajectory (L_proposal_factor=1.25). Without the noise this
    trajectory length (15) is about half a period of the whitened isotropic Gaussian, so each
    proposal nearly reflects x -> -x, x^2 barely changes, and chains started too wide stay
    too wide (b^2_max ~ 1.1 at this budget): the noise is what removes that resonance.
    """
    kernel = samplers.AdjustedMCLMC(
        step_size=5.0,
        num_integration_steps=3,
        inverse_mass_matrix=GAUSSIAN.variances,
        L_proposal_factor=1.25,
        jitter=False,  # the noise alone removes the resonance; an exact gradient budget
    )
    result = samplers.run(
        kernel,
        GAUSSIAN,
        _initial_positions(),
        key=jax.random.key(42),
        num_warmup=10,
        num_steps=20,
        mesh=explicit_mesh,
        chunk_size=20,
        progress=False,
    )
    assert float(result.diagnostics.bias_squared_max) < 0.01
    acceptance = float(jnp.mean(result.acceptance_rate))
    assert 0.6 < acceptance < 0.98, acceptance
    np.testing.assert_array_equal(result.num_grads, 180)
    assert int(jnp.sum(result.num_divergent)) == 0
