"""WindowAdaptation's repair of chains stuck far from the ensemble, on 4 simulated devices.

The trap: a 2-d Gaussian mixture whose second component (weight e^-12, at x = (12, 12))
holds chains started there behind a barrier no HMC trajectory of the tuned length crosses;
their log density lies ~12 below the others'. 32 chains, 8 of them started in the trap.
"""

import jax
import jax.numpy as jnp
import numpy as np

import samplers

TRAP = jnp.array([12.0, 12.0])


def trap(x):
    main = -0.5 * jnp.sum(x**2)
    far = -12.0 - 0.5 * jnp.sum((x - TRAP) ** 2)
    return jnp.logaddexp(main, far)


def _run(mesh, **kwargs):
    x0 = np.asarray(0.5 * jax.random.normal(jax.random.key(0), (32, 2))).copy()
    x0[::4] += np.asarray(TRAP)  # chains 0, 4, .., 28 start in the trap
    return samplers.run(
        samplers.HMC(step_size=0.1, num_integration_steps=5),
        trap,
        x0,
        key=jax.random.key(1),
        num_steps=20,
        adaptation=samplers.WindowAdaptation(num_steps=150, **kwargs),
        mesh=mesh,
        progress=False,
    )


def test_stuck_chains_are_repaired_and_reported(explicit_mesh):
    result = _run(explicit_mesh)
    info = result.adaptation_info
    assert int(info.num_repaired) >= 8, int(info.num_repaired)
    distance = np.linalg.norm(np.asarray(result.state.position) - np.asarray(TRAP), axis=1)
    assert np.all(distance > 6.0), distance  # every chain ends in the main component
    # The metric comes from the main component's draws (variance 1), not the trap's spread.
    ratio = np.asarray(result.sampler.inverse_mass_matrix)
    assert np.all((ratio > 0.5) & (ratio < 2.0)), ratio
    assert "chains repaired" in result.summary(print_it=False)


def test_repair_false_leaves_them(explicit_mesh):
    result = _run(explicit_mesh, repair=False)
    assert int(result.adaptation_info.num_repaired) == 0
    distance = np.linalg.norm(np.asarray(result.state.position) - np.asarray(TRAP), axis=1)
    assert np.sum(distance < 6.0) == 8  # still trapped


def test_no_repairs_on_a_plain_gaussian(auto_mesh):
    target = samplers.targets.IllConditionedGaussian(dim=10, condition_number=10.0)
    x0 = jax.random.normal(jax.random.key(0), (32, 10))
    for kernel in (samplers.HMC(0.1, 5), samplers.MALA(0.1)):
        result = samplers.run(
            kernel,
            target,
            x0,
            key=jax.random.key(1),
            num_steps=5,
            adaptation=samplers.WindowAdaptation(num_steps=200),
            mesh=auto_mesh,
            progress=False,
        )
        assert int(result.adaptation_info.num_repaired) == 0, kernel


def test_nanmedian_is_jnp_nanmedian_to_the_bit():
    """The repair's lean median gives `jnp.nanmedian`'s bits (odd and even counts, NaNs
    anywhere, none left), eagerly and compiled."""
    from samplers.adaptation._window_repair import nanmedian  # private: the helper alone

    rng = np.random.default_rng(0)
    compiled = jax.jit(nanmedian)
    for trial in range(300):
        n = int(rng.integers(1, 40))
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4)).astype(np.float32)
        x[rng.random(n) < rng.random()] = np.nan
        want = np.asarray(jnp.nanmedian(jnp.asarray(x)))
        for got in (nanmedian(jnp.asarray(x)), compiled(jnp.asarray(x))):
            assert np.asarray(got).tobytes() == want.tobytes(), (trial, x, got, want)
