"""A fresh process that runs a short sampler and prints one JSON line: JAX's cache hits
and misses, the run's wall time, and the cache folder JAX used.

argv[1]: a folder to pass to `samplers.enable_compilation_cache`, or `default` to leave
the choice to `samplers.run` (its default rule reads the environment). The script
computes with JAX before the run, as user scripts do (their initial positions), so JAX
has already decided once whether to use a cache when `run` is called.
"""

import json
import sys
import time

import jax
import jax.numpy as jnp

import samplers

events = {"hits": 0, "misses": 0}


def listener(event: str, **_: object) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        events["hits"] += 1
    elif event == "/jax/compilation_cache/cache_misses":
        events["misses"] += 1


jax.monitoring.register_event_listener(listener)
if sys.argv[1] != "default":
    samplers.enable_compilation_cache(sys.argv[1])
positions = jax.jit(lambda x: x * 0.5)(jnp.ones((8, 3)))  # compiled before the run
target = samplers.targets.IllConditionedGaussian(dim=3, condition_number=4.0)
t0 = time.perf_counter()
result = samplers.run(
    samplers.MALA(step_size=0.5),
    target,
    positions,
    key=jax.random.key(0),
    num_steps=20,
    progress=False,
)
jax.block_until_ready(result.state.position)
folder = jax.config.jax_compilation_cache_dir
print(json.dumps(dict(events, seconds=time.perf_counter() - t0, folder=folder)))
