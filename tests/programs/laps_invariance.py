"""Run a small LAPS ensemble on N simulated devices and save what it tuned and sampled.

Usage: python laps_invariance.py NUM_DEVICES OUT.npz   (a fresh process per N)

The same run is made in float32 and then in float64; keys are prefixed `float32_` and
`float64_`.
"""

import os
import sys

num_devices, out_path = int(sys.argv[1]), sys.argv[2]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

import samplers  # noqa: E402

NUM_CHAINS, DIM = 16, 8  # 16, 8, 4 and 2 chains per device


def run(dtype: str) -> dict:
    jax.config.update("jax_enable_x64", dtype == "float64")
    target = samplers.targets.IllConditionedGaussian(dim=DIM, condition_number=10.0)
    positions = jax.random.normal(jax.random.key(3), (NUM_CHAINS, DIM), dtype=dtype)
    laps = samplers.LAPS(num_steps1=60, num_adaptation_steps=8, superchain_size=4)
    mesh = jax.make_mesh((num_devices,), ("chains",))
    result = samplers.run(None, target, positions, key=jax.random.key(7), num_steps=10,
                          adaptation=laps, mesh=mesh, progress=False)
    info, tuned = result.adaptation_info, result.sampler
    saved = {
        "position": result.state.position,
        "second_moment": result.diagnostics.second_moment,
        "step_size": tuned.step_size,
        "num_integration_steps": tuned.num_integration_steps,
        "inverse_mass_matrix": tuned.inverse_mass_matrix,
        "num_steps1": info.num_steps1,
        "step_size1": info.step_size1,
        "L": info.L,
        "step_size_history1": info.step_size_history1,
        "step_size_history2": info.step_size_history2,
        "nested_rhat2": info.nested_rhat2,
    }
    return {f"{dtype}_{name}": np.asarray(value) for name, value in saved.items()}


np.savez(out_path, **run("float32"), **run("float64"))
