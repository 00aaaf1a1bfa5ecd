"""JAX's persistent compilation cache, on by default: each program compiles once per
machine, not once per process.

A sampler run is a handful of large XLA programs whose compilation takes most of a fresh
process's first call. JAX can keep compiled executables on disk (its persistent
compilation cache), keyed by the program, the JAX/XLA versions and the devices, so a later
process with the same configuration loads them instead of compiling.

The rule (`samplers.run` applies it before its first program): a folder the user gave JAX
(`JAX_COMPILATION_CACHE_DIR` or `jax.config.update("jax_compilation_cache_dir", ...)`)
wins; else `ENSEMBLENN_COMPILATION_CACHE` decides (`off` for no cache, or a folder);
else `samplers.enable_compilation_cache(False)` turns the default off for the process;
else the per-user `default_cache_dir()` is used.
"""

import os
import threading
from pathlib import Path
from typing import Literal

import jax
from jax.experimental.compilation_cache import compilation_cache as _jax_cache

__all__ = ["default_cache_dir", "enable_compilation_cache", "use_default_cache"]

ENV = "ENSEMBLENN_COMPILATION_CACHE"
_lock = threading.Lock()
_decided = False  # the default applied (or declined) once per process


def default_cache_dir() -> Path:
    """The per-user cache folder: `$XDG_CACHE_HOME/ensemblenn/jax`, else
    `~/.cache/ensemblenn/jax`.

    Example:
        >>> import samplers
        >>> samplers.default_cache_dir().parts[-2:]
        ('ensemblenn', 'jax')
    """
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ensemblenn" / "jax"


def enable_compilation_cache(path: str | os.PathLike | None | Literal[False] = None) -> Path | None:
    """Turn on JAX's persistent compilation cache in `path`, for every program however
    quick to compile or small; or, with `False`, keep `samplers.run` from turning it on.

    `samplers.run` turns the cache on by itself (in `default_cache_dir()`, unless JAX
    already has a cache folder or `ENSEMBLENN_COMPILATION_CACHE=off`), so most programs
    never call this. Call it to choose another folder, or with `False` to opt out for the
    process. It sets the public JAX options `jax_compilation_cache_dir`,
    `jax_persistent_cache_min_compile_time_secs` (0) and
    `jax_persistent_cache_min_entry_size_bytes` (0). Entries are keyed by program,
    versions and devices, so several processes can share the folder: one that reads an
    entry another is still writing gets JAX's warning ("Error reading persistent
    compilation cache entry") and compiles instead. The folder can be deleted at any time
    and grows without bound (JAX's `jax_compilation_cache_max_size` caps it, and locks
    its entries, where the `filelock` package is installed).

    Args:
        path: the cache folder (created if missing); None for `default_cache_dir()`;
            False for no cache by default.

    Returns:
        The cache folder, or None with `False`.

    Example:
        At the top of a program, before its first compilation (not run here: a test
        process keeps its own cache):

        >>> import samplers
        >>> samplers.enable_compilation_cache("/tmp/my-jax-cache")  # doctest: +SKIP
        PosixPath('/tmp/my-jax-cache')
        >>> samplers.enable_compilation_cache(False)  # doctest: +SKIP
        >>> samplers.default_cache_dir().name
        'jax'
    """
    global _decided
    with _lock:
        _decided = True
    if path is False:
        return None
    folder = Path(path).expanduser() if path is not None else default_cache_dir()
    _turn_on(folder)
    return folder


def use_default_cache() -> Path | None:
    """Apply the module's rule once per process (see above); the folder in use, if any.

    JAX opens its cache at the first compilation that finds a folder set, so setting it
    here, after the script compiled its initial positions, still counts (tested).
    """
    global _decided
    with _lock:
        if _decided:
            return None
        _decided = True
    if jax.config.jax_compilation_cache_dir:  # the user's own choice
        return Path(jax.config.jax_compilation_cache_dir)
    choice = os.environ.get(ENV, "").strip()
    if choice.lower() in ("off", "0", "false", "no"):
        return None
    folder = Path(choice).expanduser() if choice else default_cache_dir()
    try:
        _turn_on(folder)
    except OSError:  # a read-only home: run without the cache rather than fail
        return None
    return folder


def _turn_on(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _jax_cache.reset_cache()  # a cache already open elsewhere: reopen it in `folder`
