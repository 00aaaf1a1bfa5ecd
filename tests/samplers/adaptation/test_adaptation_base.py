"""The ensemble adaptation loop: cross-chain means, masking of diverging chains."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import samplers
from samplers.adaptation import EnsembleAdaptation, as_array


class AcceptanceStepSize(EnsembleAdaptation):
    """Robbins-Monro on log step size towards a target ensemble acceptance."""

    num_steps: int = eqx.field(static=True, default=300)
    target: float = 0.57

    def prepare(self, sampler):
        return eqx.tree_at(lambda s: s.step_size, sampler, as_array(sampler.step_size))

    def init_state(self, sampler, state):
        return jnp.zeros(())

    def statistics(self, sampler, state, info):
        return {"acceptance": info.acceptance_rate, "x2": state.position**2}

    def update(self, sampler, adaptation_state, means, step):
        rate = 1.0 / (step + 10.0) ** 0.6
        log_h = jnp.log(sampler.step_size) + rate * (means["acceptance"] - self.target)
        return eqx.tree_at(lambda s: s.step_size, sampler, jnp.exp(log_h)), adaptation_state


def gaussian(x):
    return -0.5 * jnp.sum(x**2 / jnp.array([1.0, 4.0, 9.0]))


def test_step_size_reaches_the_target_acceptance(mesh):
    result = samplers.run(
        samplers.MALA(step_size=0.01),
        gaussian,
        jnp.zeros((64, 3)),
        key=jax.random.key(0),
        num_steps=400,
        mesh=mesh,
        adaptation=AcceptanceStepSize(),
        progress=False,
    )
    h = result.sampler.step_size
    assert h.shape == () and 0.3 < float(h) < 3.0  # tuned from 0.01, shared by every chain
    assert abs(float(jnp.mean(result.acceptance_rate)) - 0.57) < 0.08
    assert int(result.adaptation_info.num_steps) == 300
    assert int(result.adaptation_info.num_excluded) == 0


def test_a_diverging_chain_is_masked_and_counted(mesh):
    x0 = jnp.zeros((64, 3)).at[5].set(jnp.array([1e30, 1e30, 1e30]))
    result = samplers.run(
        samplers.MALA(step_size=0.01),
        gaussian,
        x0,
        key=jax.random.key(0),
        num_steps=50,
        mesh=mesh,
        adaptation=AcceptanceStepSize(num_steps=100),
        progress=False,
    )
    assert np.isfinite(float(result.sampler.step_size))
    assert 0.1 < float(result.sampler.step_size) < 3.0
    assert int(result.adaptation_info.num_excluded) > 0
