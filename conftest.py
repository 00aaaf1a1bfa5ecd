"""Tests and doctests run on 4 simulated CPU devices, set before jax is imported."""

import os

NUM_DEVICES = 4
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={NUM_DEVICES}"
    )
os.environ.setdefault("JAX_PLATFORMS", "cpu")
