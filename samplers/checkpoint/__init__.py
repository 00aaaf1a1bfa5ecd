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
header length, a JSON header (format, step, fingerprint, leaf shapes, wall time), the
arrays written by `equinox.tree_serialise_leaves` as `.npy` records, and a SHA-256 digest of
all of it, header included, so that no flipped bit resumes a run wrongly. Nothing is
pickled: loading reads plain arrays into a template built from the current run, never code.

A run holds the folder's lock (`checkpoint.lock`: PID and host) from its start to its end,
so a second run on the same folder fails at once with a `CheckpointError` that names the
holder; a lock left by a process that died is taken over with a warning.

With several processes (`enn.distributed`), every process takes part in gathering the
sharded arrays, process 0 alone reads and writes the file, and what it reads is broadcast
to the others, so the folder need not be shared between hosts.

Example:
    >>> import tempfile, jax, jax.numpy as jnp, samplers
    >>> target = samplers.targets.IllConditionedGaussian(dim=2, condition_number=2.0)
    >>> folder = tempfile.mkdtemp()
    >>> args = (samplers.MALA(step_size=0.5), target, jnp.zeros((8, 2)))
    >>> first = samplers.run(*args, key=jax.random.key(0), num_steps=40, progress=False,
    ...                      checkpoint_dir=folder, checkpoint_every=20)
    >>> header = samplers.checkpoint.inspect(folder)
    >>> header["step"], header["wall_seconds"] > 0
    (40, True)
    >>> again = samplers.run(*args, key=jax.random.key(0), num_steps=40, progress=False,
    ...                      checkpoint_dir=folder, resume=True)   # complete: nothing to run
    >>> bool((again.state.position == first.state.position).all())
    True

The package is split by concern: `_errors`, `_fingerprint` (what a run is), `_snapshot`
(what it saves), `_host` (host copies of global arrays), `_format` (the file's bytes),
`_storage` (atomic writes, reads on every process), `_lock` (one run per folder) and
`_store` (the driver's `Checkpointer` and `open_run`).
"""

from ._errors import CheckpointError, CheckpointMismatchError
from ._fingerprint import fingerprint
from ._lock import LOCKNAME
from ._snapshot import Snapshot
from ._store import FILENAME, Checkpointer, PathLike, check_dir, inspect, open_run

__all__ = [
    "FILENAME",
    "LOCKNAME",
    "CheckpointError",
    "CheckpointMismatchError",
    "Checkpointer",
    "PathLike",
    "Snapshot",
    "check_dir",
    "fingerprint",
    "inspect",
]
