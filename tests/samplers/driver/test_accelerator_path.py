"""The driver's accelerator path, run on the CPU: chunks whose length is compiled in, the
default one batch per device, the bitwise mode on request, and the streaming sums that
replaced the per-step Welford update."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np

import ensemblenn as enn
import samplers

# private: the test reads the static facts a run resolves (the driver's Config)
from samplers.driver import _flat, _options, _setup

TARGET = samplers.targets.IllConditionedGaussian(dim=4, condition_number=5.0)
X0 = jax.random.normal(jax.random.key(3), (16, 4))


def go(**kwargs):
    options = dict(key=jax.random.key(0), num_steps=45, num_warmup=7, progress=False)
    options.update(kwargs)
    return samplers.run(samplers.MALA(step_size=0.6), TARGET, X0, **options)


def test_static_chunks_give_the_same_bits(mesh, monkeypatch):
    """On an accelerator each chunk's length is compiled in (a known trip count); the
    driver reads the platform from `enn.mesh_platform`, patched here (no GPU in CI)."""
    # chunk_size 10 over 52 steps: five chunks of 10 and one of 2, which compiles a second
    # program; warmup ends inside a chunk; a thinned trace and the b² history are kept.
    kwargs = dict(mesh=mesh, chunk_size=10, thin=3, track_bias=True)
    runs = {}
    for platform in ("gpu", "cpu"):
        monkeypatch.setattr(enn, "mesh_platform", lambda *args, p=platform, **kw: p)
        runs[platform] = go(**kwargs)
    static, dynamic = runs["gpu"], runs["cpu"]
    for x, y in zip(jax.tree.leaves(static), jax.tree.leaves(dynamic), strict=True):
        np.testing.assert_array_equal(x, y)
    assert static.trace.shape == (16, 15, 4) and static.bias_history.shape == (45, 2)
    np.testing.assert_array_equal(static.trace[:, -1], static.state.position)


def test_a_thinned_trace_is_every_thin_th_draw(mesh, monkeypatch):
    """Where a cond runs on the device (CPU, TPU) only the kept rows are written, each in
    a `lax.cond` on the step number; on a GPU every step writes its row (unkept ones to a
    scratch row). Either way the thinned trace is every thin-th row of the full one, its
    statistics too (7 warmup steps: not a multiple of 3 or 4; chunks of 12 steps)."""
    for platform, skips in (("gpu", False), ("tpu", True), ("cpu", True)):
        monkeypatch.setattr(enn, "mesh_platform", lambda *args, p=platform, **kw: p)
        full = go(mesh=mesh, chunk_size=12, thin=1)
        for thin in (3, 4):
            setup = _setup.make_setup(
                X0, jax.random.key(0), _options.RunOptions.checked(16, num_steps=45, thin=thin),
                position=_flat.Structure.of(X0, batched=True), observed=None,
            )  # fmt: skip
            assert setup.config.skip_unkept is skips
            thinned = go(mesh=mesh, chunk_size=12, thin=thin)
            assert thinned.trace.shape == (16, 45 // thin, 4)
            np.testing.assert_array_equal(thinned.trace, full.trace[:, thin - 1 :: thin])
            for name, values in thinned.sample_stats.items():
                np.testing.assert_array_equal(values, full.sample_stats[name][:, thin - 1 :: thin])
            np.testing.assert_array_equal(thinned.state.position, full.state.position)


def test_default_is_one_batch_and_auto_is_the_bitwise_mode():
    """The same 16 chains on 4, 2 and 1 devices (4, 8 and 16 per device)."""
    assert inspect.signature(samplers.run).parameters["block_size"].default is None
    meshes = {n: jax.make_mesh((n,), ("chains",), devices=jax.devices()[:n]) for n in (4, 2, 1)}
    bitwise = {n: go(mesh=m, block_size="auto") for n, m in meshes.items()}
    default = {n: go(mesh=m) for n, m in meshes.items()}
    for n in (2, 1):
        np.testing.assert_array_equal(bitwise[n].state.position, bitwise[4].state.position)
        np.testing.assert_array_equal(bitwise[n].diagnostics.rhat, bitwise[4].diagnostics.rhat)
        # By default the device counts agree to rounding (and need not agree to the bit).
        np.testing.assert_allclose(default[n].state.position, default[4].state.position, atol=1e-4)
        np.testing.assert_allclose(
            default[n].diagnostics.rhat, default[4].diagnostics.rhat, rtol=1e-4
        )


def test_streaming_sums_give_the_moments_of_the_sampled_draws():
    """`StreamingSums` (what the chunks carry) turned into `ChainMoments`: the moments of
    the sampled draws (warmup steps excluded) to float32 rounding, for a chain far from the
    origin (the shift keeps the sums of squares from cancelling), and at least as close as
    the per-step Welford form (`ChainMoments.update`) they replaced."""
    from samplers.driver._moments import StreamingSums  # the driver's carry: no public name

    draws = np.random.default_rng(0).normal(1e3, 2.0, size=(40, 3)).astype(np.float32)
    warmup, half_point = 6, 17
    sums = StreamingSums.zeros(3)
    welford = samplers.ChainMoments.zeros(3)
    for t, x in enumerate(draws):
        since = t - warmup
        half = jnp.int32(since >= half_point)
        sums = sums.add(jnp.asarray(x), half, since == 0, since >= 0)
        if since >= 0:
            welford = welford.update(jnp.asarray(x), half)
    got = sums.moments(jnp.array([half_point, 40 - warmup - half_point]))
    halves = np.split(draws[warmup:].astype(np.float64), [half_point])
    mean = np.stack([h.mean(0) for h in halves])
    m2 = np.stack([((h - h.mean(0)) ** 2).sum(0) for h in halves])
    second = (draws[warmup:].astype(np.float64) ** 2).mean(0)
    np.testing.assert_array_equal(got.count, welford.count)
    np.testing.assert_allclose(got.mean, mean, rtol=1e-7)
    np.testing.assert_allclose(got.m2, m2, rtol=1e-6)  # Welford's: 1.5e-5 off here
    np.testing.assert_allclose(got.second_moment, second, rtol=1e-7)
    np.testing.assert_allclose(welford.m2, m2, rtol=1e-4)


def test_divergences_count_the_sampling_transitions_only():
    """A step size far past the leapfrog's limit: every transition diverges, and the
    count covers the 3 sampling steps, not the 20 warmup steps (as NumPyro and Stan)."""
    result = samplers.run(
        samplers.HMC(step_size=100.0, num_integration_steps=3, jitter=False), TARGET, X0,
        key=jax.random.key(1), num_warmup=20, num_steps=3, progress=False,
    )  # fmt: skip
    assert np.asarray(result.num_divergent).tolist() == [3] * 16
