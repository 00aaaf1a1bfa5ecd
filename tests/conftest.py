"""Every test runs on 4 simulated CPU devices: a 1-device mesh hides the bugs we fix."""

import os

NUM_DEVICES = 4
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={NUM_DEVICES}"
    )
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import AxisType  # noqa: E402

assert jax.device_count() == NUM_DEVICES, "conftest must run before jax is imported elsewhere"


@pytest.fixture(params=["explicit", "auto"])
def mesh(request):
    """A 4-device 1-D mesh named 'chains', Explicit and Auto."""
    kind = AxisType.Explicit if request.param == "explicit" else AxisType.Auto
    return jax.make_mesh((NUM_DEVICES,), ("chains",), axis_types=(kind,))


@pytest.fixture
def explicit_mesh():
    return jax.make_mesh((NUM_DEVICES,), ("chains",), axis_types=(AxisType.Explicit,))


@pytest.fixture
def auto_mesh():
    return jax.make_mesh((NUM_DEVICES,), ("chains",), axis_types=(AxisType.Auto,))


# Scripts run in subprocesses by the tests (each sets its own device count): not test modules.
collect_ignore_glob = ["programs/*"]
