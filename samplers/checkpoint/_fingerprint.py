"""A run's fingerprint: a checkpoint only resumes the run whose configuration it describes."""

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from ._errors import CheckpointMismatchError


def _settings(x: Any) -> list:
    """The dataclass fields of `x` that are settings: not those marked
    `metadata={"fingerprint": False}` (what the driver attaches, such as a bias monitor)."""
    return [f for f in dataclasses.fields(x) if f.metadata.get("fingerprint") is not False]


def _describe(x: Any, h: "hashlib._Hash", depth: int = 0) -> None:
    """Feed a deterministic description of `x` into `h`: types, static fields, array
    shapes, dtypes and contents. Never `repr` of arbitrary objects, which may hold memory
    addresses that differ from process to process."""
    if depth > 64:
        h.update(b"<deep>")
        return
    if isinstance(x, jax.Array | np.ndarray | np.generic):
        dtype = x.dtype
        if jnp.issubdtype(dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        h.update(f"array{tuple(x.shape)}{dtype}".encode())
        if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
            h.update(np.ascontiguousarray(np.asarray(x)).tobytes())
        return
    if x is None or isinstance(x, bool | int | float | complex | str | bytes):
        h.update(f"{type(x).__name__}:{x!r}".encode())
        return
    if dataclasses.is_dataclass(x) and not isinstance(x, type):  # equinox modules
        h.update(f"{type(x).__module__}.{type(x).__qualname__}(".encode())
        for field in _settings(x):
            h.update(field.name.encode() + b"=")
            _describe(getattr(x, field.name, None), h, depth + 1)
        h.update(b")")
        return
    if isinstance(x, list | tuple):
        h.update(f"{type(x).__name__}[".encode())
        for item in x:
            _describe(item, h, depth + 1)
        h.update(b"]")
        return
    if isinstance(x, dict):
        h.update(b"dict{")
        for k in sorted(x, key=repr):
            h.update(repr(k).encode() + b":")
            _describe(x[k], h, depth + 1)
        h.update(b"}")
        return
    # Functions, schedules, other objects: their name only (contents cannot be compared).
    name = getattr(x, "__qualname__", type(x).__qualname__)
    h.update(f"{getattr(x, '__module__', type(x).__module__)}.{name}".encode())


def _digest(x: Any) -> str:
    h = hashlib.sha256()
    _describe(x, h)
    return h.hexdigest()[:16]


def _name(x: Any) -> str | None:
    if x is None:
        return None
    kind = x if isinstance(x, type) else type(x)
    if not dataclasses.is_dataclass(x) and callable(x):
        return getattr(x, "__qualname__", kind.__qualname__)
    return kind.__qualname__


def fingerprint(
    *,
    sampler: Any,
    adaptation: Any,
    logdensity: Any,
    positions: Any,
    key: PRNGKeyArray,
    num_steps: int,
    num_warmup: int,
    thin: int | None,
    track_bias: bool,
    block_size: int | str | None = None,
) -> dict[str, Any]:
    """A JSON-able description of a run's configuration; a checkpoint only resumes a run
    whose fingerprint is identical. `block_size` is part of it: another block size gives
    another run in the last bits, so resuming with it would break the bitwise promise.

    Class names and shapes are kept readable (they make the mismatch message); the values
    of hyperparameters, target data, initial positions and the key enter as digests.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> f = samplers.checkpoint.fingerprint(
        ...     sampler=samplers.MALA(step_size=0.1), adaptation=None, logdensity=jnp.sin,
        ...     positions=jnp.zeros((4, 2)), key=jax.random.key(0), num_steps=10,
        ...     num_warmup=0, thin=None, track_bias=False)
        >>> f["sampler"], f["num_chains"], f["dim"]
        ('MALA', 4, 2)
    """
    shape = tuple(np.shape(positions))
    return {
        "sampler": _name(sampler),
        "adaptation": _name(adaptation),
        "target": _name(logdensity),
        "num_chains": int(shape[0]),
        "dim": int(shape[1]),
        "dtype": str(jnp.result_type(positions)),
        "num_steps": int(num_steps),
        "num_warmup": int(num_warmup),
        "thin": thin,
        "track_bias": bool(track_bias),
        "block_size": block_size,
        "sampler_config": _digest(sampler),
        "adaptation_config": _digest(adaptation),
        "target_config": _digest(logdensity),
        "initial_positions": _digest(positions),
        "key": _digest(key),
    }


def check_fingerprint(saved: dict[str, Any], current: dict[str, Any], path: Path) -> None:
    differ = [k for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]
    if not differ:
        return
    readable = [k for k in differ if not k.endswith(("_config", "positions")) and k != "key"]
    lines = [
        f"  {k}: {saved.get(k)!r} in the checkpoint, {current.get(k)!r} in this run"
        for k in readable
    ]
    hidden = {
        "sampler_config": "the sampler's hyperparameters",
        "adaptation_config": "the adaptation's settings",
        "target_config": "the target (its parameters or data)",
        "initial_positions": "the initial positions",
        "key": "the key",
    }
    lines += [f"  {hidden[k]} differ" for k in differ if k in hidden]
    raise CheckpointMismatchError(
        f"The checkpoint {path} was written by a different run, so this run cannot resume "
        "from it:\n" + "\n".join(lines) + "\n  fix: resume with exactly the same sampler, "
        "adaptation, target, initial positions, key, num_steps, num_warmup, thin and "
        "track_bias, or pass another checkpoint_dir (or delete this one) to start afresh."
    )
