"""`samplers.run`'s options are checked once into one `RunOptions`, which every phase reads."""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import pytest

import samplers

# Private on purpose: the test holds the driver's one home for its options to the signature.
from samplers.driver._options import RunOptions

# Keywords of `run` that are inputs, not options: the key, and what builds the chains.
INPUTS = {"key", "num_chains", "adaptation", "sampler", "logdensity", "positions"}


def test_every_keyword_option_of_run_is_a_field_of_run_options():
    """A new `samplers.run` option that skips `RunOptions` fails here."""
    keywords = set(inspect.signature(samplers.run).parameters) - INPUTS
    fields = {f.name for f in dataclasses.fields(RunOptions)}
    assert keywords == fields, (keywords - fields, fields - keywords)


def test_the_mapping_is_what_every_ensemble_map_receives(monkeypatch):
    """The mesh, axis and block size reach `enn.ensemble_map` from the options, unchanged."""
    import ensemblenn as enn

    seen = []
    real = enn.ensemble_map

    def spy(fn, **kwargs):
        seen.append({k: kwargs.get(k) for k in ("mesh", "axis", "block_size")})
        return real(fn, **kwargs)

    monkeypatch.setattr(enn, "ensemble_map", spy)
    mesh = jax.make_mesh((4,), ("walkers",))
    samplers.run(samplers.MALA(0.5), lambda x: -0.5 * jnp.sum(x**2), jnp.zeros((8, 2)),
                 key=jax.random.key(0), num_steps=3, mesh=mesh, axis="walkers",
                 block_size=2, progress=False)  # fmt: skip
    assert seen and all(s == dict(mesh=mesh, axis="walkers", block_size=2) for s in seen), seen


def test_options_are_checked_before_anything_runs():
    with pytest.raises(samplers.SamplerTypeError, match="block_size must be"):
        RunOptions.checked(8, num_steps=10, block_size="big")
    with pytest.raises(samplers.SamplerTypeError, match="on_chunk must be a callable"):
        RunOptions.checked(8, num_steps=10, on_chunk=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        RunOptions.checked(8, num_steps=10).block_size = 4
