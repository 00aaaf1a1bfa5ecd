"""The driver's side: one run's `Checkpointer` (restore, when to save, save) and `open_run`."""

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxtyping import PRNGKeyArray

import ensemblenn as enn

from . import _format, _storage
from ._errors import CheckpointError, CheckpointMismatchError
from ._fingerprint import check_fingerprint, fingerprint
from ._host import from_host, host_like, is_key, to_host
from ._lock import RunLock
from ._snapshot import Snapshot

FILENAME = "checkpoint.enn"
PathLike = str | os.PathLike


def inspect(checkpoint_dir: str | os.PathLike) -> dict[str, Any]:
    """The header of the checkpoint in `checkpoint_dir`: `step`, `total_steps`, `fingerprint`,
    `saved_at` (Unix time), `wall_seconds` (the run's wall time up to that save, across
    resumes) and the sizes of the trace and bias history so far. The whole file's digest is
    checked first.

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
    header, _ = _format.decode(path.read_bytes(), path)
    return header


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

    Making one takes the folder's lock (`checkpoint.lock`, with this process's PID and
    host): a second run on the same folder is a `CheckpointError` here, at its start. The
    lock is given back when the final step is saved (or found saved), by `close`, or when
    the process exits; one left by a process that died is taken over with a warning.

    Each save also records the run's wall time so far, `wall_seconds`, counted across
    resumes: a resumed run adds its own time to what the checkpoint had.

    Raises:
        CheckpointError: another run holds the folder's lock.

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
        >>> store.close()   # the lock is given back (a finished run does it itself)
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
        self.total_steps: int | None = None
        self.previous_seconds = 0.0  # wall time of the runs this one resumes
        self._started = time.perf_counter()
        self._lock = RunLock(self.path.parent)
        _collectively(self._lock.acquire, f"lock the checkpoint folder {self.path.parent}")

    def wall_seconds(self) -> float:
        """The run's wall time so far, across resumes (up to the last save of each run
        before this one, plus this one's time since it started)."""
        return self.previous_seconds + time.perf_counter() - self._started

    def close(self) -> None:
        """Give the folder's lock back (idempotent; the last save does it too)."""
        if jax.process_index() == 0:
            self._lock.release()

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
        try:
            snapshot = self._restore(prepare, keys)
        except BaseException:
            self.close()  # this run will not go on: another may use the folder
            raise
        if snapshot is not None and snapshot.step >= (self.total_steps or 0):
            self.close()  # complete: nothing more will be saved
        return snapshot

    def _restore(
        self, prepare: Callable[[], tuple[Any, Any, Any]], keys: PRNGKeyArray
    ) -> Snapshot | None:
        blob = _storage.read(self.path)
        if blob is None:
            return None
        if not self.resume:
            raise CheckpointError(
                f"{self.path} already holds a checkpoint, and resume=False would overwrite "
                "it.\n  fix: pass resume=True to continue that run (it also starts afresh "
                "when there is no checkpoint), or use another checkpoint_dir."
            )
        header, payload = _format.decode(blob, self.path)
        check_fingerprint(header["fingerprint"], self.fingerprint, self.path)
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
            else jax.ShapeDtypeStruct(
                # A row is the position and the driver's per-draw statistics.
                (num_chains, header["num_draws"], header.get("trace_width", dim)),
                position.dtype,
            ),
            "bias_history": None
            if header["num_bias"] is None
            else jax.ShapeDtypeStruct((header["num_bias"], 2), jnp.float32),
        }
        like = host_like(template)
        shapes = [[list(x.shape), str(x.dtype)] for x in jax.tree.leaves(like)]
        if shapes != header["leaves"]:
            raise CheckpointError(
                f"Checkpoint {self.path} holds {len(header['leaves'])} arrays that do not "
                f"match the {len(shapes)} this run has (another version of the sampler or "
                "driver wrote it).\n  fix: start afresh in a new checkpoint_dir."
            )
        host = _format.deserialise(payload, like, self.path)
        # The keys are re-derived from the run's key (and placed for this mesh); the saved
        # ones only confirm that the derivation has not changed since the save.
        if not np.array_equal(host["keys"], to_host(keys)):
            raise CheckpointMismatchError(
                f"The per-chain keys saved in {self.path} differ from the ones this run "
                "derives from the same key (another version of ensemblenn wrote it), so the "
                "resumed chains would not continue the same random streams.\n  fix: start "
                "afresh in a new checkpoint_dir."
            )
        values = from_host(host, template, self.key_impl)
        # Per-chain values laid out as a fresh run's are (on the mesh this run uses).
        sharding = NamedSharding(enn.resolve_mesh(self.mesh, self.axis), P(self.axis))
        for name in ("carry", "trace"):
            values[name] = jax.tree.map(
                lambda x: (
                    enn.distributed.place(x, sharding) if isinstance(x, jax.Array) and x.ndim else x
                ),
                values[name],
            )
        self.last_step = int(header["step"])
        self.total_steps = int(header["total_steps"])
        self.previous_seconds = float(header.get("wall_seconds", 0.0))
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
        host = to_host(tree)
        error: BaseException | None = None
        if jax.process_index() == 0:  # one writer; the others wait for its verdict below
            try:
                payload = _format.serialise(host)
                header = {
                    "step": int(snapshot.step),
                    "total_steps": int(total),
                    "num_draws": (None if snapshot.trace is None else int(snapshot.trace.shape[1])),
                    "trace_width": (
                        None if snapshot.trace is None else int(snapshot.trace.shape[2])
                    ),
                    "num_bias": (
                        None
                        if snapshot.bias_history is None
                        else int(snapshot.bias_history.shape[0])
                    ),
                    "fingerprint": self.fingerprint,
                    "leaves": [[list(x.shape), str(x.dtype)] for x in jax.tree.leaves(host)],
                    "wall_seconds": self.wall_seconds(),
                    "saved_at": time.time(),
                    "jax_version": jax.__version__,
                }
                _storage.write_atomic(self.path, _format.encode(header, payload))
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
        if snapshot.step >= total:
            self.close()  # the run is complete: the folder is free for the next one


def _collectively(action: Callable[[], None], what: str) -> None:
    """Run `action` on process 0 and raise its CheckpointError on every process."""
    error: CheckpointError | None = None
    if jax.process_index() == 0:
        try:
            action()
        except CheckpointError as err:
            error = err
    failed = error is not None
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        failed = bool(multihost_utils.broadcast_one_to_all(np.int32(failed)))
    if error is not None:
        raise error
    if failed:
        raise CheckpointError(f"Could not {what}: it failed on process 0 (see its error).")


def check_dir(checkpoint_dir: Any) -> None:
    """Raise `CheckpointError` unless `checkpoint_dir` is a folder, or a path where one can
    be made: its nearest existing part must be a folder. Only reads the file system.

    Example:
        >>> import tempfile, samplers
        >>> from samplers.checkpoint import check_dir
        >>> check_dir(tempfile.mkdtemp() + "/new/run")   # missing folders are made later
        >>> with tempfile.NamedTemporaryFile() as file:
        ...     try:
        ...         check_dir(file.name)
        ...     except samplers.CheckpointError as err:
        ...         print(type(err).__name__, "is a file, not a folder" in str(err))
        CheckpointError True
    """
    if checkpoint_dir is None:
        return
    if not isinstance(checkpoint_dir, str | os.PathLike):
        raise CheckpointError(
            f"checkpoint_dir must be a path, got {type(checkpoint_dir).__name__}."
        )
    # Without this the lock's mkdir fails with a raw FileExistsError (the path is a file)
    # or NotADirectoryError (a file above it), after the run's setup has compiled.
    path = Path(checkpoint_dir)
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if existing.is_dir():
        return
    what = "a file" if existing.is_file() or not existing.is_symlink() else "a broken link"
    if existing == path:
        raise CheckpointError(
            f"checkpoint_dir={str(checkpoint_dir)!r} is {what}, not a folder.\n  fix: pass "
            "the path of a folder (samplers.run creates it if missing), e.g. "
            f"checkpoint_dir={str(path.with_name(path.name + '_run'))!r}."
        )
    raise CheckpointError(
        f"checkpoint_dir={str(checkpoint_dir)!r} cannot be made: {str(existing)!r} is "
        f"{what}, not a folder.\n  fix: pass a path whose existing parts are folders "
        "(samplers.run creates the missing ones), or move that file away."
    )


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
    check_dir(checkpoint_dir)
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
        if is_key(jnp.asarray(key) if not isinstance(key, jax.Array) else key)
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
