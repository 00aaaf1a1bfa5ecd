"""Deep ensembles and SG-MCMC on a small Bayesian MLP (`samplers.ensembles`), 4 devices.

Regression data: y = sin(3x) + N(0, 0.1²) at 64 points in [-1, 1]; the test error is
measured against the noiseless curve on a grid.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree
from jax.sharding import AxisType

import ensemblenn as enn
import samplers
from samplers import ensembles

NUM_DATA, NOISE, NUM_MEMBERS = 64, 0.1, 8
_rng = np.random.default_rng(0)
X = _rng.uniform(-1.0, 1.0, (NUM_DATA, 1)).astype(np.float32)
Y = (np.sin(3 * X) + NOISE * _rng.standard_normal((NUM_DATA, 1))).astype(np.float32)
X_TEST = np.linspace(-1.0, 1.0, 50, dtype=np.float32)[:, None]
Y_TEST = np.sin(3 * X_TEST)


def make_model(key):
    return eqx.nn.MLP(1, 1, 16, 2, activation=jax.nn.tanh, key=key)


def mse_loss(model, batch):
    x, y = batch
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def gaussian_loglik(model, batch):
    x, y = batch
    return -0.5 * jnp.sum((jax.vmap(model)(x) - y) ** 2, axis=-1) / NOISE**2


def member_losses(ensemble, mesh=None):
    """Full-data loss of every member, computed member by member."""
    return enn.ensemble_map(mse_loss, in_roles=(enn.PER_CHAIN, enn.BROADCAST), mesh=mesh)(
        ensemble.model, (X, Y)
    )


def flat_params(models):
    """(members, dim) numpy matrix of each member's floating-point parameters."""
    params = eqx.filter(models, eqx.is_inexact_array)
    leaves = [np.asarray(leaf).reshape(leaf.shape[0], -1) for leaf in jax.tree.leaves(params)]
    return np.concatenate(leaves, axis=1)


def snapshot(tree):
    return [np.array(leaf) for leaf in jax.tree.leaves(eqx.filter(tree, eqx.is_array))]


def assert_same_arrays(a, b):
    la, lb = snapshot(a), snapshot(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(x, y)


# --------------------------------------------------------------------------------------
# (a) deep ensembles trained with optax
# --------------------------------------------------------------------------------------

OPTIMIZER = optax.adam(1e-2)
TRAIN_STEPS = 150


@pytest.fixture(scope="module")
def trained():
    """The same ensemble trained on an Explicit and on an Auto 4-device mesh."""
    out = {}
    for kind in (AxisType.Explicit, AxisType.Auto):
        mesh = jax.make_mesh((4,), ("chains",), axis_types=(kind,))
        start = enn.init_ensemble(make_model, OPTIMIZER, jax.random.key(0), NUM_MEMBERS, mesh=mesh)
        before = snapshot(start)
        end, history = enn.fit(
            start,
            (X, Y),
            OPTIMIZER,
            mse_loss,
            num_steps=TRAIN_STEPS,
            batch_size=32,
            key=jax.random.key(1),
            mesh=mesh,
        )
        out[kind] = dict(mesh=mesh, start=start, start_snapshot=before, end=end, history=history)
    return out


def test_members_differ_and_every_member_learns(trained):
    run = trained[AxisType.Explicit]
    start, end, history = run["start"], run["end"], run["history"]
    assert end.num_members == NUM_MEMBERS
    assert history.shape == (NUM_MEMBERS, TRAIN_STEPS)

    # Different keys, different members, before and after training.
    for params in (flat_params(start.model), flat_params(end.model)):
        gaps = np.abs(params[:, None] - params[None]).max(-1)
        off_diagonal = gaps[~np.eye(NUM_MEMBERS, dtype=bool)]
        assert off_diagonal.min() > 1e-3, gaps

    # Every member's full-data loss fell, by a lot.
    loss_before = np.asarray(member_losses(start, run["mesh"]))
    loss_after = np.asarray(member_losses(end, run["mesh"]))
    for member in range(NUM_MEMBERS):
        assert loss_after[member] < 0.3 * loss_before[member], (member, loss_before, loss_after)
    # The loss history is the minibatch loss before each step: it fell too.
    assert (history[:, -10:].mean(1) < 0.3 * history[:, :10].mean(1)).all()

    # The ensemble prediction is the member average.
    members = eqx.filter_vmap(lambda m: jax.vmap(m)(X_TEST))(end.model)
    np.testing.assert_allclose(
        ensembles.predict(end, X_TEST, mesh=run["mesh"]),
        np.asarray(members).mean(0),
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.mark.parametrize("kind", [AxisType.Explicit, AxisType.Auto])
def test_ensemble_is_sharded_over_members(trained, kind):
    run = trained[kind]
    for part in (run["start"], run["end"]):
        leaves = jax.tree.leaves(eqx.filter(part, eqx.is_array))
        # Model and optimizer state both: adam's mu and nu per member, its count too.
        num_params = len(jax.tree.leaves(eqx.filter(part.model, eqx.is_array)))
        assert len(leaves) == 3 * num_params + 1
        for leaf in leaves:
            assert leaf.shape[0] == NUM_MEMBERS
            # P('chains'): Explicit meshes spell out the trailing dimensions as None.
            spec = tuple(leaf.sharding.spec)
            assert spec[0] == "chains" and all(s is None for s in spec[1:]), leaf.sharding
            assert len(leaf.sharding.device_set) == 4
            assert {s.data.shape[0] for s in leaf.addressable_shards} == {NUM_MEMBERS // 4}


def test_explicit_and_auto_meshes_train_identically(trained):
    explicit, auto = trained[AxisType.Explicit], trained[AxisType.Auto]
    assert_same_arrays(explicit["start"], auto["start"])
    assert_same_arrays(explicit["end"], auto["end"])
    np.testing.assert_array_equal(explicit["history"], auto["history"])


@pytest.mark.parametrize(
    "optimizer",
    [optax.sgd(0.05, momentum=0.9), optax.adam(1e-2), optax.rmsprop(1e-3)],
    ids=["sgd-momentum", "adam", "rmsprop"],
)
def test_training_gives_the_same_bits_on_1_2_and_4_devices(optimizer):
    """The default block_size ("auto") makes each member's training step the same program
    on any device count, and the optimizer's divisions are kept as written: without that,
    Adam's bias corrections were multiplied by a reciprocal on one device and folded into
    the denominator on two or more (XLA's CSE merges them only when partitioning), and the
    weights differed in the last bit after one step."""
    results = []
    for n in (1, 2, 4):
        mesh = jax.make_mesh((n,), ("chains",), devices=jax.devices()[:n])
        start = enn.init_ensemble(make_model, optimizer, jax.random.key(0), NUM_MEMBERS, mesh=mesh)
        results.append(
            enn.fit(
                start,
                (X, Y),
                optimizer,
                mse_loss,
                num_steps=50,
                batch_size=32,
                key=jax.random.key(1),
                mesh=mesh,
            )
        )
    for end, history in results[1:]:
        assert_same_arrays(end, results[0][0])
        np.testing.assert_array_equal(np.asarray(history), np.asarray(results[0][1]))


def test_exact_divisions_divide_as_written():
    """XLA rewrites `x / s / d` to `x / (s * d)` and (before JAX 0.12.1) `x / s` (scalar s)
    to `x * (1 / s)`; `exact_divisions` keeps both as written, so they match numpy's float32
    divisions."""
    exact_divisions = enn.exact_divisions

    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000).astype(np.float32)
    d = rng.uniform(1.0, 2.0, 1000).astype(np.float32)
    s = np.float32(0.37)
    # Every JAX we support rewrites the first; JAX 0.12.1's XLA:CPU stopped rewriting the
    # second, which exact_divisions must still leave as written.
    cases = ((lambda x, s, d: x / s / d, (x / s) / d, True), (lambda x, s, d: x / s, x / s, False))
    for fn, want, rewritten in cases:
        if rewritten:
            assert not np.array_equal(np.asarray(jax.jit(fn)(x, s, d)), want)  # XLA rewrites
        np.testing.assert_array_equal(np.asarray(jax.jit(exact_divisions(fn))(x, s, d)), want)
    # Non-array arguments and outputs pass through; integer division is left alone.
    out = exact_divisions(lambda x, k, name: (x // 2, k, name))(np.arange(5), 3, "n")
    np.testing.assert_array_equal(out[0], np.arange(5) // 2)
    assert out[1:] == (3, "n")


def test_training_leaves_its_inputs_alone(trained):
    # No donation, no in-place writes: the starting ensemble is intact and usable.
    for run in trained.values():
        for leaf, saved in zip(snapshot(run["start"]), run["start_snapshot"]):
            np.testing.assert_array_equal(leaf, saved)
    # The static parts (activation function, sizes) came through untouched.
    end = trained[AxisType.Explicit]["end"].model
    assert end.activation is jax.nn.tanh and end.width_size == 16 and end.depth == 2


def test_per_member_learning_rates(explicit_mesh):
    mesh = explicit_mesh
    rates = np.array([0.0, 1e-2, 1e-2, 5e-3, 2e-2, 1e-2, 0.0, 3e-3], np.float32)
    optimizer = optax.inject_hyperparams(optax.adam)(learning_rate=1e-2)
    hyperparams = {"learning_rate": enn.PerChainValue(jnp.asarray(rates))}
    given = dict(hyperparams)
    key = jax.random.key(3)

    start = enn.init_ensemble(
        make_model, optimizer, key, NUM_MEMBERS, hyperparams=hyperparams, mesh=mesh
    )
    np.testing.assert_array_equal(start.opt_state.hyperparams["learning_rate"], rates)
    end, _ = enn.fit(start, (X, Y), optimizer, mse_loss, num_steps=10, mesh=mesh)
    # The reference: every member at 1e-2 (same structure, so the same compiled programs).
    same = enn.init_ensemble(
        make_model,
        optimizer,
        key,
        NUM_MEMBERS,
        mesh=mesh,
        hyperparams={"learning_rate": enn.PerChainValue(jnp.full(NUM_MEMBERS, 1e-2))},
    )
    same_end, _ = enn.fit(same, (X, Y), optimizer, mse_loss, num_steps=10, mesh=mesh)

    moved = flat_params(end.model) - flat_params(start.model)
    reference = flat_params(same_end.model)
    for member, rate in enumerate(rates):
        if rate == 0.0:  # a zero learning rate keeps the parameters exactly
            np.testing.assert_array_equal(moved[member], 0.0)
        else:
            assert np.abs(moved[member]).max() > 1e-3
        if rate == np.float32(1e-2):  # same rate, same member: the very same updates
            np.testing.assert_array_equal(flat_params(end.model)[member], reference[member])
        else:
            assert np.abs(flat_params(end.model)[member] - reference[member]).max() > 1e-4
    # Larger rates move further (adam's first steps are about lr-sized per coordinate).
    step = np.abs(moved).mean(1)
    assert step[4] > step[1] > step[3] > step[7] > 0.0
    np.testing.assert_array_equal(end.opt_state.hyperparams["learning_rate"], rates)
    assert given == hyperparams and given["learning_rate"] is hyperparams["learning_rate"]


def test_hyperparameters_that_cannot_be_set_are_refused():
    plain = optax.adam(1e-2)
    with pytest.raises(enn.EnsembleError, match="learning_rate"):
        enn.init_ensemble(
            make_model, plain, jax.random.key(0), 4, hyperparams={"learning_rate": 0.1}
        )
    scheduled = optax.inject_hyperparams(optax.sgd)(
        learning_rate=optax.linear_schedule(0.1, 0.0, 10)
    )
    with pytest.raises(enn.EnsembleError, match="numeric hyperparameter"):
        enn.init_ensemble(
            make_model, scheduled, jax.random.key(0), 4, hyperparams={"learning_rate": 0.1}
        )
    with pytest.raises(enn.ChainCountError):
        enn.init_ensemble(
            make_model,
            optax.inject_hyperparams(optax.sgd)(learning_rate=0.1),
            jax.random.key(0),
            8,
            hyperparams={"learning_rate": enn.PerChainValue(jnp.zeros(4))},
        )


# --------------------------------------------------------------------------------------
# (b) SG-MCMC on the same network
# --------------------------------------------------------------------------------------


def make_posterior():
    return ensembles.MinibatchPosterior(
        make_model(jax.random.key(0)), (X, Y), gaussian_loglik, prior_scale=1.0
    )


def test_minibatch_posterior_is_prior_plus_scaled_likelihood():
    posterior = make_posterior()
    model = make_model(jax.random.key(5))
    theta = posterior.flatten(model)
    assert theta.shape == (posterior.dim,) and posterior.num_data == NUM_DATA
    np.testing.assert_array_equal(theta, ravel_pytree(eqx.filter(model, eqx.is_inexact_array))[0])
    assert_same_arrays(posterior.unflatten(theta), model)
    idx = np.array([3, 7, 7, 40])
    expected = (
        -0.5 * jnp.sum(theta**2) + NUM_DATA / 4 * gaussian_loglik(model, (X[idx], Y[idx])).sum()
    )
    np.testing.assert_allclose(eqx.filter_jit(posterior)(theta, idx), expected, rtol=1e-5)

    # Averaged over every batch of one example, the estimate is the full-data value.
    @eqx.filter_jit
    def singles_and_full(posterior, theta):
        singles = jax.vmap(lambda i: posterior(theta, i[None]))(jnp.arange(NUM_DATA))
        return singles.mean(), posterior(theta, jnp.arange(NUM_DATA))

    np.testing.assert_allclose(*singles_and_full(posterior, theta), rtol=1e-4)


def test_sgld_step_size_follows_the_optax_schedule(auto_mesh):
    """Every chain uses schedule(t) at step t: reported and actually applied."""
    num_steps = 12
    cycle = optax.cosine_decay_schedule(2e-5, 4, alpha=0.1)  # cyclical cosine, period 4
    schedule = optax.join_schedules([cycle, cycle, cycle], boundaries=[4, 8])
    # temperature 0 removes the noise: a step moves by exactly step_size * gradient.
    sgld = samplers.SGLD(step_size=schedule, batch_size=16, num_data=NUM_DATA, temperature=0.0)
    posterior = make_posterior()

    def trajectory(sampler, logdensity, position, key):
        state = sampler.init(logdensity, position, key)

        def one(state, t):
            new, info = sampler.step(logdensity, state, jax.random.fold_in(key, t))
            return new, (info.step_size, state.position, state.grad, new.position, new.count)

        return jax.lax.scan(one, state, jnp.arange(num_steps))[1]

    start = jax.vmap(posterior.sample_prior)(enn.chain_keys(jax.random.key(1), NUM_MEMBERS))
    step_size, before, grad, after, count = enn.ensemble_map(
        trajectory, in_roles=(None, None, enn.PER_CHAIN, enn.PER_CHAIN), mesh=auto_mesh
    )(sgld, posterior, start, enn.chain_keys(jax.random.key(2), NUM_MEMBERS))

    expected = np.asarray(jax.vmap(schedule)(jnp.arange(num_steps)), np.float32)
    assert len(set(expected.round(12).tolist())) > 3  # the schedule really varies
    np.testing.assert_array_equal(
        count, np.broadcast_to(np.arange(1, num_steps + 1), (NUM_MEMBERS, num_steps))
    )
    np.testing.assert_allclose(
        step_size, np.broadcast_to(expected, step_size.shape), rtol=1e-6, atol=0
    )
    # The gradients are in the hundreds (64 points, noise 0.1), so a step size off by even
    # a few percent moves a coordinate by far more than float32 rounding of the sum.
    assert np.median(np.abs(grad)) > 10.0
    for t in range(num_steps):
        step = expected[t] * grad[:, t]
        error = np.abs(after[:, t] - (before[:, t] + step))
        # A few float32 roundings of the operands, not of the (possibly cancelling) sum.
        assert (error <= 3e-7 * (np.abs(before[:, t]) + np.abs(step))).all(), t
        assert np.median(np.abs(step)) > 1e-5  # and the step itself is far larger


@pytest.mark.slow
def test_sg_mcmc_posterior_predictive_beats_the_prior():
    posterior = make_posterior()
    num_warmup, num_steps, thin = 250, 250, 25
    total = num_warmup + num_steps

    # SGLD from prior draws (flat positions), with a decaying polynomial step size.
    start = np.asarray(
        jax.vmap(posterior.sample_prior)(enn.chain_keys(jax.random.key(1), NUM_MEMBERS))
    )
    start_saved = start.copy()
    sgld = samplers.SGLD(
        step_size=optax.polynomial_schedule(1e-5, 1e-6, 0.55, total),
        batch_size=16,
        num_data=NUM_DATA,
    )
    # SGHMC from (untrained) deep-ensemble members.
    members = enn.init_ensemble(make_model, OPTIMIZER, jax.random.key(2), NUM_MEMBERS)
    members_saved = snapshot(members)
    sghmc = samplers.SGHMC(
        step_size=optax.polynomial_schedule(3e-5, 3e-6, 0.55, total),
        friction=0.1,
        batch_size=16,
        num_data=NUM_DATA,
    )

    for sampler, begin, prior in (
        (sgld, start, ensembles.PosteriorDraws.from_positions(posterior, start)),
        (sghmc, members, members),
    ):
        draws, result = ensembles.sample_posterior(
            sampler,
            posterior,
            begin,
            key=jax.random.key(3),
            num_steps=num_steps,
            num_warmup=num_warmup,
            thin=thin,
            progress=False,
            chunk_size=total,
        )
        name = type(sampler).__name__
        assert (draws.num_chains, draws.num_draws) == (NUM_MEMBERS, num_steps // thin)
        assert int(result.num_divergent.sum()) == 0, name
        np.testing.assert_array_equal(result.state.count, total)
        prior_mse = float(np.mean((ensembles.predict(prior, X_TEST) - Y_TEST) ** 2))
        post_mse = float(np.mean((ensembles.predict(draws, X_TEST) - Y_TEST) ** 2))
        # The noise variance is 0.01: a posterior that found the curve is well below it
        # (about 0.001-0.003 here); the prior predictive is at 0.5 (members) or 8 (prior).
        assert post_mse < 0.02, (name, post_mse, prior_mse)
        assert post_mse < prior_mse / 10, (name, post_mse, prior_mse)

    # What the user handed in is as it was.
    np.testing.assert_array_equal(start, start_saved)
    for leaf, saved in zip(snapshot(members), members_saved):
        np.testing.assert_array_equal(leaf, saved)


def test_user_objects_are_not_modified(explicit_mesh):
    model = make_model(jax.random.key(7))
    model_saved = snapshot(model)
    x, y = X.copy(), Y.copy()
    init_fn, update_fn = OPTIMIZER
    state_saved = snapshot(OPTIMIZER.init(eqx.filter(model, eqx.is_inexact_array)))

    posterior = ensembles.MinibatchPosterior(model, (x, y), gaussian_loglik)
    theta = posterior.flatten(model)
    posterior(theta, jnp.arange(8))
    draws = ensembles.PosteriorDraws.from_positions(posterior, jnp.stack([theta] * 4))
    ensembles.predict(draws, X_TEST)
    # The same program as the `trained` fixture (compiled once), on copies of the data.
    ensemble = enn.init_ensemble(
        make_model, OPTIMIZER, jax.random.key(0), NUM_MEMBERS, mesh=explicit_mesh
    )
    ensemble_saved = snapshot(ensemble)
    enn.fit(
        ensemble,
        (x, y),
        OPTIMIZER,
        mse_loss,
        num_steps=TRAIN_STEPS,
        batch_size=32,
        key=jax.random.key(1),
        mesh=explicit_mesh,
    )

    assert_same_arrays(model, model_saved)
    assert model.activation is jax.nn.tanh and model.width_size == 16
    np.testing.assert_array_equal(x, X)
    np.testing.assert_array_equal(y, Y)
    for leaf, saved in zip(snapshot(ensemble), ensemble_saved):
        np.testing.assert_array_equal(leaf, saved)
    assert OPTIMIZER.init is init_fn and OPTIMIZER.update is update_fn
    assert_same_arrays(OPTIMIZER.init(eqx.filter(model, eqx.is_inexact_array)), state_saved)
