"""`samplers.enable_compilation_cache`: compile each program once per machine, not per process.

A sampler run is a handful of large XLA programs whose compilation takes most of a fresh
process's first call. JAX can keep compiled executables on disk (its persistent
compilation cache), keyed by the program, the JAX/XLA versions and the devices, so a later
process with the same configuration loads them instead of compiling.
"""

import os
from pathlib import Path

import jax

__all__ = ["default_cache_dir", "enable_compilation_cache"]


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


def enable_compilation_cache(path: str | os.PathLike | None = None) -> Path:
    """Turn on JAX's persistent compilation cache, in `path` (default: the per-user
    `default_cache_dir()`), for every program, however quick to compile or small.

    Call it at the start of a program, before the first JAX computation: JAX decides
    whether to use the cache when it first compiles, and keeps that decision for the
    process. It sets the public JAX options `jax_compilation_cache_dir`,
    `jax_persistent_cache_min_compile_time_secs` (0) and
    `jax_persistent_cache_min_entry_size_bytes` (0); the cache is safe to share between
    runs and processes (entries are keyed by program, versions and devices), and can be
    deleted at any time.

    Args:
        path: the cache folder (created if missing); None for `default_cache_dir()`.

    Returns:
        The cache folder.

    Example:
        At the top of a program (not run here: JAX keeps its first decision for the whole
        process, so a test process must not turn the cache on):

        >>> import samplers
        >>> samplers.enable_compilation_cache()  # doctest: +SKIP
        PosixPath('/home/me/.cache/ensemblenn/jax')
        >>> samplers.default_cache_dir().name
        'jax'
    """
    folder = Path(path).expanduser() if path is not None else default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder
