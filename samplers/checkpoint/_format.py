"""The checkpoint file's layout, and turning a tree of host arrays into it and back.

A file is: a magic line, the header's length (8 bytes, little-endian), the JSON header, the
payload (the arrays as `.npy` records written by `equinox.tree_serialise_leaves`), and the
SHA-256 of everything before it. The digest covers the header too: a flipped bit in the
saved step keeps valid JSON, and would otherwise resume the run at the wrong step. Nothing
is pickled: loading reads plain arrays into a template built from the current run.
"""

import hashlib
import io
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
import numpy as np

from ._errors import CheckpointError

MAGIC = b"ENSEMBLENN-CHECKPOINT\n"
FORMAT = 2  # 1: the digest covered the payload only
_DIGEST_BYTES = 32


def serialise(tree: Any) -> bytes:
    """The payload: the numpy leaves of `tree` as `.npy` records (other leaves: nothing)."""
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, tree, filter_spec=_save_leaf)
    return buffer.getvalue()


def deserialise(payload: bytes, like: Any, path: Path) -> Any:
    """The arrays of `payload` in the numpy slots of `like` (shapes and dtypes checked)."""
    return eqx.tree_deserialise_leaves(io.BytesIO(payload), like, filter_spec=_load_into(path))


def _save_leaf(f: Any, x: Any) -> None:
    if isinstance(x, np.ndarray):
        np.save(f, x, allow_pickle=False)


def _load_into(path: Path) -> Callable[[Any, Any], Any]:
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


def encode(header: dict[str, Any], payload: bytes) -> bytes:
    """The whole file for `header` (`format` and `payload_bytes` are filled in here).

    Example:
        >>> from pathlib import Path
        >>> from samplers.checkpoint import _format
        >>> blob = _format.encode({"step": 7}, b"arrays")
        >>> header, payload = _format.decode(blob, Path("demo"))
        >>> header["step"], payload
        (7, b'arrays')
    """
    text = json.dumps({**header, "format": FORMAT, "payload_bytes": len(payload)}).encode()
    body = MAGIC + struct.pack("<Q", len(text)) + text + payload
    return body + hashlib.sha256(body).digest()


def decode(blob: bytes, path: Path) -> tuple[dict[str, Any], bytes]:
    """The header and payload of a file's bytes, after checking its digest.

    Raises:
        CheckpointError: not a checkpoint, another format, or corrupt (header included).
    """
    start = len(MAGIC) + 8
    if not blob.startswith(MAGIC):
        raise CheckpointError(f"{path} is not a samplers checkpoint (or it is truncated).")
    body, digest = blob[:-_DIGEST_BYTES], blob[-_DIGEST_BYTES:]
    intact = len(blob) >= start + _DIGEST_BYTES and hashlib.sha256(body).digest() == digest
    header = _header(blob, start) if len(blob) >= start else None
    version = None if header is None else header.get("format")
    if version != FORMAT and (intact or isinstance(version, int)):
        # Another version's file (format 1 kept its digest elsewhere): say so, not "corrupt".
        raise CheckpointError(
            f"Checkpoint {path} has format {version!r}; this version of samplers reads "
            f"format {FORMAT}.\n  fix: start afresh in a new checkpoint_dir."
        )
    if not intact or header is None:
        raise CheckpointError(
            f"Checkpoint {path} is corrupt: its contents do not match the digest at its end "
            "(was the file truncated or modified?).\n  fix: restore it from a backup, or "
            "start afresh in a new checkpoint_dir."
        )
    (length,) = struct.unpack("<Q", blob[len(MAGIC) : start])
    payload = body[start + length :]
    if len(payload) != header.get("payload_bytes"):
        raise CheckpointError(f"Checkpoint {path} is corrupt: its payload has the wrong size.")
    return header, payload


def _header(blob: bytes, start: int) -> dict[str, Any] | None:
    (length,) = struct.unpack("<Q", blob[len(MAGIC) : start])
    try:
        header = json.loads(blob[start : start + length].decode())
    except ValueError:
        return None
    return header if isinstance(header, dict) else None
