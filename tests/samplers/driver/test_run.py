"""The driver samplers.run: chunking, memory, tracing, device counts, progress, summary."""

import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ensemblenn as enn
import samplers

TARGET = samplers.targets.IllConditionedGaussian(dim=3, condition_number=4.0)
X0 = jax.random.normal(jax.random.key(1), (8, 3))


def go(**kwargs):
    options = dict(key=jax.random.key(0), num_steps=30, num_warmup=10, progress=False)
    options.update(kwargs)
    return samplers.run(options.pop("sampler", samplers.MALA(step_size=0.7)), TARGET, X0, **options)


def test_chunking_does_not_change_the_result(mesh):
    a = go(mesh=mesh, chunk_size=40, thin=2, track_bias=True)
    b = go(mesh=mesh, chunk_size=6, thin=2, track_bias=True)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
    assert a.trace.shape == (8, 15, 3) and a.bias_history.shape == (30, 2)


def test_warmup_only_chunks_with_a_trace_on_an_explicit_mesh(explicit_mesh):
    result = go(mesh=explicit_mesh, chunk_size=5, thin=1, track_bias=True)
    assert result.trace.shape == (8, 30, 3) and result.bias_history.shape == (30, 2)
    # The trace holds the sampling steps: its last draw is the final state.
    np.testing.assert_array_equal(result.trace[:, -1], result.state.position)


def test_memory_does_not_grow_with_num_steps(mesh):
    # thin=0: streaming moments only (the default keeps draws within a memory budget).
    short, long = go(mesh=mesh, num_steps=10, thin=0), go(mesh=mesh, num_steps=200, thin=0)
    shapes = lambda r: [np.shape(x) for x in jax.tree.leaves(r)]
    assert short.trace is None and short.bias_history is None
    assert shapes(short) == shapes(long)


def test_moments_match_the_trace(mesh):
    result = go(mesh=mesh, thin=1, num_steps=40)
    draws = np.asarray(result.trace, np.float64)
    np.testing.assert_allclose(result.diagnostics.mean, draws.mean((0, 1)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(result.diagnostics.second_moment, (draws**2).mean((0, 1)), rtol=1e-4)
    np.testing.assert_allclose(
        result.diagnostics.rhat, samplers.diagnostics.split_rhat(result.trace), rtol=1e-4
    )
    expected = samplers.diagnostics.bias_squared(
        (draws**2).mean((0, 1)), TARGET.reference.second_moment, TARGET.reference.second_moment_var
    )
    np.testing.assert_allclose(result.diagnostics.bias_squared_max, expected[0], rtol=1e-3)


def test_draw_logdensity_is_each_kept_draws_log_density(mesh):
    # Recorded from the chain's state while sampling (not evaluated again at the end): the
    # column must be the log density of the row's own draw, across chunks and thinning.
    for sampler in (samplers.MALA(step_size=0.7), samplers.HMC(0.5, 3), samplers.RandomWalk(0.8)):
        result = go(mesh=mesh, sampler=sampler, thin=3, chunk_size=7)
        expected = jax.vmap(jax.vmap(TARGET))(result.trace)
        assert result.draw_logdensity.shape == (8, 10)
        np.testing.assert_allclose(result.draw_logdensity, expected, rtol=1e-5, atol=1e-6)
        assert "lp" not in result.sample_stats  # ArviZ's `lp` comes from draw_logdensity
        np.testing.assert_array_equal(result.draw_logdensity[:, -1], result.state.logdensity)


def test_bias_uses_the_targets_observable():
    funnel = samplers.targets.NealsFunnel(dim=3)
    x0 = jax.vmap(funnel.sample)(jax.random.split(jax.random.key(2), 64))
    result = samplers.run(
        samplers.MALA(step_size=0.2),
        funnel,
        x0,
        key=jax.random.key(0),
        num_steps=5,
        thin=1,
        progress=False,
    )
    # result.trace holds the observable's draws; the positions are result.unconstrained's.
    observed = jax.vmap(jax.vmap(funnel.observable))(result.unconstrained.trace)
    np.testing.assert_allclose(result.trace, observed, rtol=1e-6)
    expected = samplers.diagnostics.bias_squared(
        (observed**2).mean((0, 1)),
        funnel.reference.second_moment,
        funnel.reference.second_moment_var,
    )
    np.testing.assert_allclose(result.diagnostics.bias_squared_max, expected[0], rtol=1e-3)


def test_jittable_end_to_end(mesh):
    @jax.jit
    def final(key, x0):
        return samplers.run(
            samplers.MALA(step_size=0.7),
            TARGET,
            x0,
            key=key,
            num_steps=20,
            mesh=mesh,
            progress=False,
        ).state.position

    eager = samplers.run(
        samplers.MALA(step_size=0.7),
        TARGET,
        X0,
        key=jax.random.key(4),
        num_steps=20,
        mesh=mesh,
        progress=False,
    ).state.position
    np.testing.assert_allclose(final(jax.random.key(4), X0), eager, rtol=1e-5, atol=1e-6)


def test_one_progress_bar_for_the_ensemble(capsys):
    go(progress=True, chunk_size=10)
    err = capsys.readouterr().err
    frames = [f for f in err.replace("\r", "\n").splitlines() if f.strip()]
    assert frames and all(f.startswith("ensemble") for f in frames)
    assert "40/40" in frames[-1] and "acc=" in frames[-1] and "steps/s" in frames[-1]


def test_summary_table_truncates_large_dimensions():
    big = samplers.targets.IllConditionedGaussian(dim=30, condition_number=4.0)
    result = samplers.run(
        samplers.MALA(step_size=0.5),
        big,
        jnp.zeros((8, 30)),
        key=jax.random.key(0),
        num_steps=20,
        progress=False,
    )
    text = result.summary(max_rows=6, print_it=False)
    assert "8 chains on 4 device(s)" in text and "R-hat (split)" in text and "bias^2" in text
    rows = [line for line in text.splitlines() if line.startswith("x[")]
    assert len(rows) == 6 and "..." not in text  # the first rows, then a note
    assert rows[0].split()[0] == "x[0]" and rows[-1].split()[0] == "x[5]"
    assert text.splitlines()[-1] == (
        "(24 of 30 rows not shown: summary(max_rows=None) shows every row)"
    )
    assert len([line for line in result.summary(print_it=False).splitlines()
                if line.startswith("x[")]) == 30  # fmt: skip


def test_one_and_four_devices_agree(tmp_path):
    program = Path(__file__).parents[2] / "programs" / "run_invariance.py"
    out = {}
    for n in (1, 4):
        subprocess.run(
            [sys.executable, str(program), str(n), str(tmp_path / f"{n}.npz")],
            check=True,
            timeout=300,
        )
        out[n] = np.load(tmp_path / f"{n}.npz")
    # block_size="auto" (the program asks for it) makes per-chain arithmetic the same
    # program on 1 and 4 devices, and collectives reduce in a fixed order: bitwise equal.
    for name in ("position", "rhat", "ess", "b2", "acceptance"):
        np.testing.assert_array_equal(out[4][name], out[1][name], err_msg=name)


@pytest.mark.parametrize("bad", [0, 7])
def test_invalid_chunk_size_still_runs_or_explains(bad):
    if bad == 0:
        result = go(chunk_size=None)
        assert result.num_steps == 30
    else:
        assert go(chunk_size=bad).state.position.shape == (8, 3)


class _TowardsTheMean(samplers.Sampler):
    """A toy kernel whose step needs the ensemble: it moves each chain halfway to the mean."""

    def init(self, logdensity, position, key):
        return samplers.State(position, logdensity(position), jnp.int32(0))

    def step(self, logdensity, state, key):
        x = 0.5 * (state.position + enn.chain_mean(state.position))
        return samplers.State(x, logdensity(x), state.count + 1), samplers.unadjusted_info(0)


class _TowardsTheMeanDeclared(_TowardsTheMean):
    step_uses_ensemble = True


def test_a_kernel_that_needs_the_ensemble_must_say_so(mesh):
    positions = jnp.arange(16.0).reshape(8, 2)
    settings = dict(key=jax.random.key(0), num_steps=3, progress=False, mesh=mesh)
    with pytest.raises(enn.CollectiveError, match="step_uses_ensemble = True"):
        samplers.run(
            _TowardsTheMean(), lambda x: -jnp.sum(x**2), positions, block_size="auto", **settings
        )
    # declared: run unblocked, over the whole ensemble; or no blocks at all (the default)
    for sampler, block in ((_TowardsTheMeanDeclared(), "auto"), (_TowardsTheMean(), None)):
        result = samplers.run(
            sampler, lambda x: -jnp.sum(x**2), positions, block_size=block, **settings
        )
        mean = positions.mean(axis=0)
        expected = mean + (positions - mean) / 8.0  # three halvings of the spread
        np.testing.assert_allclose(np.asarray(result.state.position), expected, rtol=1e-6)


def test_thinned_trace_with_chunks_of_warmup_only(explicit_mesh):
    """Chunks made only of warmup steps keep nothing; the trace is the same for any
    chunking (the driver once failed slicing an empty trace on an Explicit mesh)."""
    settings = dict(
        key=jax.random.key(0),
        num_steps=20,
        num_warmup=30,
        thin=5,
        mesh=explicit_mesh,
        progress=False,
    )
    runs = [
        samplers.run(
            samplers.MALA(step_size=0.3),
            lambda x: -0.5 * jnp.sum(x**2),
            jnp.zeros((8, 2)),
            chunk_size=c,
            **settings,
        )
        for c in (10, 50)
    ]
    assert runs[0].trace.shape == (8, 4, 2)
    np.testing.assert_array_equal(np.asarray(runs[0].trace), np.asarray(runs[1].trace))


def test_summary_run_line_names_the_adaptation_instead_of_zero_warmup():
    """A tuned run's warmup is its adaptation: the line says so (with the gradients spent
    adapting) rather than "0 warmup"; plain warmup steps still show as warmup."""

    def run_line(**kwargs):
        text = go(**kwargs).summary(print_it=False)
        return next(line for line in text.splitlines() if "chains on" in line)

    assert run_line().startswith("8 chains on 4 device(s), 10 warmup + 30 steps, 40 grads/chain")
    tuned = run_line(num_warmup=0, adaptation=samplers.WindowAdaptation(num_steps=20))
    # 20 adaptation steps, plus the gradients of the initial step-size search.
    assert re.search(r", adaptation \+ 30 steps, 30 grads/chain \+ 2\d adapting$", tuned)
    both = run_line(adaptation=samplers.WindowAdaptation(num_steps=20))
    assert re.search(r", adaptation \+ 10 warmup \+ 30 steps, 40 grads/chain \+ 2\d adapting", both)


def test_default_thin_keeps_every_draw_that_fits_the_memory_budget(monkeypatch):
    from samplers.driver import _setup  # private: its memory budget, lowered for the test

    every = go()  # 8 chains x 30 draws x 3-d: far below 256 MiB
    assert every.thin == 1 and every.thin_auto and every.trace.shape == (8, 30, 3)
    assert "trace: every draw kept (memory budget 256 MiB)" in every.summary(print_it=False)
    assert set(every.sample_stats) >= {"diverging", "acceptance_rate", "n_steps", "step_size"}
    # A budget of 10 draws: each is 8 chains x (3 coordinates, 7 statistics, lp) x 4 bytes.
    row = _setup.trace_row_bytes(_setup.Structure.of(X0, batched=True), None)
    assert row == (3 + 7 + 1) * 4
    monkeypatch.setattr(_setup, "TRACE_MEMORY_BUDGET", 8 * row * 10)
    thinned = go()
    assert thinned.thin == 3 and thinned.trace.shape == (8, 10, 3)
    np.testing.assert_array_equal(thinned.trace, every.trace[:, 2::3])
    assert "trace: every 3rd draw kept (memory budget" in thinned.summary(print_it=False)
    monkeypatch.setattr(_setup, "TRACE_MEMORY_BUDGET", 8 * row - 1)  # not one draw fits
    none = go()
    assert none.thin == 0 and none.trace is None
    assert "trace: no draws kept (automatic" in none.summary(print_it=False)
