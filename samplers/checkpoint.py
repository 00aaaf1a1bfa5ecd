"""Checkpoint and resume for `samplers.run`.

`samplers.run(..., checkpoint_dir=DIR, checkpoint_every=K, resume=True)` writes everything
the run needs to carry on into one file, `DIR/checkpoint.enn`: every chain's state, the run's
per-chain keys and the global step (the driver draws step `t`'s randomness as
`fold_in(chain_key, t)`, so nothing else about the random stream is needed), the tuned
sampler, the streaming moments and counters, the trace and b² history so far, the adaptation
report, and a fingerprint of the run configuration. A resumed run skips initialisation and
adaptation and continues from the saved step, so on the same device count its result is
bitwise the one an uninterrupted run gives (and equal to float precision on another device
count: arrays are saved as host arrays and re-placed on whatever mesh the new run uses).

The file is written atomically: to a temporary file in the same folder, flushed and
`fsync`-ed, then renamed over the previous checkpoint with `os.replace`, so a run killed
mid-write leaves the previous checkpoint intact. Its layout is a magic line, an 8-byte
header length, a JSON header (format, step, fingerprint, leaf shapes, payload digest), then
the arrays written by `equinox.tree_serialise_leaves` as `.npy` records. Nothing is pickled:
loading reads plain arrays into a template built from the current run, never code.

With several processes (`samplers.distributed`), every process takes part in gathering the
sharded arrays, process 0 alone reads and writes the file, and what it reads is broadcast
to the others, so the folder need not be shared between hosts.

Example:
    >>> import tempfile, jax, jax.numpy as jnp, samplers
    >>> target = samplers.targets.IllConditionedGaussian(dim=2, condition_number=2.0)
    >>> folder = tempfile.mkdtemp()
    >>> args = (samplers.MALA(step_size=0.5), target, jnp.zeros((8, 2)))
    >>> first = samplers.run(*args, key=jax.random.key(0), num_steps=40, progress=False,
    ...                      checkpoint_dir=folder, checkpoint_every=20)
    >>> samplers.checkpoint.inspect(folder)["step"]
    40
    >>> again = samplers.run(*args, key=jax.random.key(0), num_steps=40, progress=False,
    ...                      checkpoint_dir=folder, resume=True)   # complete: nothing to run
    >>> bool((again.state.position == first.state.position).all())
    True
"""

import dataclasses
import hashlib
import io
import json
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, PRNGKeyArray

import ensemblenn as enn
from ensemblenn import _jax_private

__all__ = [
    "FILENAME",
    "PathLike",
    "CheckpointError",
    "CheckpointMismatchError",
    "Checkpointer",
    "Snapshot",
    "fingerprint",
    "inspect",
]

FILENAME = "checkpoint.enn"
PathLike = str | os.PathLike
_MAGIC = b"ENSEMBLENN-CHECKPOINT\n"
_FORMAT = 1

# Test hook: called with the temporary file's path when half the payload is written (a test
# sleeps here and SIGKILLs the process to check that the previous checkpoint survives).
_mid_write_hook: Callable[[Path], None] | None = None


class CheckpointError(enn.EnsembleError):
    """A checkpoint cannot be written or used: missing, unreadable, corrupt or unexpected.

    Example:
        >>> import jax, jax.numpy as jnp, samplers
        >>> try:   # resume=True, but no checkpoint_dir to resume from
        ...     samplers.run(samplers.MALA(step_size=0.5), lambda x: -0.5 * (x**2).sum(),
        ...                  jnp.zeros((8, 2)), key=jax.random.key(0), num_steps=10, resume=True)
        ... except samplers.CheckpointError as err:
        ...     print(str(err).splitlines()[0])
        resume and checkpoint_every need a checkpoint_dir.
    """


class CheckpointMismatchError(CheckpointError):
    """The checkpoint was written by a run with another configuration (sampler, target,
    shapes, key, step counts, ...), so resuming from it would not continue this run.

    Example:
        >>> import tempfile, jax, jax.numpy as jnp, samplers
        >>> folder = tempfile.mkdtemp()
        >>> args = (samplers.RandomWalk(0.5), lambda x: -0.5 * (x**2).sum(), jnp.zeros((8, 2)))
        >>> _ = samplers.run(*args, key=jax.random.key(0), num_steps=10, progress=False,
        ...                  checkpoint_dir=folder)
        >>> try:   # resuming with another number of steps
        ...     samplers.run(*args, key=jax.random.key(0), num_steps=20, progress=False,
        ...                  checkpoint_dir=folder, resume=True)
        ... except samplers.CheckpointMismatchError as err:
        ...     print(str(err).splitlines()[1])
          num_steps: 10 in the checkpoint, 20 in this run
    """


class Snapshot(NamedTuple):
    """What `samplers.run` saves, all of it as the run holds it between two chunks.

    Attributes:
        step: global steps done (warmup included); the next chunk starts here.
        sampler: the sampler the steps use (after adaptation).
        carry: the driver's per-chain carry: states, moments, acceptance and counters.
        adaptation_info: whatever the adaptation reported (None without adaptation).
        keys: the per-chain keys of the stepping phase.
        trace: the thinned draws so far, `(num_chains, num_draws, dim)`, or None.
        bias_history: the b² history so far, `(num_sampled, 2)`, or None.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from samplers.checkpoint import Snapshot
        >>> pieces = [jnp.zeros((4, 2, 3)), jnp.ones((4, 3, 3))]   # two chunks' draws
        >>> snap = Snapshot(step=50, sampler=None, carry=None, adaptation_info=None,
        ...                 keys=jax.random.split(jax.random.key(0), 4),
        ...                 trace=jnp.concatenate(pieces, axis=1), bias_history=None)
        >>> snap.trace.shape, len(snap.trace_list()), snap.bias_list()
        ((4, 5, 3), 1, [])
    """

    step: int
    sampler: Any
    carry: Any
    adaptation_info: Any
    keys: PRNGKeyArray
    trace: Any
    bias_history: Any

    @classmethod
    def of_run(
        cls,
        step: int,
        sampler: Any,
        carry: Any,
        adaptation_info: Any,
        keys: PRNGKeyArray,
        trace: list | None,
        bias_history: list | None,
    ) -> "Snapshot":
        """A snapshot from the driver's running values; `trace` and `bias_history` are the
        lists of per-chunk pieces it accumulates (None when it keeps none)."""
        position = carry.state.position
        if trace is not None:
            trace = (
                jnp.concatenate(trace, axis=1)
                if trace
                else jnp.zeros((position.shape[0], 0, position.shape[1]), position.dtype)
            )
        if bias_history is not None:
            bias_history = (
                jnp.concatenate(bias_history, axis=0)
                if bias_history
                else jnp.zeros((0, 2), jnp.float32)
            )
        return cls(step, sampler, carry, adaptation_info, keys, trace, bias_history)

    def trace_list(self) -> list:
        """The saved trace as the driver's list of pieces (empty if it has no draws)."""
        return [] if self.trace is None or self.trace.shape[1] == 0 else [self.trace]

    def bias_list(self) -> list:
        """The saved b² history as the driver's list of pieces."""
        return (
            []
            if self.bias_history is None or self.bias_history.shape[0] == 0
            else [self.bias_history]
        )


# --- the run's fingerprint ------------------------------------------------------------------


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
        for field in dataclasses.fields(x):
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
    block_size: int | str | None = "auto",
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


# --- host copies of (possibly multi-process) arrays ------------------------------------------


def _is_arrayish(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray | jax.ShapeDtypeStruct)


def _is_key(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _to_host(tree: Any) -> Any:
    """The array leaves of `tree` as numpy arrays holding the WHOLE array (typed keys as
    their key data); other leaves become None. With several processes this is collective:
    every process must call it."""
    tree = jax.tree.map(lambda x: x if _is_arrayish(x) else None, tree)
    tree = jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)
    from . import distributed

    return distributed.gather(tree)


def _host_like(template: Any) -> Any:
    """An empty numpy array shaped like each array leaf's host copy (typed keys as key
    data): what `eqx.tree_deserialise_leaves` fills in."""

    def like(x: Any) -> Any:
        if not _is_arrayish(x):
            return None
        if _is_key(x):
            x = jax.eval_shape(jax.random.key_data, x)
        return np.empty(x.shape, x.dtype)  # untouched pages: no memory until loaded

    return jax.tree.map(like, template)


def _weak(x: Array) -> Array:
    """`x` as a weakly typed array, as the run held it (weak types change promotion)."""
    try:
        return _jax_private.as_weakly_typed(x)
    except Exception:  # noqa: BLE001 - an API change costs only the weak type
        return x


def _from_host(host: Any, template: Any, key_impl: Any) -> Any:
    """Rebuild the run's values: host arrays into the template's array slots (as jax arrays,
    typed keys re-wrapped, weak types restored); the template's other leaves as they are."""

    def back(x: Any, t: Any) -> Any:
        if not _is_arrayish(t):
            return t
        if _is_key(t):
            return jax.random.wrap_key_data(x, impl=key_impl)
        x = jnp.asarray(x)
        return _weak(x) if getattr(t, "weak_type", False) else x

    return jax.tree.map(back, host, template, is_leaf=lambda x: x is None)


# --- the file --------------------------------------------------------------------------------


def _save_leaf(f: Any, x: Any) -> None:
    if isinstance(x, np.ndarray):
        np.save(f, x, allow_pickle=False)


def _load_leaf_into(path: Path) -> Callable[[Any, Any], Any]:
    def load(f: Any, like: Any) -> Any:
        if not isinstance(like, np.ndarray):
            return like
        try:
            x = np.load(f, allow_pickle=False)
        except Exception as err:  # noqa: BLE001 - any failure here is a corrupt file
            raise CheckpointError(f"Checkpoint {path} is corrupt: {err}") from None
        if x.shape != like.shape or x.dtype != like.dtype:
            raise CheckpointError(
                f"Checkpoint {path} holds a {x.dtype}{list(x.shape)} array where this run "
                f"has {like.dtype}{list(like.shape)}: it was written by another version of "
                "the sampler or driver.\n  fix: start afresh in a new checkpoint_dir."
            )
        return x

    return load


def _serialise(tree: Any) -> bytes:
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, tree, filter_spec=_save_leaf)
    return buffer.getvalue()


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows: directories cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_atomic(path: Path, header: bytes, payload: bytes) -> None:
    """Write `path` so that it is, at every instant, either the old file or the new one."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(f".{path.name}.tmp-*"):  # left by a killed writer
        stale.unlink(missing_ok=True)
    tmp = directory / f".{path.name}.tmp-{os.getpid()}"
    half = len(payload) // 2
    try:
        with open(tmp, "wb") as f:
            f.write(_MAGIC + struct.pack("<Q", len(header)) + header)
            f.write(payload[:half])
            if _mid_write_hook is not None:
                f.flush()
                _mid_write_hook(tmp)
            f.write(payload[half:])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(directory)


def _broadcast_bytes(blob: bytes | None) -> bytes | None:
    """Process 0's `blob` on every process (None stays None)."""
    from jax.experimental import multihost_utils

    size = -1 if blob is None else len(blob)
    size = int(multihost_utils.broadcast_one_to_all(np.int64(size)))
    if size < 0:
        return None
    words = (size + 3) // 4  # uint32 words: collectives handle them everywhere
    data = np.zeros(words * 4, np.uint8)
    if jax.process_index() == 0:
        data[:size] = np.frombuffer(blob, np.uint8)
    data = multihost_utils.broadcast_one_to_all(data.view(np.uint32))
    return np.asarray(data).view(np.uint8)[:size].tobytes()


def _read(path: Path) -> bytes | None:
    """The checkpoint's bytes on every process (process 0 reads them), or None if absent."""
    blob = None
    if jax.process_index() == 0 and path.is_file():
        blob = path.read_bytes()
    if jax.process_count() > 1:
        blob = _broadcast_bytes(blob)
    return blob


def _parse(blob: bytes, path: Path) -> tuple[dict[str, Any], bytes]:
    start = len(_MAGIC) + 8
    if not blob.startswith(_MAGIC) or len(blob) < start:
        raise CheckpointError(f"{path} is not a samplers checkpoint (or it is truncated).")
    (length,) = struct.unpack("<Q", blob[len(_MAGIC) : start])
    try:
        header = json.loads(blob[start : start + length].decode())
    except ValueError:
        raise CheckpointError(f"Checkpoint {path} has a corrupt header.") from None
    if header.get("format") != _FORMAT:
        raise CheckpointError(
            f"Checkpoint {path} has format {header.get('format')!r}; this version of "
            f"samplers reads format {_FORMAT}.\n  fix: start afresh in a new checkpoint_dir."
        )
    payload = blob[start + length :]
    if (
        len(payload) != header["payload_bytes"]
        or hashlib.sha256(payload).hexdigest() != header["payload_sha256"]
    ):
        raise CheckpointError(
            f"Checkpoint {path} is corrupt: its payload does not match the digest in its "
            "header (was the file truncated or modified?).\n  fix: restore it from a "
            "backup, or start afresh in a new checkpoint_dir."
        )
    return header, payload


def inspect(checkpoint_dir: str | os.PathLike) -> dict[str, Any]:
    """The header of the checkpoint in `checkpoint_dir`: `step`, `total_steps`, `fingerprint`,
    `saved_at` (Unix time) and the sizes of the trace and bias history so far.

    Raises:
        CheckpointError: there is no checkpoint there, or it is corrupt.

    Example:
        >>> import tempfile, samplers
        >>> try:
        ...     samplers.checkpoint.inspect(tempfile.mkdtemp())
        ... except samplers.CheckpointError as err:
        ...     print(type(err).__name__)
        CheckpointError
    """
    path = Path(checkpoint_dir) / FILENAME
    if not path.is_file():
        raise CheckpointError(f"No checkpoint in {checkpoint_dir} (no {FILENAME} there).")
    header, _ = _parse(path.read_bytes(), path)
    return header


def _check_fingerprint(saved: dict[str, Any], current: dict[str, Any], path: Path) -> None:
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


# --- the driver's side -----------------------------------------------------------------------


class Checkpointer:
    """Saves and restores one run's `Snapshot`s; `samplers.run` makes one per run.

    Args:
        directory: the checkpoint folder (created on the first save).
        every: save when the global step crosses a multiple of `every` (at the end of the
            chunk that crosses it), or after every chunk if None; always at the end.
        resume: continue from an existing checkpoint; if False an existing one is an error
            (rather than being silently overwritten).
        fingerprint: the run's `fingerprint(...)`.
        key_impl: the PRNG implementation of the run's typed keys (to re-wrap key data).
        mesh, axis: where the run's chains live (mesh None: as `ensemble_map` picks it);
            restored per-chain values are placed there.

    Example:
        >>> import tempfile, jax, jax.numpy as jnp, samplers
        >>> from samplers.checkpoint import Checkpointer, Snapshot
        >>> store = Checkpointer(tempfile.mkdtemp(), every=10, resume=False,
        ...                      fingerprint={"run": "demo"})
        >>> store.due(5, total=100), store.due(10, total=100), store.due(100, total=100)
        (False, True, True)
        >>> store.save(Snapshot(10, None, {"x": jnp.zeros((4, 2))}, None,
        ...                     jax.random.split(jax.random.key(0), 4), None, None), total=100)
        >>> samplers.checkpoint.inspect(store.path.parent)["step"], store.due(15, total=100)
        (10, False)
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        every: int | None,
        resume: bool,
        fingerprint: dict[str, Any],
        key_impl: Any = None,
        mesh: Any = None,
        axis: str = "chains",
    ):
        self.path = Path(directory) / FILENAME
        self.mesh = mesh
        self.axis = axis
        self.every = every
        self.resume = resume
        self.fingerprint = fingerprint
        self.key_impl = key_impl
        self.last_step: int | None = None

    def restore(
        self, prepare: Callable[[], tuple[Any, Any, Any]], keys: PRNGKeyArray
    ) -> Snapshot | None:
        """The saved snapshot, or None if there is none yet (a fresh start).

        `prepare` is the run's initialisation + adaptation, returning `(sampler, carry,
        adaptation_info)`; it is only traced (`eqx.filter_eval_shape`) for a template of
        shapes and static fields, never run.

        Raises:
            CheckpointError: a checkpoint exists but `resume` is False, or it is corrupt.
            CheckpointMismatchError: it was written by a run with another configuration.
        """
        blob = _read(self.path)
        if blob is None:
            return None
        if not self.resume:
            raise CheckpointError(
                f"{self.path} already holds a checkpoint, and resume=False would overwrite "
                "it.\n  fix: pass resume=True to continue that run (it also starts afresh "
                "when there is no checkpoint), or use another checkpoint_dir."
            )
        header, payload = _parse(blob, self.path)
        _check_fingerprint(header["fingerprint"], self.fingerprint, self.path)
        sampler, carry, info = eqx.filter_eval_shape(prepare)
        position = carry.state.position
        num_chains, dim = position.shape
        template = {
            "sampler": sampler,
            "carry": carry,
            "adaptation_info": info,
            "keys": keys,
            "trace": None
            if header["num_draws"] is None
            else jax.ShapeDtypeStruct((num_chains, header["num_draws"], dim), position.dtype),
            "bias_history": None
            if header["num_bias"] is None
            else jax.ShapeDtypeStruct((header["num_bias"], 2), jnp.float32),
        }
        like = _host_like(template)
        shapes = [[list(x.shape), str(x.dtype)] for x in jax.tree.leaves(like)]
        if shapes != header["leaves"]:
            raise CheckpointError(
                f"Checkpoint {self.path} holds {len(header['leaves'])} arrays that do not "
                f"match the {len(shapes)} this run has (another version of the sampler or "
                "driver wrote it).\n  fix: start afresh in a new checkpoint_dir."
            )
        host = eqx.tree_deserialise_leaves(
            io.BytesIO(payload), like, filter_spec=_load_leaf_into(self.path)
        )
        # The keys are re-derived from the run's key (and placed for this mesh); the saved
        # ones only confirm that the derivation has not changed since the save.
        if not np.array_equal(host["keys"], _to_host(keys)):
            raise CheckpointMismatchError(
                f"The per-chain keys saved in {self.path} differ from the ones this run "
                "derives from the same key (another version of ensemblenn wrote it), so the "
                "resumed chains would not continue the same random streams.\n  fix: start "
                "afresh in a new checkpoint_dir."
            )
        values = _from_host(host, template, self.key_impl)
        # Per-chain values laid out as a fresh run's are (on the mesh this run uses).
        from . import distributed

        sharding = NamedSharding(distributed._resolve_mesh(self.mesh, self.axis), P(self.axis))
        for name in ("carry", "trace"):
            values[name] = jax.tree.map(
                lambda x: (
                    distributed.place(x, sharding) if isinstance(x, jax.Array) and x.ndim else x
                ),
                values[name],
            )
        self.last_step = int(header["step"])
        return Snapshot(
            step=int(header["step"]),
            sampler=values["sampler"],
            carry=values["carry"],
            adaptation_info=values["adaptation_info"],
            keys=keys,
            trace=values["trace"],
            bias_history=values["bias_history"],
        )

    def due(self, step: int, total: int) -> bool:
        """Whether a chunk ending at `step` should be followed by a save."""
        if step >= total or self.every is None:
            return True
        last = self.last_step or 0
        return step // self.every > last // self.every

    def save(self, snapshot: Snapshot, total: int) -> None:
        """Write `snapshot` atomically (collective: every process must call it)."""
        tree = {
            "sampler": snapshot.sampler,
            "carry": snapshot.carry,
            "adaptation_info": snapshot.adaptation_info,
            "keys": snapshot.keys,
            "trace": snapshot.trace,
            "bias_history": snapshot.bias_history,
        }
        host = _to_host(tree)
        error: BaseException | None = None
        if jax.process_index() == 0:  # one writer; the others wait for its verdict below
            try:
                payload = _serialise(host)
                header = {
                    "format": _FORMAT,
                    "step": int(snapshot.step),
                    "total_steps": int(total),
                    "num_draws": (None if snapshot.trace is None else int(snapshot.trace.shape[1])),
                    "num_bias": (
                        None
                        if snapshot.bias_history is None
                        else int(snapshot.bias_history.shape[0])
                    ),
                    "fingerprint": self.fingerprint,
                    "leaves": [[list(x.shape), str(x.dtype)] for x in jax.tree.leaves(host)],
                    "payload_bytes": len(payload),
                    "payload_sha256": hashlib.sha256(payload).hexdigest(),
                    "saved_at": time.time(),
                    "jax_version": jax.__version__,
                }
                _write_atomic(self.path, json.dumps(header).encode(), payload)
            except Exception as err:  # noqa: BLE001 - reported to every process below
                error = err
        failed = error is not None
        if jax.process_count() > 1:  # a barrier that also tells everyone how the save went
            from jax.experimental import multihost_utils

            failed = bool(multihost_utils.broadcast_one_to_all(np.int32(failed)))
        if failed:
            raise CheckpointError(
                f"Could not write the checkpoint {self.path}: "
                f"{error if error is not None else 'the save failed on process 0'}"
            ) from error
        self.last_step = int(snapshot.step)


def open_run(
    checkpoint_dir: str | os.PathLike | None,
    checkpoint_every: int | None,
    resume: bool,
    *,
    traced: bool,
    key: PRNGKeyArray,
    mesh: Any = None,
    axis: str = "chains",
    **config: Any,
) -> Checkpointer | None:
    """The `Checkpointer` of a `samplers.run` call (None without `checkpoint_dir`), after
    checking the checkpoint arguments; `config` goes to `fingerprint`."""
    if checkpoint_dir is None:
        if resume or checkpoint_every is not None:
            raise CheckpointError(
                "resume and checkpoint_every need a checkpoint_dir.\n  fix: pass "
                "checkpoint_dir='path/to/folder'."
            )
        return None
    if not isinstance(checkpoint_dir, str | os.PathLike):
        raise CheckpointError(
            f"checkpoint_dir must be a path, got {type(checkpoint_dir).__name__}."
        )
    if checkpoint_every is not None and (
        isinstance(checkpoint_every, bool)
        or not isinstance(checkpoint_every, int | np.integer)
        or checkpoint_every < 1
    ):
        raise CheckpointError(
            f"checkpoint_every must be None or an int >= 1, got {checkpoint_every!r}."
        )
    if not isinstance(resume, bool):
        raise CheckpointError(f"resume must be True or False, got {resume!r}.")
    if traced:
        raise CheckpointError(
            "samplers.run cannot checkpoint inside jax.jit (or another transformation): "
            "saving needs concrete arrays.\n  fix: call samplers.run outside jax.jit "
            "when passing checkpoint_dir."
        )
    key_impl = (
        jax.random.key_impl(key)
        if _is_key(jnp.asarray(key) if not isinstance(key, jax.Array) else key)
        else None
    )
    return Checkpointer(
        checkpoint_dir,
        every=None if checkpoint_every is None else int(checkpoint_every),
        resume=resume,
        fingerprint=fingerprint(key=key, **config),
        key_impl=key_impl,
        mesh=mesh,
        axis=axis,
    )
