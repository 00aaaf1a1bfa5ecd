"""Run a small LAPS adaptation on N simulated devices and save what it tuned and where the
chains ended.

Usage: python laps_invariance.py NUM_DEVICES OUT.npz BLOCK_SIZE   (a fresh process per N)

`samplers.run` with LAPS (60 + 8 adaptation steps, then 12 sampling steps), made in
float32 and then in float64; keys are prefixed `float32_` and `float64_`. BLOCK_SIZE is
`samplers.run`'s `block_size` (an int, `auto` or `none`).
"""

import os
import sys

num_devices, out_path = int(sys.argv[1]), sys.argv[2]
BLOCK = (
    {"none": None, "auto": "auto"}[sys.argv[3]]
    if sys.argv[3] in ("none", "auto")
    else int(sys.argv[3])
)
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import samplers  # noqa: E402

NUM_CHAINS, DIM = 16, 8  # 16, 8, 4 and 2 chains per device
VARIANCES = np.logspace(0.0, 1.0, DIM)  # condition number 10; numpy: a compile-time constant


def target(x):
    return -0.5 * jnp.sum(x * x / VARIANCES.astype(x.dtype))


def run(dtype: str) -> dict:
    jax.config.update("jax_enable_x64", dtype == "float64")
    positions = np.random.default_rng(3).standard_normal((NUM_CHAINS, DIM)).astype(dtype)
    laps = samplers.LAPS(num_steps1=60, num_adaptation_steps=8, superchain_size=4)
    mesh = jax.make_mesh((num_devices,), ("chains",))
    result = samplers.run(
        None,
        target,
        positions,
        key=jax.random.key(7),
        num_steps=12,
        adaptation=laps,
        mesh=mesh,
        superchain_size=4,
        progress=False,
        block_size=BLOCK,
    )
    tuned, info = result.sampler, result.adaptation_info
    saved = {
        "position": result.state.position,
        "logdensity": result.state.logdensity,
        "mean": result.diagnostics.mean,
        "step_size": tuned.step_size,
        "num_integration_steps": tuned.num_integration_steps,
        "inverse_mass_matrix": tuned.inverse_mass_matrix,
        "num_steps1": info.num_steps1,
        "step_size1": info.step_size1,
        "L": info.L,
        "step_size_history1": info.step_size_history1,
        "step_size_history2": info.step_size_history2,
        "acceptance_history2": info.acceptance_history2,
        "nested_rhat2": info.nested_rhat2,
    }
    return {f"{dtype}_{name}": np.asarray(value) for name, value in saved.items()}


np.savez(out_path, **run("float32"), **run("float64"))
