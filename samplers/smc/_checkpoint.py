"""Saving an SMC run between stages, and resuming it.

After every stage the host holds all a run needs to go on: the particles and their log
densities (`N` rows), the genealogy and evidence terms, the schedule so far and the step
size. They are written to one file, `DIR/smc.npz` (numpy arrays only: loading runs no
code), atomically: to a temporary file in the same folder, flushed and `fsync`-ed, then
renamed over the previous one, so a run killed mid-write leaves the previous stage's
file. The next stage's randomness is `fold_in(key, stage)`, so a resumed run continues
bitwise as the uninterrupted one would (on the same device count). One process only.
"""

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..checkpoint import CheckpointError, CheckpointMismatchError, check_dir

FILENAME = "smc.npz"


def fingerprint(smc: Any, structure: Any, functions: tuple, x: np.ndarray, key: Any) -> str:
    """What makes a run this run: the sampler's configuration, the particles' structure
    and values, the densities' names and the key."""
    data = (
        jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    )
    parts = [
        repr(smc),
        repr((structure.names, structure.shapes, str(structure.dtype))),
        repr([getattr(f, "__qualname__", type(f).__name__) for f in functions]),
        hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest(),
        np.asarray(data).tobytes().hex(),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def saved_stage(folder: Any) -> int | None:
    """The number of stages an SMC checkpoint in `folder` holds, or None (no folder, no
    checkpoint, or one that cannot be read: `SMC.run` says why when it loads it)."""
    path = Path(folder) / FILENAME if folder else None
    if path is None or not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            return int(saved["stage"]) + 1
    except Exception:  # noqa: BLE001 - unreadable: reported by SMC.run
        return None


class StageStore:
    """The run's file: `load()` what a previous run saved (or None), `save(state)` after
    each stage.

    Example:
        >>> import tempfile, numpy as np
        >>> from samplers.smc._checkpoint import StageStore
        >>> folder = tempfile.mkdtemp()
        >>> store = StageStore(folder, resume=True, fingerprint="abc")
        >>> store.load() is None
        True
        >>> store.save({"stage": np.int64(2), "x": np.zeros((4, 2))})
        >>> int(StageStore(folder, resume=True, fingerprint="abc").load()["stage"])
        2
    """

    def __init__(self, folder: Any, *, resume: bool, fingerprint: str = ""):
        check_dir(folder)
        self.path = Path(folder) / FILENAME
        self.fingerprint = fingerprint
        self.resume = resume
        if self.path.exists() and not resume:
            raise CheckpointError(
                f"SMC.run: {self.path} holds a checkpoint of an SMC run, and resume=False.\n"
                "  fix: resume=True to continue it, or another checkpoint_dir (or delete "
                "the file to start afresh)."
            )

    def load(self) -> dict[str, np.ndarray] | None:
        if not (self.resume and self.path.exists()):
            return None
        try:
            with np.load(self.path, allow_pickle=False) as saved:
                state = {k: saved[k] for k in saved.files}
        except (OSError, ValueError) as err:
            raise CheckpointError(
                f"SMC.run: cannot read the checkpoint {self.path}: {err}.\n  fix: delete "
                "it to start afresh."
            ) from None
        if str(state.pop("fingerprint", "")) != self.fingerprint:
            raise CheckpointMismatchError(
                f"SMC.run: the checkpoint {self.path} was written by a run with another "
                "configuration (sampler, densities, particles or key).\n  fix: the same "
                "arguments as the run that wrote it, or another checkpoint_dir."
            )
        return state

    def save(self, state: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {k: np.asarray(v) for k, v in state.items()}
        arrays["fingerprint"] = np.asarray(self.fingerprint)
        fd, tmp = tempfile.mkstemp(prefix=".smc-", suffix=".npz", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as file:
                np.savez(file, **arrays)
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
