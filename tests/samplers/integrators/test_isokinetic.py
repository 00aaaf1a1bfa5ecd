"""The isokinetic integrators (samplers.integrators.isokinetic): the velocity flow checked
against its ODE, unit velocity kept, and the gradients each integrator counts."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import samplers
import samplers.integrators.isokinetic as iso

DIM = 10


def test_velocity_update_solves_the_isokinetic_ode_and_keeps_unit_norm():
    with jax.enable_x64(True):
        key_u, key_g = jax.random.split(jax.random.key(0))
        u = iso.random_unit_vector(DIM, key_u, jnp.float64)
        grad = 3.0 * jax.random.normal(key_g, (DIM,), jnp.float64)
        imm = jnp.linspace(0.5, 2.0, DIM, dtype=jnp.float64)
        g = jnp.sqrt(imm) * grad
        # du/dt at t=0 must be (I - u u^T) g / (d - 1).
        h = 1e-6
        u_plus, _ = iso.isokinetic_velocity_update(u, grad, h, imm)
        u_minus, _ = iso.isokinetic_velocity_update(u, grad, -h, imm)
        expected = (g - jnp.dot(u, g) * u) / (DIM - 1)
        np.testing.assert_allclose((u_plus - u_minus) / (2 * h), expected, rtol=1e-6, atol=1e-8)
        # The kinetic change grows at rate |g| cos(angle(u, g)) = u.g (so the total energy
        # K - log p is conserved by the exact flow, where dx/dt = sqrt(m) u).
        _, dk_plus = iso.isokinetic_velocity_update(u, grad, h, imm)
        _, dk_minus = iso.isokinetic_velocity_update(u, grad, -h, imm)
        np.testing.assert_allclose((dk_plus - dk_minus) / (2 * h), jnp.dot(u, g), rtol=1e-6)
        # Flows compose: t then s equals t + s.
        u1, k1 = iso.isokinetic_velocity_update(u, grad, 0.3, imm)
        u2, k2 = iso.isokinetic_velocity_update(u1, grad, 0.5, imm)
        u3, k3 = iso.isokinetic_velocity_update(u, grad, 0.8, imm)
        np.testing.assert_allclose(u2, u3, atol=1e-12)
        np.testing.assert_allclose(k1 + k2, k3, rtol=1e-12)
    # float32 with huge steps: still finite and unit norm (no cosh/sinh overflow).
    for step in [1e-3, 1.0, 1e2, 1e4]:
        new_u, dk = iso.isokinetic_velocity_update(
            u.astype(jnp.float32), grad.astype(jnp.float32), step
        )
        assert bool(jnp.isfinite(dk))
        np.testing.assert_allclose(jnp.linalg.norm(new_u), 1.0, atol=1e-6)


@pytest.mark.parametrize("dim", [2, 10])
def test_velocity_flow_against_the_gradient_stays_finite_and_exact(dim):
    """u (almost) opposite to the whitened gradient with a large delta, in float32: the case
    where 1 + u.e cancels and exp(-2 delta) underflows. The update used to be 0/0 there (a
    NaN proposal, i.e. a spurious divergence: ~3 per million banana steps in 2-D)."""
    e = jnp.zeros(dim, jnp.float32).at[0].set(1.0)
    grad = 80.0 * e  # delta = step * |g| / (d - 1)
    step = 2.0 * (dim - 1)  # delta = 160: exp(-2 delta) is 0 in float32
    delta = step * 80.0 / (dim - 1)
    # Exactly opposite: the flow's fixed point, and the kinetic change is -(d - 1) delta.
    u, dk = iso.isokinetic_velocity_update(-e, grad, step)
    np.testing.assert_array_equal(u, -e)
    np.testing.assert_allclose(dk, -(dim - 1) * delta, rtol=1e-6)
    # 1e-3 rad away (1 + c = 5e-7, where 1 + jnp.dot(e, u) keeps one digit): the exact flow
    # turns u to +e, and (d - 1) log(cosh delta + c sinh delta) = (d - 1) (delta +
    # log((1 + c) / 2)) to float32 accuracy, with 1 + c = 2 sin^2(angle / 2) from float64.
    angle = 1e-3
    u0 = jnp.zeros(dim, jnp.float32).at[0].set(-math.cos(angle)).at[1].set(math.sin(angle))
    u, dk = iso.isokinetic_velocity_update(u0, grad, step)
    np.testing.assert_allclose(u, e, atol=1e-6)
    one_plus_c = 2.0 * math.sin(angle / 2) ** 2
    expected = (dim - 1) * (delta + math.log(one_plus_c / 2))
    np.testing.assert_allclose(dk, expected, rtol=1e-5)


@pytest.mark.parametrize("name,grads", [("leapfrog", 1), ("mclachlan", 2), ("omelyan", 4)])
def test_integrators_keep_unit_velocity_and_count_gradients(name, grads):
    integrator = iso.get_integrator(name)
    assert integrator.grads_per_step == grads
    assert samplers.MCLMC(0.1, 1.0, integrator=name).grads_per_step == grads
    assert samplers.AdjustedMCLMC(0.1, 5, integrator=name).grads_per_step == 5 * grads
    calls = []

    def banana(x):  # non-Gaussian, so the gradient direction keeps changing
        calls.append(1)
        return -0.5 * (x[0] ** 2 / 4 + jnp.sum((x[1:] - 0.3 * x[0] ** 2) ** 2))

    x = jnp.ones(DIM)
    state = iso.IntegratorState(
        x, iso.random_unit_vector(DIM, jax.random.key(1)), banana(x), jax.grad(banana)(x)
    )
    calls.clear()
    iso.get_integrator(name)(banana, state, 0.1)  # eager: counts evaluations
    assert len(calls) == grads

    @jax.jit
    def many(state):
        def body(s, _):
            s, _ = integrator(banana, s, 0.2, jnp.linspace(0.5, 2.0, DIM))
            return s, jnp.linalg.norm(s.velocity)

        return jax.lax.scan(body, state, None, length=300)

    final, norms = many(state)
    assert bool(jnp.all(jnp.isfinite(final.position)))
    np.testing.assert_allclose(norms, 1.0, atol=1e-5)
