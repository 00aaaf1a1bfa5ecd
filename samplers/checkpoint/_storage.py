"""Bytes on disk: atomic writes, and reads that reach every process.

With several processes process 0 alone reads and writes the file, and what it reads is
broadcast to the others, so the folder need not be shared between hosts.
"""

import os
from pathlib import Path

import jax
import numpy as np


def fsync_dir(directory: Path) -> None:
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


def write_atomic(path: Path, blob: bytes) -> None:
    """Write `blob` to `path` so that it is, at every instant, either the old file or the
    new one: a temporary file in the same folder, flushed and `fsync`-ed, then renamed over
    `path` with `os.replace` (and the folder `fsync`-ed).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from samplers.checkpoint import _storage
        >>> path = Path(tempfile.mkdtemp()) / "f"
        >>> _storage.write_atomic(path, b"contents")
        >>> path.read_bytes()
        b'contents'
    """
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(f".{path.name}.tmp-*"):  # left by a killed writer
        stale.unlink(missing_ok=True)
    tmp = directory / f".{path.name}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # the one atomic step: until it, `path` is the old file
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(directory)


def broadcast_bytes(blob: bytes | None) -> bytes | None:
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


def read(path: Path) -> bytes | None:
    """The checkpoint's bytes on every process (process 0 reads them), or None if absent."""
    blob = None
    if jax.process_index() == 0 and path.is_file():
        blob = path.read_bytes()
    if jax.process_count() > 1:
        blob = broadcast_bytes(blob)
    return blob
