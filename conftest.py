"""Tests and doctests run on 4 simulated CPU devices, set before jax is imported."""

import os

NUM_DEVICES = 4
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={NUM_DEVICES}"
    )
os.environ.setdefault("JAX_PLATFORMS", "cpu")


import gc  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's compiled programs after each module.

    Each executable XLA:CPU keeps holds a few memory mappings; the whole suite in one
    process compiles thousands of programs, and past the kernel's limit
    (`vm.max_map_count`, 65530 by default) the next compilation segfaults inside XLA.
    """
    yield
    import jax

    jax.clear_caches()
    gc.collect()
