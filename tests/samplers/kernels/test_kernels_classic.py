"""The classic kernels RandomWalk, MALA, HMC and GHMC (the leapfrog integrator:
tests/samplers/integrators/test_leapfrog.py).

Exactness: chains started from exact draws of a correlated 2-d Gaussian must stay exact
after K transitions of a correct kernel. With N independent chains each final moment has
a known Monte Carlo standard error, so every moment is checked as a z-score |z| < 5 (keys
are fixed; a correct kernel lands near |z| ~ 1-2). Deliberately broken kernels (MALA
without its proposal correction, HMC drawing momenta from the wrong covariance) land at
|z| ~ 30 with these settings, and the tests assert that they fail the same check.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ensemblenn as enn
import samplers
from samplers.integrators import kinetic_energy, leapfrog, sample_momentum, value_and_grad

COV = jnp.array([[1.0, 0.8], [0.8, 2.0]])
PRECISION = jnp.linalg.inv(COV)
NUM_EXACT = 4096  # chains in the exactness tests: the standard error of E[x x^T] is ~2%


def gaussian(x):
    return -0.5 * x @ PRECISION @ x


def quartic(x):
    """A non-Gaussian log-density with a non-linear gradient."""
    return -0.25 * jnp.sum(x**4) - 0.5 * jnp.sum(x**2) + 0.3 * x[0] * x[-1]


def _chains(kernel, logdensity, position, key, num_steps):
    k_init, k_steps = jax.random.split(key)
    state = kernel.init(logdensity, position, k_init)
    return jax.lax.scan(
        lambda s, k: kernel.step(logdensity, s, k), state, jax.random.split(k_steps, num_steps)
    )


_run_chains = enn.ensemble_map(
    _chains, in_roles=(None, None, enn.PER_CHAIN, enn.PER_CHAIN, None), out_roles=enn.PER_CHAIN
)


def run_chains(kernel, logdensity, positions, key, num_steps):
    """`num_steps` transitions of independent chains, sharded over the 4 devices by
    `ensemble_map` (a `PerChainValue` hyperparameter gives each chain its entry).

    Returns the final states `(chains, ...)` and every step's `Info`, `(chains, steps)`.
    """
    keys = enn.chain_keys(key, positions.shape[0])
    return _run_chains(kernel, logdensity, positions, keys, num_steps)


def moment_z_scores(x):
    """z-scores of the sample mean and of E[x_i x_j] (i <= j) against the exact values."""
    x, cov = np.asarray(x, np.float64), np.asarray(COV, np.float64)
    n = x.shape[0]
    z_mean = x.mean(0) / np.sqrt(np.diag(cov) / n)
    products = x[:, :, None] * x[:, None, :]
    z_second = (products.mean(0) - cov) / (products.std(0) / np.sqrt(n))
    return np.concatenate([z_mean, z_second[np.triu_indices(2)]])


class MALANoCorrection(samplers.MALA):
    """Wrong on purpose: treats the Langevin proposal as if it were symmetric."""

    def log_proposal_density(self, to, start, grad_start, count):
        return jnp.zeros(())


class HMCWrongMomentum(samplers.HMC):
    """Wrong on purpose: momenta from N(0, M^{-1}) instead of N(0, M)."""

    def momentum(self, position, count, key):
        return sample_momentum(position, PRECISION, key)  # used with inverse mass = COV


SCHEDULE = optax.linear_schedule(2.0, 0.8, transition_steps=6, transition_begin=2)
GHMC_SCHEDULE = optax.linear_schedule(1.2, 0.6, transition_steps=20)
PER_CHAIN_STEP = jnp.linspace(0.3, 0.8, NUM_EXACT)  # HMC step size of each chain

# name: (kernel, steps, step size chain c used at step t, gradients per step)
EXACT = {
    "random_walk_schedule": (
        samplers.RandomWalk(step_size=SCHEDULE),
        10,
        lambda t, c: SCHEDULE(t),
        0,
    ),
    "mala": (samplers.MALA(step_size=0.9), 10, lambda t, c: 0.9, 1),
    "hmc_dense_per_chain": (
        samplers.HMC(
            step_size=enn.PerChainValue(PER_CHAIN_STEP),
            num_integration_steps=5,
            inverse_mass_matrix=COV,
            jitter=False,  # the fixed path: exactly 5 gradients per step
        ),
        10,
        lambda t, c: PER_CHAIN_STEP[c],
        5,
    ),
    "hmc_diag_jitter": (
        samplers.HMC(
            step_size=0.5, num_integration_steps=5, inverse_mass_matrix=jnp.diag(COV), jitter=True
        ),
        10,
        lambda t, c: 0.5,
        None,
    ),
    "ghmc_dense_schedule": (
        samplers.GHMC(step_size=GHMC_SCHEDULE, momentum_persistence=0.8, inverse_mass_matrix=COV),
        20,
        lambda t, c: GHMC_SCHEDULE(t),
        1,
    ),
}


@pytest.fixture(scope="module")
def exact_draws():
    return jax.random.multivariate_normal(jax.random.key(0), jnp.zeros(2), COV, (NUM_EXACT,))


@pytest.mark.parametrize("name", list(EXACT))
def test_kernel_keeps_exact_draws_exact(name, exact_draws):
    """Moments stay exact; the reported Info and stored state are truthful."""
    kernel, num_steps, step_size, grads = EXACT[name]
    state, info = run_chains(kernel, gaussian, exact_draws, jax.random.key(1), num_steps)
    z = moment_z_scores(state.position)
    assert np.abs(z).max() < 5, (name, z)
    # ... and the chains did move (an always-rejecting kernel would pass trivially).
    assert 0.3 < float(info.acceptance_rate.mean()) < 1.0
    assert np.mean(np.any(np.asarray(state.position) != np.asarray(exact_draws), axis=1)) > 0.9
    assert np.all(np.asarray(state.count) == num_steps)
    assert not np.any(np.asarray(info.is_divergent))
    # The step size each chain actually used at each step (schedules, per-chain values).
    t, c = np.meshgrid(np.arange(num_steps), np.arange(NUM_EXACT))
    expected = np.asarray(jax.jit(jax.vmap(jax.vmap(step_size)))(t, c))
    np.testing.assert_allclose(info.step_size, expected.astype(np.float32), rtol=1e-6)
    n = np.asarray(info.num_grads)
    if grads is None:  # jittered: uniform on {1, ..., 2 * 5 - 1}, mean 5
        assert set(np.unique(n).tolist()) == set(range(1, 10)) and abs(n.mean() - 5) < 0.1
    else:
        assert np.all(n == grads) and kernel.grads_per_step == grads
    # The state's log-density and gradient are those of its position (no stale cache).
    logp, grad = jax.vmap(value_and_grad(gaussian))(state.position)
    np.testing.assert_allclose(state.logdensity, logp, rtol=1e-5, atol=1e-6)
    if grads != 0:
        np.testing.assert_allclose(state.grad, grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kernel",
    [
        MALANoCorrection(step_size=0.9),
        HMCWrongMomentum(step_size=0.5, num_integration_steps=5, inverse_mass_matrix=COV),
    ],
    ids=["mala_no_correction", "hmc_wrong_momentum"],
)
def test_exactness_check_catches_a_wrong_acceptance_ratio(kernel, exact_draws):
    state, _ = run_chains(kernel, gaussian, exact_draws, jax.random.key(1), 10)
    z = moment_z_scores(state.position)
    assert np.abs(z).max() > 10, z


def test_mala_correction_equals_one_step_hmc_energy_error():
    """MALA's asymmetric correction is exactly the kinetic-energy change of one leapfrog
    step with unit mass (on a non-Gaussian target), and its proposal is that step."""

    @jax.jit
    def both(key):
        kx, kz = jax.random.split(key)
        x = jax.random.normal(kx, (5,))
        mala, vg = samplers.MALA(step_size=0.7), value_and_grad(quartic)
        logp, grad = vg(x)
        proposed = mala.proposal(x, grad, jnp.int32(0), kz)
        momentum = jax.random.normal(kz, (5,))
        x1, p1, logp1, grad1 = leapfrog(vg, x, momentum, grad, 0.7, 1.0, 1)
        correction = mala.log_proposal_density(x, x1, grad1, 0) - mala.log_proposal_density(
            x1, x, grad, 0
        )
        kinetic_change = kinetic_energy(momentum, 1.0) - kinetic_energy(p1, 1.0)
        return proposed, x1, correction, kinetic_change

    proposed, x1, correction, kinetic_change = both(jax.random.key(3))
    np.testing.assert_allclose(proposed, x1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(correction, kinetic_change, rtol=1e-4, atol=1e-5)


def test_rejection_keeps_the_state_and_reports_a_divergence():
    """A step far too large: every kernel rejects, keeps position, log-density and gradient,
    counts the step, and flags the divergence; GHMC reverses its momentum."""

    def nan_outside(x):  # NaN beyond |x| > 3 (a broken model): must be a rejection
        return jnp.where(jnp.all(jnp.abs(x) < 3), -0.5 * jnp.sum(x**2), jnp.nan)

    x = jnp.full((4,), 0.5)
    kernels = [
        samplers.RandomWalk(step_size=1e3),
        samplers.MALA(step_size=50.0),
        samplers.HMC(step_size=50.0, num_integration_steps=3),
        samplers.GHMC(step_size=50.0, momentum_persistence=1.0),
    ]
    cases = [(k, nan_outside) for k in kernels]
    cases.append((kernels[2], lambda z: -0.5 * jnp.sum(z**2)))  # finite, energy error > 1000

    @jax.jit
    def one_step_each():
        out = []
        for kernel, logdensity in cases:
            state = kernel.init(logdensity, x, jax.random.key(0))
            out.append((state, *kernel.step(logdensity, state, jax.random.key(1))))
        return out

    for (kernel, _), (state, new, info) in zip(cases, one_step_each()):
        name = type(kernel).__name__
        assert bool(info.is_divergent), name
        assert float(info.acceptance_rate) == 0.0, name
        assert int(new.count) == 1
        np.testing.assert_array_equal(new.position, state.position)
        np.testing.assert_array_equal(new.logdensity, state.logdensity)
        if hasattr(state, "grad"):
            np.testing.assert_array_equal(new.grad, state.grad)
        if isinstance(kernel, samplers.GHMC):  # alpha = 1: refreshed momentum = old one
            np.testing.assert_array_equal(new.momentum, -state.momentum)


def test_ghmc_takes_exactly_one_of_persistence_and_damping():
    with pytest.raises(enn.EnsembleError, match="exactly one"):
        samplers.GHMC(step_size=0.1)
    with pytest.raises(enn.EnsembleError, match="exactly one"):
        samplers.GHMC(step_size=0.1, momentum_persistence=0.9, damping=1.0)
    alpha = samplers.GHMC(step_size=0.2, damping=2.0).persistence(0.2, 0)
    np.testing.assert_allclose(alpha, np.exp(-0.4), rtol=1e-6)


# --- through the driver, sharded over the 4-device mesh ------------------------------------

ILL = samplers.targets.IllConditionedGaussian(dim=10, condition_number=100.0)  # variances 1..100
X0 = jax.random.normal(jax.random.key(10), (256, 10))  # 256 chains, all started too narrow


class RecordingState(samplers.State):
    inner: samplers.State
    last: samplers.Info
    step_size_sum: jax.Array


class Recording(samplers.Sampler):
    """Test helper: runs `inner` and keeps its last `Info` and the running sum of the step
    sizes it reported, so a test can see what the driver's steps actually used."""

    inner: samplers.Sampler

    def init(self, logdensity, position, key):
        s = self.inner.init(logdensity, position, key)
        return RecordingState(
            s.position,
            s.logdensity,
            s.count,
            s,
            samplers.unadjusted_info(num_grads=0),
            jnp.float32(0),
        )

    def step(self, logdensity, state, key):
        s, info = self.inner.step(logdensity, state.inner, key)
        return RecordingState(
            s.position, s.logdensity, s.count, s, info, state.step_size_sum + info.step_size
        ), info


# name: (kernel, warmup steps, sampling steps, acceptance band)
TARGET_RUNS = {
    "random_walk": (samplers.RandomWalk(step_size=0.7), 500, 1000, (0.3, 0.9)),
    "mala": (samplers.MALA(step_size=1.3), 150, 300, (0.4, 0.95)),
    "hmc": (samplers.HMC(step_size=1.1, num_integration_steps=8, jitter=True), 30, 70, (0.4, 0.95)),
    "ghmc": (samplers.GHMC(step_size=1.0, damping=0.1), 150, 300, (0.4, 0.95)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TARGET_RUNS))
def test_reaches_ill_conditioned_gaussian(name, explicit_mesh):
    """10-d Gaussian, condition number 100, 256 chains from N(0, I): b² of E[x²] < 0.05."""
    kernel, warmup, steps, (low, high) = TARGET_RUNS[name]
    result = samplers.run(
        kernel,
        ILL,
        X0,
        key=jax.random.key(11),
        num_steps=steps,
        num_warmup=warmup,
        mesh=explicit_mesh,
        progress=False,
        chunk_size=steps,
    )  # one compiled chunk per phase
    assert float(result.diagnostics.bias_squared_max) < 0.05
    assert low < float(result.acceptance_rate.mean()) < high
    assert int(result.num_divergent.sum()) == 0
    assert np.all(np.asarray(result.state.count) == warmup + steps)
    grads = np.asarray(result.num_grads)
    expected = (warmup + steps) * (8 if name == "hmc" else kernel.grads_per_step)
    if name == "hmc":  # jittered lengths: only the mean is fixed
        assert abs(grads.mean() - expected) < 0.05 * expected
    else:
        assert np.all(grads == expected)


def test_per_chain_step_sizes_are_used_and_order_acceptance(explicit_mesh):
    step_sizes = jnp.geomspace(0.2, 3.0, 256)  # chain c uses step_sizes[c]
    kernel = Recording(samplers.MALA(step_size=enn.PerChainValue(step_sizes)))
    result = samplers.run(
        kernel,
        ILL,
        X0,
        key=jax.random.key(12),
        num_steps=100,
        mesh=explicit_mesh,
        progress=False,
        chunk_size=100,
    )
    np.testing.assert_allclose(result.state.last.step_size, step_sizes, rtol=1e-6)
    np.testing.assert_allclose(result.state.step_size_sum, 100 * step_sizes, rtol=1e-5)
    # Acceptance falls with the step size: means over 8 groups of 32 consecutive chains.
    acceptance = np.asarray(result.acceptance_rate).reshape(8, 32).mean(axis=1)
    assert np.all(np.diff(acceptance) < 0), acceptance
    assert acceptance[0] > 0.9 and acceptance[-1] < 0.3, acceptance


def test_optax_schedules_are_followed_through_run(explicit_mesh):
    step_size = optax.exponential_decay(1.0, transition_steps=10, decay_rate=0.5)
    num_integration_steps = optax.piecewise_constant_schedule(2.0, {25: 2.0})  # 2, then 4
    kernel = Recording(
        samplers.HMC(step_size=step_size, num_integration_steps=num_integration_steps,
                     jitter=False)  # the schedule's exact gradient count
    )  # fmt: skip
    result = samplers.run(
        kernel,
        ILL,
        X0,
        key=jax.random.key(13),
        num_steps=50,
        mesh=explicit_mesh,
        progress=False,
        chunk_size=50,
    )
    used = np.asarray(jax.vmap(step_size)(jnp.arange(50)), np.float32)
    np.testing.assert_allclose(result.state.last.step_size, np.full(256, used[-1]), rtol=1e-6)
    np.testing.assert_allclose(result.state.step_size_sum, np.full(256, used.sum()), rtol=1e-5)
    np.testing.assert_array_equal(result.num_grads, np.full(256, 25 * 2 + 25 * 4))


class MaskedWalk(samplers.RandomWalk):
    """A user's proposal: a random walk that moves only the coordinates where `mask` is 1
    (symmetric, so `log_proposal_correction` stays 0). A field without a default after the
    kernel's defaulted ones must be keyword-only (Python's dataclass rule)."""

    mask: jax.Array = eqx.field(kw_only=True)

    def proposal(self, position, count, key):
        step_size = samplers.resolve(self.step_size, count)
        return position + self.mask * step_size * jax.random.normal(key, position.shape)


def test_user_subclass_proposal_runs_sharded(mesh):
    mask = jnp.arange(10) < 5
    kernel = MaskedWalk(1.0, mask=mask.astype(jnp.float32))
    start = jax.vmap(ILL.sample)(jax.random.split(jax.random.key(15), 256))  # exact draws
    result = samplers.run(
        kernel,
        ILL,
        start,
        key=jax.random.key(14),
        num_steps=300,
        mesh=mesh,
        progress=False,
        chunk_size=300,
    )
    final = np.asarray(result.state.position)
    np.testing.assert_array_equal(final[:, 5:], np.asarray(start)[:, 5:])  # never proposed
    assert np.mean(final[:, :5] != np.asarray(start)[:, :5]) > 0.95
    assert 0.2 < float(result.acceptance_rate.mean()) < 0.9
    # The moved coordinates keep their exact marginals: b² of E[x²] < 0.05 on each.
    ref = ILL.reference
    b2 = (result.diagnostics.second_moment - ref.second_moment) ** 2 / ref.second_moment_var
    assert float(b2[:5].max()) < 0.05, b2
