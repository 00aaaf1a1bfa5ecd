"""samplers.smc.resample on N simulated devices, every scheme, Auto and Explicit meshes;
saves the ancestors and particles. Usage: resampling_invariance.py N OUT.npz"""

import os
import sys

num_devices, out_path = int(sys.argv[1]), sys.argv[2]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType  # noqa: E402

import ensemblenn as enn  # noqa: E402
from samplers.smc import SCHEMES, ancestors, resample  # noqa: E402

N = 64
rng = np.random.default_rng(0)
# Spread-out weights (many boundaries near slot edges), a few impossible particles.
log_weights = jnp.asarray(3.0 * rng.standard_normal(N), jnp.float32).at[::9].set(-jnp.inf)
particles = {
    "x": jnp.asarray(rng.standard_normal((N, 3)), jnp.float32),
    "n": jnp.arange(N, dtype=jnp.int32) * 7,
}


def body(key, lw, p):
    out = {}
    for scheme in SCHEMES:  # one program for every scheme
        new, ancestor = resample(key, lw, p, scheme=scheme)
        # Something computed after the gather, to catch a fusion that rounds differently.
        out[scheme] = (new, ancestor, new["x"] * lw)
    return out


pure = jax.jit(lambda key, lw: {s: ancestors(key, lw, s) for s in SCHEMES})
saved = {}
for kind in (AxisType.Auto, AxisType.Explicit):
    mesh = jax.make_mesh((num_devices,), ("chains",), axis_types=(kind,))
    step = enn.ensemble_map(body, mesh=mesh, in_roles=(enn.BROADCAST, enn.PER_CHAIN, enn.PER_CHAIN))
    for seed in range(3):
        key = jax.random.key(seed)
        results, alone = step(key, log_weights, particles), pure(key, log_weights)
        for scheme, (new, ancestor, scaled) in results.items():
            tag = f"{kind.name}_{scheme}_{seed}"
            saved[f"{tag}_x"] = np.asarray(new["x"])
            saved[f"{tag}_n"] = np.asarray(new["n"])
            saved[f"{tag}_ancestor"] = np.asarray(ancestor)
            saved[f"{tag}_scaled"] = np.asarray(scaled)
            saved[f"{tag}_pure"] = np.asarray(alone[scheme])
np.savez(out_path, **saved)
