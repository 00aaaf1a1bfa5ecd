"""The gradient-free ensemble moves Stretch and DifferentialEvolution.

Statistical checks use fixed keys and tolerances of several Monte Carlo standard errors
(stated per test). Structural checks use a flat 1-d target, where every stretch move is
accepted (`z^(d-1) = 1`), so one step's positions show exactly which walkers served as the
complementary set.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType

import ensemblenn as enn
import samplers

# A fixed correlated 5-d Gaussian: correlations up to ~0.8, variances 1 to ~4.5,
# condition number ~60.
_L = np.array(
    [
        [1.0, 0.0, 0.0, 0.0, 0.0],
        [0.9, 0.5, 0.0, 0.0, 0.0],
        [0.3, -0.5, 1.5, 0.0, 0.0],
        [0.0, 0.4, 0.2, 0.7, 0.0],
        [-0.6, 0.1, 0.3, 0.2, 2.0],
    ]
)
COV = _L @ _L.T
PRECISION = jnp.asarray(np.linalg.inv(COV), jnp.float32)
SD = np.sqrt(np.diag(COV))


def gaussian(x):
    return -0.5 * x @ PRECISION @ x


def flat(x):
    return 0.0 * x.sum()


class StretchWithoutJacobian(samplers.Stretch):
    """Wrong on purpose: drops the z^(d-1) factor of the acceptance ratio."""

    def proposal(self, jitter, u, position, ensemble, start, size, hyper):
        proposed, _ = super().proposal(jitter, u, position, ensemble, start, size, hyper)
        return proposed, jnp.zeros((), position.dtype)


def _gaussian_errors(sampler, mesh):
    """Errors of the ensemble's mean and covariance, in units of the target's scales.

    64 walkers started overdispersed and off-centre (N(1, 4 I), ignoring the correlations),
    500 warmup and 2000 sampling steps, a trace thinned by 5. The stretch move's
    integrated autocorrelation time here is ~50 steps, so ~2500 effective draws: the
    standard error of a mean is ~0.02 sd and of a covariance entry ~0.03 sd_i sd_j.
    """
    x0 = 1.0 + 2.0 * jax.random.normal(jax.random.key(0), (64, 5))
    result = samplers.run(
        sampler,
        gaussian,
        x0,
        key=jax.random.key(1),
        num_steps=2000,
        num_warmup=500,
        mesh=mesh,
        progress=False,
        thin=5,
        chunk_size=1250,
    )
    draws = np.asarray(result.trace).reshape(-1, 5)
    mean_error = np.abs(np.asarray(result.diagnostics.mean)) / SD
    cov_error = np.abs(np.cov(draws.T) - COV) / np.outer(SD, SD)
    return mean_error.max(), cov_error.max(), float(result.acceptance_rate.mean())


@pytest.mark.slow
@pytest.mark.parametrize(
    "sampler", [samplers.Stretch(a=2.0), samplers.DifferentialEvolution()], ids=["stretch", "de"]
)
def test_correlated_gaussian_moments(sampler, explicit_mesh):
    """Mean within 0.1 sd and covariance within 0.1 sd_i sd_j (~5 standard errors for the
    stretch move, more for DE, which mixes faster here; observed maxima 0.026 for Stretch,
    0.035 for DE)."""
    mean_error, cov_error, acceptance = _gaussian_errors(sampler, explicit_mesh)
    assert mean_error < 0.1
    assert cov_error < 0.1
    assert 0.2 < acceptance < 0.8


@pytest.mark.slow
def test_gaussian_check_catches_missing_jacobian(explicit_mesh):
    """The same check fails for a stretch move without its z^(d-1) factor, which shrinks
    the ensemble (observed covariance error 0.67), so the tolerance above has power."""
    _, cov_error, _ = _gaussian_errors(StretchWithoutJacobian(a=2.0), explicit_mesh)
    assert cov_error > 0.3


@pytest.mark.slow
@pytest.mark.parametrize(
    "sampler", [samplers.Stretch(a=2.0), samplers.DifferentialEvolution()], ids=["stretch", "de"]
)
def test_rosenbrock_moments(sampler, explicit_mesh):
    """Rosenbrock with 2 pairs (dim 4, Q = 0.1) against its exact moments.

    The walkers start from exact draws: the thin Q = 0.1 banana is far from affine, and
    differential evolution (acceptance ~0.1 there) needs ~10^5 steps to forget an
    overdispersed start, too slow for a unit test; convergence from a bad start is the
    Gaussian test's job. That the walkers really moved is checked by the correlation
    between first and last positions across walkers: |corr| < 0.4 (a stuck kernel gives
    ~1).
    Tolerances: b² of the second moments (the MCLMC/LAPS benchmarks' metric,
    (E[x²] error)² / Var[x²]) below 0.01, the usual "converged" threshold; means within
    0.1 for x (E = 1, sd 1) and 0.3 for y (E = 2, sd ~2.5). Observed: b² 8e-4 (Stretch)
    and 3e-4 (DE), mean errors <= 0.07, |corr| <= 0.06.
    """
    target = samplers.targets.Rosenbrock(num_pairs=2)
    x0 = jax.vmap(target.sample)(jax.random.split(jax.random.key(2), 256))
    result = samplers.run(
        sampler,
        target,
        x0,
        key=jax.random.key(3),
        num_steps=4000,
        num_warmup=1000,
        mesh=explicit_mesh,
        progress=False,
    )
    d = result.diagnostics
    assert float(d.bias_squared_max) < 0.01
    error = np.abs(np.asarray(d.mean) - np.asarray(target.reference.mean))
    assert (error < np.array([0.1, 0.1, 0.3, 0.3])).all(), error
    first, last = np.asarray(x0), np.asarray(result.state.position)
    corr = [np.corrcoef(first[:, i], last[:, i])[0, 1] for i in range(4)]
    assert np.max(np.abs(corr)) < 0.4, corr


BLOCKS = jnp.repeat(jnp.array([0.0, 1.0, 3.0, 7.0]), 4)[:, None]
"""16 walkers in 1-d, all of device `b` (of 4) at the `b`-th value: walkers 0-7 (the first
half) on devices 0-1 at 0 and 1, walkers 8-15 on devices 2-3 at 3 and 7."""


def _first_step_everywhere(sampler, meshes):
    """Five steps of `sampler` on `flat` from `BLOCKS` on each mesh. Checks that the traces
    agree bitwise, on the Explicit and Auto 4-device meshes (same key, same draws) and
    on fewer devices too (blocked per-walker arithmetic), then returns the positions
    before and after the first step (1-d)."""
    traces = [
        np.asarray(
            samplers.run(
                sampler,
                flat,
                BLOCKS,
                key=jax.random.key(4),
                num_steps=5,
                mesh=m,
                progress=False,
                thin=1,
            ).trace
        )[..., 0]
        for m in meshes
    ]
    assert traces[0].shape == (16, 5)
    np.testing.assert_array_equal(traces[0], traces[1])
    for other in traces[2:]:
        np.testing.assert_array_equal(traces[0], other)
    return np.asarray(BLOCKS)[:, 0], traces[0][:, 0]


def test_stretch_uses_the_other_half_of_the_whole_ensemble(explicit_mesh, auto_mesh):
    """Each device holds one point, so a complement drawn from the local shard would give
    `x - x_j = 0` and no move at all. Every walker moves (a flat 1-d target accepts every
    stretch), and each first-half walker's new position is `x_j + z (x - x_j)` with `z`
    in [1/a, a] for some `x_j` of the second half (devices 2-3); each second-half walker's
    likewise for some *updated* first-half walker."""
    a = 2.0
    # Complements are chosen by global chain index, so 2 devices give the same draws.
    two = jax.make_mesh(
        (2,), ("chains",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:2]
    )
    x, y = _first_step_everywhere(samplers.Stretch(a=a), (explicit_mesh, auto_mesh, two))
    assert np.all(np.abs(y - x) > 1e-6), y

    def explained(y_i, x_i, complement):
        z = (y_i - complement) / (x_i - complement)
        return bool(np.any((z > 1 / a - 1e-4) & (z < a + 1e-4)))

    assert all(explained(y[i], x[i], x[8:]) for i in range(8))
    assert all(explained(y[i], x[i], y[:8]) for i in range(8, 16))


def test_differential_evolution_uses_the_other_half_of_the_whole_ensemble(explicit_mesh, auto_mesh):
    """With `sigma = 0`, `gamma = 1` a first-half walker moves by a difference of two
    second-half walkers, here 0 or ±4 (devices 2-3 sit at 3 and 7), and a second-half
    walker by a difference of two updated first-half walkers. A local-only complement
    (one point per device) would never move anything."""
    sampler = samplers.DifferentialEvolution(gamma=1.0, sigma=0.0)
    x, y = _first_step_everywhere(sampler, (explicit_mesh, auto_mesh))
    first, second = y[:8] - x[:8], y[8:] - x[8:]
    np.testing.assert_allclose(
        np.min(np.abs(first[:, None] - [-4.0, 0.0, 4.0]), axis=1), 0, atol=1e-6
    )
    assert np.any(first != 0) and np.any(second != 0)
    differences = (y[:8, None] - y[None, :8]).ravel()
    np.testing.assert_allclose(np.min(np.abs(second[:, None] - differences), axis=1), 0, atol=1e-5)


@pytest.mark.parametrize(
    "sampler", [samplers.Stretch(), samplers.DifferentialEvolution()], ids=["stretch", "de"]
)
@pytest.mark.parametrize("kind", [AxisType.Explicit, AxisType.Auto])
@pytest.mark.parametrize("devices,num_walkers", [(1, 5), (1, 2), (3, 9), (2, 2)])
def test_bad_walker_count(sampler, devices, num_walkers, kind):
    """An odd count or fewer than 4 walkers is refused at initialisation, by name, on one
    device and on several (counts that divide the mesh, so that ensemble_map itself lets
    them through: 9 walkers on 3 devices, 2 on 2)."""
    mesh = jax.make_mesh(
        (devices,), ("chains",), axis_types=(kind,), devices=jax.devices()[:devices]
    )
    with pytest.raises(
        enn.EnsembleError,
        match=rf"even number of walkers >= 4; got "
        rf"{num_walkers}",
    ):
        samplers.run(
            sampler,
            flat,
            jnp.zeros((num_walkers, 2)),
            key=jax.random.key(0),
            num_steps=1,
            mesh=mesh,
            progress=False,
        )


def test_bad_hyperparameters_and_step_outside_the_ensemble():
    with pytest.raises(enn.EnsembleError, match="a > 1"):
        samplers.Stretch(a=1.0)
    with pytest.raises(enn.EnsembleError, match="gamma > 0"):
        samplers.DifferentialEvolution(gamma=-0.5)
    with pytest.raises(enn.EnsembleError, match="sigma >= 0"):
        samplers.DifferentialEvolution(sigma=-1.0)
    with pytest.raises(enn.EnsembleError, match="a > 1"):
        samplers.Stretch(a=enn.PerChainValue(jnp.array([2.0, 0.5, 2.0, 2.0])))
    # init alone needs no ensemble; step does, and says so.
    kernel = samplers.Stretch()
    state = kernel.init(flat, jnp.zeros(2), jax.random.key(0))
    assert state.position.shape == (2,) and int(state.count) == 0
    with pytest.raises(enn.CollectiveError, match="outside a function run by ensemble_map"):
        kernel.step(flat, state, jax.random.key(1))


def _one_step(kernels, logdensity, position, key):
    """One step of each kernel from `position`; their `Info`s."""
    infos = []
    for kernel in kernels:
        state = kernel.init(logdensity, position, key)
        infos.append(kernel.step(logdensity, state, jax.random.fold_in(key, 1)))
    return infos


_one_step_all = enn.ensemble_map(
    _one_step, in_roles=(None, None, enn.PER_CHAIN, enn.PER_CHAIN), out_roles=enn.PER_CHAIN
)


def test_hyperparameters_per_chain_and_scheduled(explicit_mesh):
    """`a` as an `enn.PerChainValue` and `gamma` as an optax schedule reach each walker
    (reported as `Info.step_size`); DE's default gamma is 2.38 / sqrt(2 d); no gradients,
    the count advances."""
    a = enn.PerChainValue(jnp.linspace(1.5, 5.0, 8))
    kernels = (
        samplers.Stretch(a=a),
        samplers.DifferentialEvolution(gamma=optax.linear_schedule(0.7, 0.1, 10)),
        samplers.DifferentialEvolution(),
    )
    x0 = jax.random.normal(jax.random.key(8), (8, 5))
    with jax.set_mesh(explicit_mesh):
        steps = _one_step_all(kernels, gaussian, x0, enn.chain_keys(jax.random.key(9), 8))
    (state, stretch), (_, scheduled), (_, default) = steps
    np.testing.assert_allclose(stretch.step_size, a.value, rtol=1e-6)
    np.testing.assert_allclose(scheduled.step_size, 0.7, rtol=1e-6)
    np.testing.assert_allclose(default.step_size, 2.38 / np.sqrt(10.0), rtol=1e-6)
    assert state.count.tolist() == [1] * 8
    for info in (stretch, scheduled, default):
        assert (info.num_grads == 0).all() and not info.is_divergent.any()
        assert ((info.acceptance_rate >= 0) & (info.acceptance_rate <= 1)).all()


@pytest.mark.parametrize("num_walkers", [64, 20])
@pytest.mark.parametrize(
    "sampler",
    [samplers.Stretch(a=2.0), samplers.DifferentialEvolution(sigma=0.1)],
    ids=["stretch", "de"],
)
def test_bitwise_on_1_2_4_devices(sampler, num_walkers):
    """Forty steps of 64 walkers on the 20-d ill-conditioned Gaussian (a log density with
    a reduction, so a change of batch width could change its last bits, and DE with a
    jitter large enough to matter) give bitwise identical traces on 1, 2 and 4 devices.
    With 20 walkers, 4 devices split a half of 10 unevenly (shares of 3, the last one
    clipped to walker 9), 2 devices evenly, 1 device takes it whole: the three ways a
    share is taken."""
    target = samplers.targets.IllConditionedGaussian(dim=20, condition_number=100.0)
    x0 = jax.vmap(target.sample)(jax.random.split(jax.random.key(5), num_walkers))
    traces = []
    for devices in (1, 2, 4):
        mesh = jax.make_mesh((devices,), ("chains",), devices=jax.devices()[:devices])
        result = samplers.run(
            sampler,
            target,
            x0,
            key=jax.random.key(6),
            num_steps=40,
            mesh=mesh,
            progress=False,
            thin=1,
        )
        traces.append(np.asarray(result.trace))
    assert not np.array_equal(traces[0][:, 0], traces[0][:, -1])  # the walkers moved
    np.testing.assert_array_equal(traces[0], traces[1])
    np.testing.assert_array_equal(traces[0], traces[2])
