"""NUTS against a reference implementation, in distribution.

The reference is BlackJAX 1.7.1's `blackjax.nuts` (multinomial NUTS, biased progressive
sampling, the trapezoidal generalized U-turn criterion on every subtree and on the whole
trajectory): the same algorithm, so with the same target, step size and metric the two
transitions have the same law. Not only the moments: the number of doublings and of
leapfrog steps per transition must agree in distribution, which is what a wrong U-turn
check changes first (a check that reads one end of a span only lets trajectories run past
their turn: longer trees, with moments still right).

BlackJAX is in the `dev` extra, so CI always has it; a missing reference is a failure
there (the `CI` variable set), a skip only on a developer's machine without it.

Design (fixed keys): a rotated ill-conditioned Gaussian (6-d, condition number 30, a
diagonal metric that removes only the marginal scales), `NUM_CHAINS` chains started at
exact draws, so every transition is a stationary one and chains are independent.
Tolerances are Monte Carlo errors:
* per-chain means over the transitions are independent across chains: their spread gives
  each mean's SE, and 5 SE of a difference of two independent estimates is p < 1e-6;
* the tree depths of one transition (the last) of every chain are independent draws of
  the depth's law: a chi-square test of homogeneity of the two histograms, p > 1e-4.
"""

import os

import jax
import numpy as np
import pytest
import scipy.stats

import samplers

if os.environ.get("CI"):
    import blackjax  # CI installs the dev extra: the reference must be there
else:
    blackjax = pytest.importorskip("blackjax")

TARGET = samplers.targets.IllConditionedGaussian(dim=6, condition_number=30.0, rotated=True)
METRIC = TARGET.reference.second_moment  # the marginal variances (the mean is zero)
STEP_SIZE = 0.3
NUM_CHAINS = 1024
NUM_TRANSITIONS = 8


def _starts() -> jax.Array:
    return jax.vmap(TARGET.sample)(jax.random.split(jax.random.key(0), NUM_CHAINS))


@jax.jit
def _ours(positions: jax.Array, key: jax.Array) -> tuple:
    kernel = samplers.NUTS(step_size=STEP_SIZE, inverse_mass_matrix=METRIC)

    def chain(x, key):
        def body(state, k):
            state, info = kernel.step(TARGET, state, k)
            return state, (state.position, info.tree_depth, info.num_grads, info.acceptance_rate)

        state = kernel.init(TARGET, x, key)
        return jax.lax.scan(body, state, jax.random.split(key, NUM_TRANSITIONS))[1]

    return jax.vmap(chain)(positions, jax.random.split(key, NUM_CHAINS))


@jax.jit
def _reference(positions: jax.Array, key: jax.Array) -> tuple:
    nuts = blackjax.nuts(TARGET, step_size=STEP_SIZE, inverse_mass_matrix=METRIC)

    def chain(x, key):
        def body(state, k):
            state, info = nuts.step(k, state)
            return state, (
                state.position,
                info.num_trajectory_expansions,
                info.num_integration_steps,
                info.acceptance_rate,
            )

        return jax.lax.scan(body, nuts.init(x), jax.random.split(key, NUM_TRANSITIONS))[1]

    return jax.vmap(chain)(positions, jax.random.split(key, NUM_CHAINS))


@pytest.fixture(scope="module")
def runs() -> tuple[dict, dict]:
    names = ("position", "tree_depth", "num_grads", "acceptance_rate")
    starts = _starts()
    ours = dict(zip(names, map(np.asarray, _ours(starts, jax.random.key(1)))))
    theirs = dict(zip(names, map(np.asarray, _reference(starts, jax.random.key(2)))))
    return ours, theirs


def _per_chain_mean_and_se(per_chain: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    per_chain = np.asarray(per_chain, np.float64)
    return per_chain.mean(0), per_chain.std(0, ddof=1) / np.sqrt(per_chain.shape[0])


def _agree(a: np.ndarray, b: np.ndarray, what: str) -> None:
    """Per-chain statistics `a`, `b` (chains first) agree within 5 SE of the difference."""
    (ma, sa), (mb, sb) = _per_chain_mean_and_se(a), _per_chain_mean_and_se(b)
    z = np.abs(ma - mb) / np.hypot(sa, sb)
    assert np.all(z < 5.0), f"{what}: ours {ma}, reference {mb}, |z| {z}"


def test_tree_depth_and_leapfrog_steps_agree_in_mean(runs):
    ours, theirs = runs
    for name in ("tree_depth", "num_grads", "acceptance_rate"):
        _agree(ours[name].mean(1), theirs[name].mean(1), name)


def test_tree_depth_histograms_agree(runs):
    ours, theirs = runs
    a, b = ours["tree_depth"][:, -1], theirs["tree_depth"][:, -1]
    depths = np.union1d(a, b)
    table = np.array([[np.sum(x == d) for d in depths] for x in (a, b)])
    table = table[:, table.sum(0) >= 10]  # chi-square needs populated cells
    assert table.shape[1] >= 2, table  # the depth must vary for the test to mean anything
    p = scipy.stats.chi2_contingency(table).pvalue
    assert p > 1e-4, (depths, table, p)


def test_moments_agree_with_the_reference_and_the_target(runs):
    ours, theirs = runs
    x, y = ours["position"], theirs["position"]
    _agree(x.mean(1), y.mean(1), "mean")
    _agree((x**2).mean(1), (y**2).mean(1), "second moment")
    # And both with the exact moments (chains started at exact draws: no burn-in).
    exact = np.asarray(TARGET.reference.second_moment)
    for draws in (x, y):
        m, se = _per_chain_mean_and_se((draws**2).mean(1))
        assert np.all(np.abs(m - exact) < 5 * se), (m, exact, se)
        m, se = _per_chain_mean_and_se(draws.mean(1))
        assert np.all(np.abs(m) < 5 * se), (m, se)
