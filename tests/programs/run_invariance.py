"""samplers.run on N simulated devices; saves the result. Usage: run_invariance.py N OUT.npz"""

import os
import sys

num_devices, out_path = int(sys.argv[1]), sys.argv[2]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

import samplers  # noqa: E402

target = samplers.targets.IllConditionedGaussian(dim=4, condition_number=10.0)
result = samplers.run(
    samplers.MALA(step_size=0.6),
    target,
    jax.random.normal(jax.random.key(3), (16, 4)),
    key=jax.random.key(0),
    num_steps=60,
    num_warmup=20,
    progress=False,
    block_size="auto",  # the bitwise mode (the default agrees to rounding)
    superchain_size=4,
)
np.savez(
    out_path,
    position=np.asarray(result.state.position),
    rhat=np.asarray(result.diagnostics.rhat),
    ess=np.asarray(result.diagnostics.ess),
    b2=np.asarray(result.diagnostics.bias_squared_max),
    acceptance=np.asarray(result.acceptance_rate),
)


# Pytree positions (a dict, one scalar and one matrix leaf): the driver ravels them once,
# so they are as invariant as flat ones.
def _pytree_logdensity(p):
    return -0.5 * (p["a"] ** 2 / 4.0 + (p["b"] ** 2).sum())


start = jax.random.normal(jax.random.key(5), (16, 5))
tree = samplers.run(
    samplers.HMC(step_size=0.4, num_integration_steps=3),
    _pytree_logdensity,
    {"a": start[:, 0], "b": start[:, 1:].reshape(16, 2, 2)},
    key=jax.random.key(1),
    num_steps=30,
    num_warmup=10,
    thin=10,
    progress=False,
    block_size="auto",  # the bitwise mode (the default agrees to rounding)
)
np.savez(
    out_path.replace(".npz", "_tree.npz"),
    a=np.asarray(tree.state.position["a"]),
    b=np.asarray(tree.state.position["b"]),
    trace_b=np.asarray(tree.trace["b"]),
    mean_b=np.asarray(tree.diagnostics.mean["b"]),
    rhat_a=np.asarray(tree.diagnostics.rhat["a"]),
)
