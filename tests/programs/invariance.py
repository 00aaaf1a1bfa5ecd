"""Run a small ensemble program on N simulated devices and save its outputs.

Usage: python invariance.py NUM_DEVICES OUT.npz   (run in a fresh process per N)
"""

import os
import sys

num_devices, out_path = int(sys.argv[1]), sys.argv[2]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import ensemblenn as enn  # noqa: E402

NUM_CHAINS, DIM, STEPS = 24, 5, 60  # 24 chains: 3 per device on 8 devices (not a power of 2)


def walk(x, key):
    reductions = (enn.chain_sum(x), enn.chain_mean(x**2), enn.chain_all_gather(x))

    def step(carry, t):
        x, mean_track = carry
        k = jax.random.fold_in(key, t)
        centre = enn.chain_mean(x)
        spread = enn.chain_sum((x - centre) ** 2) / enn.num_chains()
        x = x - 0.1 * (x - centre) / jnp.sqrt(spread + 1.0) + 0.3 * jax.random.normal(k, x.shape)
        return (x, mean_track + centre), None

    (x, track), _ = jax.lax.scan(step, (x, jnp.zeros(DIM)), jnp.arange(STEPS))
    return x, track, enn.chain_all_gather(x).sum(0), enn.chain_index(), reductions


mesh = jax.make_mesh((num_devices,), ("chains",))
typed = enn.chain_keys(jax.random.key(42), NUM_CHAINS)
raw = enn.chain_keys(jax.random.PRNGKey(42), NUM_CHAINS)
x0 = jax.random.normal(jax.random.key(1), (NUM_CHAINS, DIM))
f = enn.ensemble_map(walk, mesh=mesh, in_roles=enn.PER_CHAIN)
x, track, gathered, index, (sum24, msq24, all24) = f(x0, typed)
x8, track8, _, _, (sum16, msq16, _) = f(x0[:16], typed[:16])  # a power of two per device
np.savez(
    out_path,
    typed=np.asarray(jax.random.key_data(typed)),
    raw=np.asarray(raw),
    x=np.asarray(x),
    track=np.asarray(track),
    gathered=np.asarray(gathered),
    index=np.asarray(index),
    x16=np.asarray(x8),
    track16=np.asarray(track8),
    sum24=np.asarray(sum24),
    msq24=np.asarray(msq24),
    all24=np.asarray(all24),
    sum16=np.asarray(sum16),
    msq16=np.asarray(msq16),
)
