"""Measure WindowAdaptation's acceptance over keys (not run by the tests; its numbers are
quoted in test_window_adaptation.py's budget test).

Usage: python tests/programs/window_acceptance.py gaussian|logistic mala|hmc KEY [KEY ...]

Per key: 64 chains started at N(0, 1) draws (key), 500 warmup steps, 300 sampling steps
(key + 1) on 4 simulated devices, an Explicit mesh; prints the ensemble-mean acceptance
and the tuned step size.
"""

import os
import sys
import warnings

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType  # noqa: E402

import samplers  # noqa: E402

warnings.simplefilter("ignore", samplers.ConvergenceWarning)  # 300 steps: not the point
target_name, kernel_name, keys = sys.argv[1], sys.argv[2], [int(k) for k in sys.argv[3:]]
mesh = jax.make_mesh((4,), ("chains",), axis_types=(AxisType.Explicit,))
if target_name == "gaussian":
    target = samplers.targets.IllConditionedGaussian(dim=100, condition_number=100.0)
else:
    target = samplers.targets.LogisticRegression()
kernel = {
    "mala": samplers.MALA(step_size=0.1),
    "hmc": samplers.HMC(step_size=0.1, num_integration_steps=10),
}[kernel_name]
for k in keys:
    x0 = jax.random.normal(jax.random.key(k), (64, target.dim))
    result = samplers.run(
        kernel,
        target,
        x0,
        key=jax.random.key(k + 1),
        num_steps=300,
        mesh=mesh,
        progress=False,
        adaptation=samplers.WindowAdaptation(num_steps=500),
    )
    acceptance = float(jnp.mean(result.acceptance_rate))
    print(
        f"{target_name} {kernel_name} key {k}: acceptance {acceptance:.4f}, "
        f"step size {float(result.sampler.step_size):.4f}",
        flush=True,
    )
