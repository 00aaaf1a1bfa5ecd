"""samplers.run with NUTS on N simulated devices; saves the result.

Usage: nuts_invariance.py N OUT.npz
"""

import os
import sys

num_devices, out_path = int(sys.argv[1]), sys.argv[2]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

import samplers  # noqa: E402

target = samplers.targets.IllConditionedGaussian(dim=4, condition_number=10.0)
# Chains' tree depths differ, so the per-chain while loops run different trip counts in
# one block: the lockstep under vmap must not leak one chain's trajectory into another's.
result = samplers.run(
    samplers.NUTS(step_size=0.4, inverse_mass_matrix=target.variances, max_tree_depth=6),
    target,
    jax.random.normal(jax.random.key(3), (16, 4)),
    key=jax.random.key(0),
    num_steps=30,
    num_warmup=10,
    progress=False,
    block_size="auto",  # the bitwise mode (the default agrees to rounding)
)
np.savez(
    out_path,
    position=np.asarray(result.state.position),
    num_grads=np.asarray(result.num_grads),
    acceptance=np.asarray(result.acceptance_rate),
    divergent=np.asarray(result.num_divergent),
    rhat=np.asarray(result.diagnostics.rhat),
    ess=np.asarray(result.diagnostics.ess),
)
