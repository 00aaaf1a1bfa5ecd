"""A fresh process that enables the compilation cache in argv[1], runs a short sampler
and prints one JSON line: JAX's cache hits and misses, and the run's wall time."""

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
samplers.enable_compilation_cache(sys.argv[1])
target = samplers.targets.IllConditionedGaussian(dim=3, condition_number=4.0)
t0 = time.perf_counter()
result = samplers.run(
    samplers.MALA(step_size=0.5),
    target,
    jnp.zeros((8, 3)),
    key=jax.random.key(0),
    num_steps=20,
    progress=False,
)
jax.block_until_ready(result.state.position)
print(json.dumps(dict(events, seconds=time.perf_counter() - t0)))
