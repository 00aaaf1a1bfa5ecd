"""A process with ONE device (where `shard_map` hands its per-chain outputs back as `P()`):
a buffer donated call after call must be taken by each call (the caller's buffer, not a
copy), and an output passed back in is not put on the mesh again (a dispatch per leaf per
call). Prints one JSON line."""

import json
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import ensemblenn as enn  # noqa: E402

f = enn.ensemble_map(
    lambda buffer, value, slot: buffer.at[slot].set(value),
    in_roles=(enn.PER_CHAIN, enn.PER_CHAIN, enn.BROADCAST),
    out_roles=enn.PER_CHAIN,
    donate_argnums=0,
)
first = f(jnp.zeros((8, 3)), jnp.arange(8.0), 0)
put, placed = jax.device_put, []
jax.device_put = lambda x, *a, **k: placed.append(x is first) or put(x, *a, **k)
second = f(first, jnp.arange(8.0), 1)
jax.device_put = put
print(
    json.dumps(
        {
            "devices": jax.device_count(),
            "first_taken": first.is_deleted(),
            "first_put_again": any(placed),
            "values": np.asarray(second).tolist(),
        }
    )
)
