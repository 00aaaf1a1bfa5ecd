"""The driver's accelerator path, run on the CPU: chunks whose length is compiled in, the
default one batch per device, the bitwise mode on request, and the streaming sums that
replaced the per-step Welford update."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np

import ensemblenn as enn
import samplers

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


def test_default_is_one_batch_and_auto_is_the_bitwise_mode():
    assert inspect.signature(samplers.run).parameters["block_size"].default is None
    one = jax.make_mesh((1,), ("chains",), devices=jax.devices()[:1])
    four = jax.make_mesh((4,), ("chains",), devices=jax.devices()[:4])
    a, b = go(mesh=one, block_size="auto"), go(mesh=four, block_size="auto")
    np.testing.assert_array_equal(a.state.position, b.state.position)
    np.testing.assert_array_equal(a.diagnostics.rhat, b.diagnostics.rhat)
    # By default the device counts agree to rounding (and need not agree to the bit).
    c, d = go(mesh=one), go(mesh=four)
    np.testing.assert_allclose(c.state.position, d.state.position, atol=1e-4)
    np.testing.assert_allclose(c.diagnostics.rhat, d.diagnostics.rhat, rtol=1e-4)


def test_streaming_sums_give_the_welford_moments():
    """`StreamingSums` (what the chunks carry) and `ChainMoments.update` (the per-step
    Welford form) agree on the same draws, warmup steps excluded, for a chain far from
    the origin (the shift keeps the sums of squares exact enough)."""
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
    np.testing.assert_array_equal(got.count, welford.count)
    np.testing.assert_allclose(got.mean, welford.mean, rtol=1e-6)
    np.testing.assert_allclose(got.m2, welford.m2, rtol=2e-3)
    np.testing.assert_allclose(got.second_moment, welford.second_moment, rtol=1e-5)
    sampled = draws[warmup:]
    np.testing.assert_allclose(got.chain_mean_var()[1], sampled.var(0, ddof=1), rtol=2e-3)


def test_divergences_count_the_sampling_transitions_only():
    """A step size far past the leapfrog's limit: every transition diverges, and the
    count covers the 3 sampling steps, not the 20 warmup steps (as NumPyro and Stan)."""
    result = samplers.run(
        samplers.HMC(step_size=100.0, num_integration_steps=3, jitter=False), TARGET, X0,
        key=jax.random.key(1), num_warmup=20, num_steps=3, progress=False,
    )  # fmt: skip
    assert np.asarray(result.num_divergent).tolist() == [3] * 16
