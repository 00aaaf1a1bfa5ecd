"""One run per checkpoint folder: a lock file naming the process (PID and host) that holds it.

Two runs saving into one folder would overwrite each other's checkpoints, so a run takes the
lock when it opens the folder and gives it back when it finishes (or its process exits).
A lock left by a process that is gone is *stale*: on the same host a dead PID is taken over,
with a warning; a live PID, or a holder on another host (whose PIDs cannot be checked from
here), is a `CheckpointError` that says who holds it and what to do. Runs in one process
follow each other, so a lock this process holds is simply taken over.
"""

import json
import os
import socket
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

from ._errors import CheckpointError

LOCKNAME = "checkpoint.lock"


class RunLock:
    """The lock on one checkpoint folder, held by this process once `acquire`d.

    Example:
        >>> import tempfile
        >>> from samplers.checkpoint._lock import RunLock
        >>> folder = tempfile.mkdtemp()
        >>> lock = RunLock(folder)
        >>> lock.acquire()
        >>> lock.holder()["pid"] == __import__("os").getpid(), lock.held
        (True, True)
        >>> lock.release()
        >>> lock.holder() is None
        True
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.path = self.directory / LOCKNAME
        self.held = False
        self._finalizer: Any = None

    def holder(self) -> dict[str, Any] | None:
        """Who holds the lock (`pid`, `host`, `since`), or None if nobody does."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {"pid": None, "host": None, "since": None}  # unreadable: being written?
        return data if isinstance(data, dict) else {"pid": None, "host": None, "since": None}

    def acquire(self) -> None:
        """Take the lock (creating the folder), or raise if another live run holds it.

        Raises:
            CheckpointError: another process holds it, alive or on another host.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        mine = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        for attempt in range(20):
            if self._create(mine):
                return self._taken()
            holder = self.holder()
            if holder is None:
                continue  # released meanwhile: try again
            if holder.get("pid") is None:
                if attempt < 19:
                    time.sleep(0.05)  # another process is writing it right now
                    continue
                raise CheckpointError(
                    f"The checkpoint folder {self.directory} has an unreadable lock file "
                    f"{self.path}.\n  fix: if no other run uses this folder, delete that file."
                )
            if holder.get("host") != mine["host"]:
                raise CheckpointError(
                    self._busy(
                        holder,
                        "on another host, so whether it still runs cannot be checked from here",
                    )
                )
            if holder["pid"] != mine["pid"] and _alive(holder["pid"]):
                raise CheckpointError(self._busy(holder, "and that process is running"))
            if holder["pid"] != mine["pid"]:
                warnings.warn(
                    f"Taking over the checkpoint lock {self.path} from process "
                    f"{holder['pid']} on {holder['host']}, which is no longer running (it "
                    "stopped without finishing its run).",
                    stacklevel=4,
                )
            _write_replacing(self.path, mine)
            if (self.holder() or {}).get("pid") == mine["pid"]:
                return self._taken()
        raise CheckpointError(f"Could not take the checkpoint lock {self.path}.")

    def release(self) -> None:
        """Give the lock back, if this process still holds it (idempotent)."""
        if self._finalizer is not None:
            self._finalizer()
        self.held = False

    def _taken(self) -> None:
        self.held = True
        self._finalizer = weakref.finalize(self, _remove_if_mine, self.path, os.getpid())

    def _create(self, mine: dict[str, Any]) -> bool:
        """Create the lock file with our details in one step (False if it exists)."""
        tmp = self.directory / f".{LOCKNAME}.{os.getpid()}"
        tmp.write_text(json.dumps(mine))
        try:
            os.link(tmp, self.path)  # atomic, and never replaces an existing lock
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def _busy(self, holder: dict[str, Any], why: str) -> str:
        return (
            f"The checkpoint folder {self.directory} is in use by another run: process "
            f"{holder['pid']} on host {holder['host']} holds its lock ({self.path}), {why}. "
            "Two runs saving into one folder would overwrite each other's checkpoints.\n"
            "  fix: wait for that run to finish, or give this run another checkpoint_dir; if "
            f"that run is gone, delete {self.path}."
        )


def _alive(pid: Any) -> bool:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: it exists, as another user's process
        return True
    return True


def _write_replacing(path: Path, mine: dict[str, Any]) -> None:
    tmp = path.parent / f".{path.name}.{os.getpid()}"
    tmp.write_text(json.dumps(mine))
    os.replace(tmp, path)


def _remove_if_mine(path: Path, pid: int) -> None:
    try:
        if json.loads(path.read_text()).get("pid") == pid:
            path.unlink(missing_ok=True)
    except (OSError, ValueError, AttributeError):
        pass
