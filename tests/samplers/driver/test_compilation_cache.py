"""`samplers.enable_compilation_cache`: a second fresh process loads what the first compiled."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax

import samplers

PROGRAM = Path(__file__).parents[2] / "programs" / "cached_run.py"
ROOT = Path(__file__).resolve().parents[3]


def _fresh_process(cache: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, str(PROGRAM), str(cache)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_hits_the_cache(tmp_path):
    """The first process compiles and writes entries (misses, no hits); the second, with
    the same programs, finds every one of them (hits, no misses) and writes nothing new."""
    cache = tmp_path / "jax"
    first = _fresh_process(cache)
    files = sorted(p.name for p in cache.iterdir())
    assert first["misses"] > 0 and first["hits"] == 0 and files
    second = _fresh_process(cache)
    assert second["hits"] >= first["misses"] and second["misses"] == 0, (first, second)
    assert sorted(p.name for p in cache.iterdir()) == files


def test_default_folder_and_options(tmp_path, monkeypatch):
    """The default folder follows XDG_CACHE_HOME, and the three public options are set.

    The options are recorded, not applied: JAX decides once per process whether to use the
    cache, so turning it on here would change every later test's compilations.
    """
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert samplers.default_cache_dir() == tmp_path / "ensemblenn" / "jax"
    updates = {}
    monkeypatch.setattr(jax.config, "update", lambda name, value: updates.__setitem__(name, value))
    path = samplers.enable_compilation_cache()
    assert path == tmp_path / "ensemblenn" / "jax" and path.is_dir()
    assert updates == {
        "jax_compilation_cache_dir": str(path),
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
