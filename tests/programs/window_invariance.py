"""Run a small WindowAdaptation on N simulated devices and save what it tuned and where the
chains ended.

Usage: python window_invariance.py NUM_DEVICES OUT.npz [METRIC]   (a fresh process per N;
METRIC: WindowAdaptation's metric, default diagonal)

`samplers.run` with HMC + WindowAdaptation (METRIC, 120 warmup steps: every
schedule phase and the step-size heuristic) then 10 sampling steps, 16 chains in 8-d,
one chain started where the log density is -inf (so the restart path runs too).
"""

import os
import sys

num_devices, out_path = int(sys.argv[1]), sys.argv[2]
metric = sys.argv[3] if len(sys.argv) > 3 else "diagonal"
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import samplers  # noqa: E402

NUM_CHAINS, DIM = 16, 8  # 16, 8, 4 and 2 chains per device
VARIANCES = np.logspace(0.0, 1.0, DIM)  # condition number 10; numpy: a compile-time constant


def target(x):
    logp = -0.5 * jnp.sum(x * x / VARIANCES.astype(x.dtype))
    return jnp.where(x[0] > 4.0, -jnp.inf, logp)


positions = np.random.default_rng(3).standard_normal((NUM_CHAINS, DIM)).astype(np.float32)
positions[5, 0] = 6.0  # starts outside the support
mesh = jax.make_mesh((num_devices,), ("chains",))
result = samplers.run(
    samplers.HMC(step_size=0.1, num_integration_steps=4),
    target,
    positions,
    key=jax.random.key(7),
    num_steps=10,
    adaptation=samplers.WindowAdaptation(num_steps=120, metric=metric),
    mesh=mesh,
    progress=False,
    block_size="auto",  # the bitwise mode (the default agrees to rounding)
)
tuned, info = result.sampler, result.adaptation_info
saved = {
    "position": result.state.position,
    "logdensity": result.state.logdensity,
    "mean": result.diagnostics.mean,
    "step_size": tuned.step_size,
    "inverse_mass_matrix": tuned.inverse_mass_matrix,
    "step_size_history": info.step_size_history,
    "acceptance_history": info.acceptance_history,
    "num_excluded": info.num_excluded,
    "num_restarted": info.num_restarted,
    "num_grads": info.num_grads,
}
np.savez(out_path, **{name: np.asarray(value) for name, value in saved.items()})
