"""Tests and doctests run on 4 simulated CPU devices, set before jax is imported."""

import os
import shutil
from pathlib import Path

NUM_DEVICES = 4
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={NUM_DEVICES}"
    )
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# JAX's persistent compilation cache for the whole suite, its subprocesses included (the
# CLI, the device-count programs, the benchmark smoke runs): many tests compile the same
# programs in different processes, and compilation is most of the suite's time. Entries
# are keyed by the program and the JAX/jaxlib version, so a stale hit cannot happen; every
# program is cached (JAX's default skips those compiled in under 1 s, most of ours). Set
# JAX_COMPILATION_CACHE_DIR to use another folder, or ENSEMBLENN_TEST_JAX_CACHE=off for none.
_TEST_CACHE = Path(__file__).resolve().parent / "build" / "test-jax-cache"
_TEST_CACHE_LIMIT = 2 * 1024**3  # bytes; a fuller folder is emptied when a session starts
if os.environ.get("ENSEMBLENN_TEST_JAX_CACHE", "on") != "off":
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_TEST_CACHE))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
    # JAX's own size limit needs the `filelock` package; the controller (not an xdist
    # worker, which may already be writing) prunes instead.
    if "PYTEST_XDIST_WORKER" not in os.environ and _TEST_CACHE.is_dir():
        if sum(f.stat().st_size for f in _TEST_CACHE.iterdir()) > _TEST_CACHE_LIMIT:
            shutil.rmtree(_TEST_CACHE, ignore_errors=True)


import gc  # noqa: E402

# The modules that take longest (CI's --durations, worker-seconds), handed to the xdist
# workers first, longest first: a long module started last leaves the other worker idle.
# The rest keep pytest's order. (xdist's own reordering sorts by number of tests instead.)
_LONGEST_FIRST = (
    "tests/test_benchmarks.py",
    "tests/samplers/models/test_hierarchical.py",
    "tests/samplers/adaptation/test_window_adaptation.py",
    "tests/test_docs.py",
    "tests/samplers/test_cli.py",
    "tests/samplers/driver/test_bias_tracking.py",
    "tests/samplers/adaptation/test_laps.py",
    "tests/samplers/models/test_pytree_models.py",
    "tests/samplers/adaptation/test_chees_meads.py",
    "tests/samplers/ensembles/test_deep_ensembles.py",
    "tests/samplers/kernels/test_nuts.py",
    "tests/samplers/checkpoint/test_multiprocess.py",
)

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


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
