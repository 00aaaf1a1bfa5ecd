"""MEADS adaptation on N simulated devices; saves the tuned GHMC and the final positions.

Usage: python meads_invariance.py NUM_DEVICES OUT.npz   (run in a fresh process per N)
"""

import os
import sys

num_devices, out_path = int(sys.argv[1]), sys.argv[2]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

import samplers  # noqa: E402

# 32 chains: 32, 16 and 8 per device on 1, 2 and 4 devices; 4 folds of 8.
target = samplers.targets.IllConditionedGaussian(dim=20, condition_number=100.0)
result = samplers.run(
    None,
    target,
    jax.random.normal(jax.random.key(0), (32, 20)),
    key=jax.random.key(1),
    num_steps=5,
    adaptation=samplers.MEADS(num_steps=20),
    mesh=jax.make_mesh((num_devices,), ("chains",)),
    progress=False,
    block_size="auto",  # the bitwise mode (the default agrees to rounding)
)
# The tuned GHMC's arrays (step size, damping, inverse mass matrix) and the positions.
leaves = jax.tree.leaves(result.sampler) + [result.state.position]
np.savez(out_path, *[np.asarray(leaf) for leaf in leaves])
