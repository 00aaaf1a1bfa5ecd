"""JAX's persistent compilation cache: on by default in `samplers.run` (a second fresh
process loads what the first compiled), the user's own folder wins, and opting out works."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax

import samplers

PROGRAM = Path(__file__).parents[2] / "programs" / "cached_run.py"
ROOT = Path(__file__).resolve().parents[3]


def _fresh_process(cache: Path | str, **env_vars: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    # The suite's own cache folder (conftest.py) would count as the user's choice.
    for name in ("JAX_COMPILATION_CACHE_DIR", "ENSEMBLENN_COMPILATION_CACHE"):
        env.pop(name, None)
    env.update(env_vars)
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


def test_run_turns_the_cache_on_by_default(tmp_path):
    """No call and no setting: `samplers.run` uses the per-user folder (here under
    XDG_CACHE_HOME), although the script compiled before the run; a second process hits."""
    home = dict(XDG_CACHE_HOME=str(tmp_path))
    first = _fresh_process("default", **home)
    folder = tmp_path / "ensemblenn" / "jax"
    assert first["folder"] == str(folder) and first["misses"] > 0, first
    files = sorted(p.name for p in folder.iterdir())
    second = _fresh_process("default", **home)
    assert second["hits"] >= first["misses"] and second["misses"] == 0, (first, second)
    assert sorted(p.name for p in folder.iterdir()) == files


def test_the_users_folder_wins_and_opting_out_works(tmp_path):
    mine = tmp_path / "mine"
    got = _fresh_process("default", XDG_CACHE_HOME=str(tmp_path),
                         JAX_COMPILATION_CACHE_DIR=str(mine))  # fmt: skip
    assert got["folder"] == str(mine) and any(mine.iterdir())
    assert not (tmp_path / "ensemblenn").exists()
    off = _fresh_process("default", XDG_CACHE_HOME=str(tmp_path / "off"),
                         ENSEMBLENN_COMPILATION_CACHE="off")  # fmt: skip
    assert off["folder"] is None and off["hits"] == off["misses"] == 0
    assert not (tmp_path / "off").exists()


def test_opting_out_by_argument(monkeypatch):
    """`enable_compilation_cache(False)` sets nothing, and `run`'s default then does not
    either (the options are recorded, not applied, as above)."""
    from samplers import _compilation_cache  # private: its once-per-process flag, reset here

    monkeypatch.setattr(_compilation_cache, "_decided", False)
    updates = {}
    monkeypatch.setattr(jax.config, "update", lambda name, value: updates.__setitem__(name, value))
    assert samplers.enable_compilation_cache(False) is None
    assert _compilation_cache.use_default_cache() is None and updates == {}
