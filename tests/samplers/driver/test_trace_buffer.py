"""The run's trace buffers: written in place by every chunk (donated to each call) and
handed to the result without a copy (on a CPU, copying the kept draws after sampling cost
as much as sampling: benchmarks §15)."""

import jax
import numpy as np
import pytest

import ensemblenn as enn
import samplers
from samplers.driver import _chunk  # private: the test spies on the chunk program's buffers

TARGET = samplers.targets.IllConditionedGaussian(dim=3, condition_number=4.0)
X0 = jax.random.normal(jax.random.key(1), (8, 3))


def _spy_on_chunks(monkeypatch):
    """Record the trace buffers each chunk call receives and returns."""
    calls = []
    real = enn.ensemble_map

    def spying(fn, **kwargs):
        mapped = real(fn, **kwargs)
        if fn is not _chunk.chunk:
            return mapped

        def call(*args):
            out = mapped(*args)
            calls.append((args[8], out[1]))
            return out

        return call

    monkeypatch.setattr(enn, "ensemble_map", spying)
    return calls


@pytest.mark.parametrize("thin", [1, 3])
def test_every_chunk_takes_the_buffer_and_the_result_is_the_last_one(mesh, monkeypatch, thin):
    calls = _spy_on_chunks(monkeypatch)
    result = samplers.run(
        samplers.MALA(step_size=0.7), TARGET, X0, key=jax.random.key(0), num_steps=30,
        num_warmup=10, chunk_size=6, thin=thin, mesh=mesh, progress=False,
    )  # fmt: skip
    assert len(calls) == 7  # 40 steps in chunks of 6
    for given, returned in calls[:-1]:
        # Donated: the call took the buffers it was given (a copy would leave them alive).
        assert all(x.is_deleted() for x in jax.tree.leaves(given))
        assert returned.positions.is_deleted()  # and the next call took its output
    last = calls[-1][1]
    assert result.trace is last.positions  # no copy after sampling
    assert result.trace.shape == (8, 30 // thin, 3)
    # The buffer holds the draws: the last kept one is the final state when thin divides 30.
    np.testing.assert_array_equal(result.trace[:, -1], result.state.position)
    # and every statistic row was written (none left at the buffer's zeros).
    assert np.all(np.asarray(result.sample_stats["n_steps"]) == 1)


def test_the_result_equals_a_run_in_one_chunk(mesh):
    def go(chunk_size):
        return samplers.run(
            samplers.MALA(step_size=0.7), TARGET, X0, key=jax.random.key(0), num_steps=30,
            num_warmup=10, chunk_size=chunk_size, thin=2, mesh=mesh, progress=False,
        )  # fmt: skip

    a, b = go(6), go(40)
    np.testing.assert_array_equal(a.trace, b.trace)
    for name in a.sample_stats:
        np.testing.assert_array_equal(a.sample_stats[name], b.sample_stats[name])


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
@pytest.mark.parametrize("block_size", [None, "auto"])
def test_under_set_mesh_of_an_explicit_mesh(explicit_mesh, monkeypatch, platform, block_size):
    """`jax.set_mesh` of an Explicit mesh types the chains' values on it while the trace
    buffer (an operand) is typed on none: the write still goes through, and the draws are
    the ones an Auto mesh gives (the bitwise mode: the same bits)."""
    monkeypatch.setattr(enn, "mesh_platform", lambda *args, **kw: platform)
    settings = dict(key=jax.random.key(0), num_steps=30, num_warmup=10, chunk_size=12,
                    block_size="auto", progress=False)  # fmt: skip
    kernel = samplers.MALA(step_size=0.7)
    reference = samplers.run(kernel, TARGET, X0, **settings)
    settings["block_size"] = block_size
    with jax.set_mesh(explicit_mesh):
        result = samplers.run(kernel, TARGET, X0, **settings)
    assert result.trace.shape == (8, 30, 3)
    if block_size == "auto":
        np.testing.assert_array_equal(result.trace, reference.trace)
    else:
        np.testing.assert_allclose(result.trace, reference.trace, rtol=1e-5, atol=1e-5)
