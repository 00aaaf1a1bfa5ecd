"""ChEES-HMC and MEADS: ensemble adaptation of HMC and GHMC on 4 simulated devices.

Budgets (fixed keys, chains started at the origin):
* target: `IllConditionedGaussian(dim=50, condition_number=1000)` (variances 1 .. 1000);
* ChEES: 64 chains, 200 adaptation steps, then 200 sampling steps;
* MEADS: 64 chains (4 folds of 16), 200 adaptation steps, then 200 sampling steps.
Runs with equal settings share their compilations (about 3-10 s of CPU per new one); a
run that compiles nothing takes about a second.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType

import ensemblenn as enn
import samplers
from samplers.adaptation.chees import van_der_corput

DIM, CONDITION, CHAINS, ADAPT, SAMPLE = 50, 1000.0, 64, 200, 200
TARGET = samplers.targets.IllConditionedGaussian(dim=DIM, condition_number=CONDITION)
START = np.zeros((CHAINS, DIM), np.float32)


def _mesh(kind):
    return jax.make_mesh((4,), ("chains",), axis_types=(kind,))


# One adaptation object per scheme: runs with equal settings share their compilations.
ADAM = samplers.ChEES(optax.adam(0.025), num_steps=ADAPT)
MEADS = samplers.MEADS(num_steps=ADAPT)


def _chees(adaptation, mesh, positions=START):
    return samplers.run(
        samplers.HMC(step_size=0.1, num_integration_steps=2),
        TARGET,
        positions,
        key=jax.random.key(0),
        num_steps=SAMPLE,
        mesh=mesh,
        progress=False,
        adaptation=adaptation,
    )


def _meads(mesh, positions=START):
    return samplers.run(
        samplers.GHMC(step_size=0.1, damping=1.0),
        TARGET,
        positions,
        key=jax.random.key(1),
        num_steps=SAMPLE,
        mesh=mesh,
        progress=False,
        adaptation=MEADS,
    )


def _trajectory_length(hmc):
    return float(hmc.step_size * hmc.num_integration_steps)


def _leaves_finite(tree):
    leaves = jax.tree.leaves(tree)
    assert leaves
    return all(bool(np.all(np.isfinite(np.asarray(leaf)))) for leaf in leaves)


@pytest.fixture(scope="module")
def chees_adam():
    """ChEES with Adam on the Explicit 4-device mesh (shared by three tests)."""
    return _chees(ADAM, _mesh(AxisType.Explicit))


@pytest.fixture(scope="module")
def meads_result():
    return _meads(_mesh(AxisType.Explicit))


# -- fast checks ------------------------------------------------------------------------


def test_halton_jitter_is_the_base_2_radical_inverse():
    values = [float(van_der_corput(jnp.int32(i))) for i in range(1, 8)]
    assert values == [0.5, 0.25, 0.75, 0.125, 0.625, 0.375, 0.875]


def test_wrong_kernel_or_arguments_raise_ensemble_errors(auto_mesh):
    with pytest.raises(enn.EnsembleError, match="samplers.HMC"):
        samplers.run(
            samplers.MALA(step_size=0.1),
            TARGET,
            START[:8],
            key=jax.random.key(0),
            num_steps=2,
            mesh=auto_mesh,
            progress=False,
            adaptation=samplers.ChEES(num_steps=2),
        )
    with pytest.raises(enn.EnsembleError, match="samplers.GHMC"):
        samplers.run(
            samplers.HMC(step_size=0.1, num_integration_steps=2),
            TARGET,
            START[:8],
            key=jax.random.key(0),
            num_steps=2,
            mesh=auto_mesh,
            progress=False,
            adaptation=samplers.MEADS(num_steps=2),
        )
    with pytest.raises(enn.EnsembleError, match="at least 8 chains"):
        samplers.run(
            samplers.GHMC(step_size=0.1, damping=1.0),
            TARGET,
            START[:4],
            key=jax.random.key(0),
            num_steps=2,
            mesh=auto_mesh,
            progress=False,
            adaptation=samplers.MEADS(num_steps=2),
        )
    with pytest.raises(enn.EnsembleError, match="optax"):
        samplers.ChEES(optimizer=0.025)
    with pytest.raises(enn.EnsembleError, match="jitter"):
        samplers.ChEES(jitter=1.5)
    with pytest.raises(enn.EnsembleError, match="num_folds"):
        samplers.MEADS(num_folds=1)


# -- ChEES ------------------------------------------------------------------------------


@pytest.mark.slow
def test_chees_reaches_low_bias_on_the_ill_conditioned_gaussian(chees_adam):
    result = chees_adam
    assert float(result.diagnostics.bias_squared_max) < 0.05
    tuned = result.sampler
    assert isinstance(tuned, samplers.HMC) and tuned.jitter
    assert tuned.step_size.shape == () and tuned.num_integration_steps.shape == ()
    # The diagonal mass matrix found the variances (1 .. 1000) from the origin.
    ratio = np.asarray(tuned.inverse_mass_matrix) / np.asarray(TARGET.variances)
    assert ratio.shape == (DIM,) and np.all((ratio > 0.6) & (ratio < 1.6))
    # The trajectory length grew from 0.2 (2 steps of 0.1) and the step size is sane
    # for a (nearly) whitened target.
    assert 1.0 < _trajectory_length(tuned) < 10.0
    assert 0.3 < float(tuned.step_size) < 1.5
    assert 0.55 < float(jnp.mean(result.acceptance_rate)) < 0.95
    info = result.adaptation_info
    assert int(info.num_steps) == ADAPT and int(info.num_excluded) == 0
    assert int(info.num_grads) > ADAPT


@pytest.mark.slow
def test_chees_learns_with_any_optax_optimizer(chees_adam):
    # A learning rate halving every 50 steps: T stops growing earlier than with Adam
    # (about 1.9 against 2.5 with these keys; both sample well).
    schedule = optax.exponential_decay(0.01, transition_steps=50, decay_rate=0.5)
    sgd = _chees(samplers.ChEES(optax.sgd(schedule), num_steps=ADAPT), _mesh(AxisType.Explicit))
    assert float(sgd.diagnostics.bias_squared_max) < 0.05
    assert _leaves_finite(sgd.sampler)
    adam_length, sgd_length = (
        _trajectory_length(chees_adam.sampler),
        _trajectory_length(sgd.sampler),
    )
    assert sgd_length > 1.0  # SGD moved it too, from 0.2
    assert abs(adam_length - sgd_length) > 0.1 * adam_length, (adam_length, sgd_length)


@pytest.mark.slow
def test_chees_is_identical_on_explicit_and_auto_meshes(chees_adam):
    auto = _chees(ADAM, _mesh(AxisType.Auto))
    for a, b in zip(
        jax.tree.leaves((chees_adam.sampler, chees_adam.state)),
        jax.tree.leaves((auto.sampler, auto.state)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(
        np.asarray(chees_adam.diagnostics.second_moment), np.asarray(auto.diagnostics.second_moment)
    )


# -- MEADS ------------------------------------------------------------------------------


@pytest.mark.slow
def test_meads_reaches_low_bias_with_per_fold_hyperparameters(meads_result, explicit_mesh):
    result = meads_result
    assert float(result.diagnostics.bias_squared_max) < 0.05
    tuned = result.sampler
    assert isinstance(tuned, samplers.GHMC)
    eps, gamma = np.asarray(tuned.step_size.value), np.asarray(tuned.damping.value)
    imm = np.asarray(tuned.inverse_mass_matrix.value)
    assert eps.shape == (CHAINS,) and gamma.shape == (CHAINS,) and imm.shape == (CHAINS, DIM)
    folds = np.arange(CHAINS) % 4
    for k in range(4):  # one value per fold, broadcast to its chains
        assert np.all(eps[folds == k] == eps[folds == k][0])
        assert np.all(imm[folds == k] == imm[folds == k][0])
    assert len(np.unique(eps)) > 1  # folds are tuned from different folds' statistics
    assert np.all((eps > 0.05) & (eps < 2.0)) and np.all((gamma > 0.05) & (gamma < 5.0))
    # Each fold's preconditioner is a 16-chain variance estimate of 1 .. 1000.
    ratio = imm / np.asarray(TARGET.variances)
    assert np.all((ratio > 0.1) & (ratio < 10.0)) and 0.7 < np.median(ratio) < 1.3
    assert int(result.adaptation_info.num_excluded) == 0
    # The tuned sampler runs again as is (its PerChainValues are sharded per chain).
    again = samplers.run(
        tuned,
        TARGET,
        result.state.position,
        key=jax.random.key(2),
        num_steps=100,
        mesh=explicit_mesh,
        progress=False,
    )
    assert float(again.diagnostics.bias_squared_max) < 0.1
    assert float(jnp.mean(again.acceptance_rate)) > 0.6


# -- a diverging chain ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["chees", "meads"])
def test_a_diverging_chain_is_excluded_and_hyperparameters_stay_finite(scheme, explicit_mesh):
    start = START.copy()
    start[5] = 1e30  # finite, but its squared distance and log density overflow
    if scheme == "chees":
        result = _chees(ADAM, explicit_mesh, start)
        assert 0.3 < float(result.sampler.step_size) < 1.5
    else:
        result = _meads(explicit_mesh, start)
        assert np.all(np.asarray(result.sampler.step_size.value) > 0.05)
    assert _leaves_finite(result.sampler)
    info = result.adaptation_info
    # Left out of the initial statistics, then restarted at a healthy chain.
    assert int(info.num_excluded) >= 1 and int(info.num_restarted) == 1
    assert np.all(np.isfinite(np.asarray(result.state.position)))


# -- chains that start where the log density is -inf or NaN (small and fast) -------------

SMALL = samplers.targets.IllConditionedGaussian(dim=10, condition_number=10.0)
SMALL_CHAINS = 40  # 10 % is 4 chains; MEADS: 4 folds of 10


@functools.cache
def _cut(value):
    """SMALL, with `value` (-inf or NaN) where x[0] > 3 (prior mass 0.1 %). Cached: the
    clean and the bad runs share one function, hence one compilation."""

    def logdensity(x):
        return jnp.where(x[0] > 3.0, value, SMALL(x))

    return logdensity


def _small_start(num_bad):
    x = np.asarray(jax.random.normal(jax.random.key(0), (SMALL_CHAINS, 10))).copy()
    x[: num_bad * 7 : 7, 0] = 5.0  # every 7th chain starts outside the support
    return x


def _small_run(scheme, value, num_bad, mesh):
    if scheme == "chees":
        kernel = samplers.HMC(step_size=0.1, num_integration_steps=2)
        adaptation = samplers.ChEES(num_steps=100)
    else:
        kernel, adaptation = (
            samplers.GHMC(step_size=0.1, damping=1.0),
            samplers.MEADS(num_steps=100),
        )
    return samplers.run(
        kernel,
        _cut(value),
        _small_start(num_bad),
        key=jax.random.key(1),
        num_steps=100,
        mesh=mesh,
        progress=False,
        adaptation=adaptation,
        reference=SMALL.reference,  # the cut changes E[x0²] by 3 %: b² ~ 4e-4
    )


@pytest.mark.parametrize("value", [-jnp.inf, jnp.nan], ids=["-inf", "nan"])
@pytest.mark.parametrize("num_bad", [1, 4], ids=["1 chain", "10 %"])
@pytest.mark.parametrize("scheme", ["chees", "meads"])
def test_non_finite_starting_chains_are_excluded_counted_and_restarted(
    scheme, num_bad, value, explicit_mesh
):
    """Before the fix, one such chain made ChEES return step_size 0 and T = NaN (its
    acceptance 0 entered the harmonic mean) and inflated a MEADS fold's variance ~10x,
    with num_excluded 0. Now: counted, restarted, and the tuned hyperparameters are within
    2.5x (ChEES' step size and trajectory length) or a factor 2 (MEADS: 10-chain fold
    variances, ~45 % standard error) of the run without bad chains; every chain samples
    (b² of 40 chains x 100 draws ~ 0.005-0.01; 0.05 catches a frozen chain).

    ChEES' bound is 3 standard deviations of the log ratio, measured over keys 0-9 (1 bad
    chain, -inf): sd 0.32, ratios 0.54-1.28 (after 100 ChEES steps of 40 chains the step
    size's own log has sd 0.19 over keys); a 25 % bound held for one set of bits only. The
    bug it guards against gave a step size of 0 and T = NaN."""
    clean = _small_run(scheme, value, 0, explicit_mesh)
    result = _small_run(scheme, value, num_bad, explicit_mesh)
    assert int(clean.adaptation_info.num_excluded) == 0
    info = result.adaptation_info
    assert int(info.num_excluded) >= num_bad and int(info.num_restarted) == num_bad
    assert _leaves_finite(result.sampler)
    if scheme == "chees":
        ratio = float(result.sampler.step_size) / float(clean.sampler.step_size)
        assert 0.4 < ratio < 2.5, ratio
        # ChEES's trajectory length after 100 Adam steps depends on the start more (with
        # these keys 4 restarted chains, copies of healthy ones, give 0.6x the clean T).
        ratio = _trajectory_length(result.sampler) / _trajectory_length(clean.sampler)
        assert 0.4 < ratio < 2.5, ratio
    else:
        imm = np.asarray(result.sampler.inverse_mass_matrix.value)
        ratio = imm / np.asarray(clean.sampler.inverse_mass_matrix.value)
        assert np.all((ratio > 0.5) & (ratio < 2.0)), ratio.max()
        eps = np.asarray(result.sampler.step_size.value)
        assert np.all(np.isfinite(eps) & (eps > 0))
    assert np.all(np.isfinite(np.asarray(result.state.logdensity)))
    assert float(result.diagnostics.bias_squared_max) < 0.05


@pytest.mark.slow
@pytest.mark.xfail(
    jax.__version_info__ >= (0, 12, 1),
    reason="on JAX 0.12.1 (XLA:CPU) the first ChEES transition's proposals agree, but 18 of "
    "64 chains' acceptance probabilities differ in the last bits between 64 and 16 chains per "
    "device; cause not found: not a division (exact_divisions changes nothing), not the "
    "energy's sums (enn.ordered_sum for the kinetic energy and the target changes nothing)",
    strict=False,
)
def test_chees_is_bitwise_identical_on_1_and_4_devices():
    """100-d Gaussian, 64 chains (64 and 16 per device), block_size="auto": the tuned
    trajectory length, step size and final positions have the same bits. Before ChEES's
    per-chain sums over dimensions used enn.ordered_sum, the tuned values differed in the
    last bit (XLA rounds a 100-d jnp.sum differently for 64 and 16 chains per device).
    (MEADS: tests/samplers/adaptation/test_meads_invariance.py.)"""
    target = samplers.targets.IllConditionedGaussian(dim=100, condition_number=100.0)
    positions = jax.random.normal(jax.random.key(0), (64, 100))
    outs = []
    for n in (1, 4):
        mesh = jax.make_mesh((n,), ("chains",), devices=jax.devices()[:n])
        result = samplers.run(
            None,
            target,
            positions,
            key=jax.random.key(1),
            num_steps=10,
            adaptation=samplers.ChEES(num_steps=30),
            mesh=mesh,
            progress=False,
            block_size="auto",  # the bitwise mode (the default agrees to rounding)
        )
        outs.append(
            [np.asarray(leaf) for leaf in jax.tree.leaves(result.sampler)]
            + [np.asarray(result.state.position)]
        )
    assert len(outs[0]) == 4
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)
